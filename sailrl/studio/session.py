"""The studio's state: the spec file it edits, the run folders it reads, and caches of what the CLI computes.

One :class:`Studio` per server. Every answer comes from the code the command line runs:

- problems: ``sailrl.compiler.validate.problems`` (what ``sailrl validate`` reports, codes and words included);
- scores: ``sailrl.runtime.rewards.rules.RewardFunction`` (what ``sailrl rewards`` and training use; python rules run
  in its worker processes with their time limits);
- rows and prompts: ``sailrl.runtime.data.load_rows`` and ``sailrl.runtime.prompts.PromptBuilder`` with the
  model's tokenizer and renderer, and ``sailrl.preflight.build_report`` for preflight's findings;
- runs: ``sailrl.runtime.rundir.rollout_log`` and ``metrics.jsonl`` read as ``sailrl show`` / ``sailrl plot`` do.

Read: files of the spec's folder (:meth:`Studio.source` and the runs under it, confined), the ``--run`` folder,
and the data the spec text being edited names (``dataset.source``, wherever it points, as ``sailrl run`` would
read it: the session token is what keeps that to the user). Only the spec file (and its backup ``SPEC.bak`` next
to it) is written, by :meth:`Studio.save`: only a spec that validates, only when the file on disk
is still the one the page loaded (by sha256), written to a temporary file in the same folder, fsynced, then
``os.replace`` d over the spec after the previous file was copied to the backup.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tempfile
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sailrl.compiler.reward_checks import is_example_error
from sailrl.compiler.validate import problems as spec_problems
from sailrl.export import ExportError, RunInfo, export_run
from sailrl.export.sample import sample_run
from sailrl.runtime.backends.judge_clients import connect_judges, not_checked
from sailrl.runtime.data import DatasetError, load_rows
from sailrl.runtime.data.readers import is_local, resolve
from sailrl.runtime.planning.cost import estimate_run
from sailrl.runtime.prompts import PromptBuilder, PromptError
from sailrl.runtime.rewards.rules import MAX_COMPLETION_CHARS, RewardFunction
from sailrl.runtime.rundir.directory import GAMING_FILE, METRICS_FILE, SCHEMA_KEY, open_run_file
from sailrl.runtime.rundir.rollout_log import ROLLOUTS_FILE, logged_steps, read_rollouts
from sailrl.spec.codes import CODES
from sailrl.spec.errors import SpecError, SpecErrors, UserError
from sailrl.spec.loader import read_spec_file
from sailrl.spec.rewards import RewardSpec
from sailrl.spec.schema import PromptSpec, Spec
from sailrl.studio.methods import (
    METHOD_VIEWS,
    data_key_parts,
    method_outcome,
    method_row,
    override_problem,
    row_check,
    rules_note,
)
from sailrl.studio.proposals import agreement, labels_from, propose
from sailrl.studio.runner import RunError, Runner, check_overrides, outcome_words, progress
from sailrl.studio.security import PathRefused, confined
from sailrl.studio.words import STARTERS, page_hint, pattern_fields, rule_sentences

RUN_ALIAS = "@run"  # the --run folder, wherever it lies
MAX_ROWS_SHOWN = 200
MAX_FIELD_CHARS = 4000
METRICS_CHUNK_BYTES = 4 * 1024 * 1024  # the most of metrics.jsonl one answer reads
MAX_SOURCE_BYTES = 256 * 1024
_CACHE = 16


class StudioError(UserError):
    """A request the studio cannot answer; ``status`` is the HTTP status, ``str(exc)`` plain words."""

    code = "E212"

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _new_file_mode() -> int:
    """The permission bits ``open`` gives a new file under this process's umask (read by setting it and putting it
    back: call it before threads start, as :class:`Studio` does)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _durable_temp(folder: Path, name: str, data: bytes, mode: int) -> str:
    """``data`` written and synced to a fresh temporary file beside ``name`` in ``folder`` (for an ``os.replace``
    onto it), with permission bits ``mode`` (``mkstemp`` makes it 0600); its path. Nothing is left behind when
    the write fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def problem_json(e: SpecError) -> dict[str, Any]:
    """A problem as the page shows it: the CLI's headline, message, hint and code, and where it is."""
    code = CODES.get(e.code)
    return {"file": e.file, "line": e.line, "column": e.column, "key_path": e.key_path, "message": e.message,
            "hint": page_hint(e.hint), "code": e.code, "code_name": getattr(code, "name", None), "severity": e.severity,
            "headline": e.headline()}


def _cap(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + f"…[{len(value) - MAX_FIELD_CHARS:,} characters cut]"
    return value


class _LRU(OrderedDict):
    """A small least-recently-used cache. :meth:`get_or` computes a missing value outside ``lock``, so a slow one
    (a preflight report, a dataset, a tokenizer) never holds up the answers that are cached or quick."""

    def get_or(self, key: Any, make: Any, lock: Any) -> Any:
        with lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
        value = make()
        with lock:
            self[key] = value
            while len(self) > _CACHE:
                self.popitem(last=False)
        return value


def _run_file(run_dir: Path, name: str) -> Path | None:
    """``run_dir/name`` when it is a regular file inside ``run_dir`` (a symbolic link out of the run folder, or a
    FIFO that would block the read, counts as absent); None otherwise."""
    path = run_dir / name
    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None
    if not target.is_relative_to(run_dir.resolve()) or not target.is_file():
        return None
    return target


def read_metrics(path: Path, after: int = 0, file_id: str | None = None,
                 chunk: int | None = None) -> dict[str, Any]:
    """The whole lines of ``path`` (a ``metrics.jsonl``) from byte offset ``after`` on, at most ``chunk`` bytes of
    them (``chunk``, default :data:`METRICS_CHUNK_BYTES`): ``{"lines", "next", "file", "reset", "more", "skipped",
    "exists"}``.

    The page polls a followed run every 2 s with the ``next`` and ``file`` of its last answer, so each poll reads
    only what was appended since. ``file`` names the file (device and inode); when it is another file (the run was
    restarted with ``--overwrite``, or the file rotated), when the file is now shorter than ``after`` (truncated),
    or when ``after`` does not follow a line end, it is read again from the start and the answer says
    ``reset: true`` (the page then drops the lines it had). A line still being written (no newline yet) waits for
    the next poll; ``more`` says the chunk was full and more lines follow at ``next``. A line that does not parse
    (torn, hand-edited) is skipped and counted in ``skipped``, as ``sailrl plot`` skips it; a single line longer
    than ``chunk`` is skipped whole.
    """
    after = max(0, int(after))
    chunk = chunk or METRICS_CHUNK_BYTES
    f = open_run_file(path)  # a regular file only (a FIFO or device swapped in is a RunFileError, not a hang)
    if f is None:
        return {"lines": [], "next": 0, "file": None, "reset": False, "more": False, "exists": False}
    with f:
        st = os.fstat(f.fileno())
        here = f"{st.st_dev}:{st.st_ino}"
        reset = False
        if after > 0:
            if (file_id is not None and file_id != here) or after > st.st_size:
                reset = True
            else:
                f.seek(after - 1)
                reset = f.read(1) != b"\n"
        if reset:
            after = 0
        f.seek(after)
        raw = f.read(chunk)
        end = raw.rfind(b"\n")
        skipped = 0
        if end >= 0:
            body, nxt = raw[:end + 1], after + end + 1
        elif len(raw) == chunk:  # one line longer than a whole chunk: skip to its end (if it has one yet)
            body, nxt, pos = b"", after, after + len(raw)
            while True:
                part = f.read(chunk)
                if not part:
                    break
                cut = part.find(b"\n")
                if cut >= 0:
                    nxt, skipped = pos + cut + 1, 1
                    break
                pos += len(part)
        else:
            body, nxt = b"", after
    lines = []
    for ln in body.split(b"\n"):
        if not ln.strip():
            continue
        try:
            obj = json.loads(ln)
        except ValueError:
            skipped += 1
            continue
        if isinstance(obj, dict):
            lines.append({k: v for k, v in obj.items() if k != SCHEMA_KEY})
    return {"lines": lines, "next": nxt, "file": here, "reset": reset, "more": len(raw) == chunk and nxt > after,
            "skipped": skipped, "exists": True}


def _reference_field(tree: dict[str, Any]) -> str:
    """``prompt.reference_field`` of a spec that does not validate (its default when unreadable)."""
    prompt = tree.get("prompt")
    try:
        return PromptSpec.model_validate(prompt).reference_field if isinstance(prompt, dict) else "answer"
    except ValidationError:
        return "answer"


class Checked:
    """One spec text, validated: problems, the plain data, the spec (None when it has errors), the reward."""

    def __init__(self, text: str, spec_path: Path) -> None:
        self.text = text
        self.sha = _sha(text)
        loaded, found = spec_problems(text, spec_path.name, path=spec_path, sha256=self.sha)
        self.loaded = loaded
        reported = SpecErrors(found, text)  # validate's order (by line) and its cap on how many are listed
        self.problems = reported.errors
        self.omitted = reported.omitted
        self.errors = [e for e in found if not e.is_warning]
        self.spec = loaded.spec if not self.errors else None
        data = loaded.data if isinstance(loaded.data, dict) else {}
        reward = data.get("reward") if isinstance(data.get("reward"), dict) else {}
        self.rules = reward.get("rules") if isinstance(reward.get("rules"), list) else None
        self.examples = data.get("examples") if isinstance(data.get("examples"), list) else []
        self.reference_field = (self.spec.prompt.reference_field if self.spec is not None and self.spec.prompt
                                is not None else "answer")
        tree = loaded.tree if isinstance(loaded.tree, dict) else {}
        self.method = self.spec.method if self.spec is not None else tree.get("method", "rl")
        self.reward_fn, self.reward_problem = self._reward(loaded, spec_path.parent)
        # each rule's sentence (sailrl explain's words) and the words of every pattern, as the page shows them
        self.sentences = rule_sentences(self.rules, self.reference_field, spec_path.parent)
        self.pattern_words = pattern_fields(self.rules)
        # which problems are only examples whose expected scores no longer hold (S301..S305): they never block a
        # save on the page, which offers "use the new scores" (the file written still validates)
        self.only_examples = bool(self.errors) and all(is_example_error(e) for e in self.errors)
        self.not_checked: dict[str, str] = {}  # judge rules the studio does not call -> why (Studio._with_judges)

    def _reward(self, loaded: Any, spec_dir: Path) -> tuple[RewardFunction | None, str | None]:
        """The reward the rules make, also when other parts of the spec have errors (the try panel still works).
        A rule with a problem is left out (``broken``: its name and first problem, shown in its verdict's place),
        so the other rules are still tried."""
        self.broken: dict[int, tuple[str, str]] = {}
        if self.spec is not None:
            if self.spec.reward is None:  # a method that trains without rules (dpo; sft, distill may)
                return None, rules_note(self.spec.method)
            return RewardFunction.from_spec(self.spec.reward, self.reference_field, spec_dir), None
        tree = loaded.tree if isinstance(loaded.tree, dict) else {}
        self.reference_field = _reference_field(tree)
        if not isinstance(tree.get("reward"), dict):
            return None, rules_note(tree.get("method")) or "the spec has no reward: section yet"
        rules = tree["reward"].get("rules") if isinstance(tree["reward"].get("rules"), list) else []
        for e in self.errors:
            parts = e.key_path.split(".")
            if len(parts) >= 3 and parts[:2] == ["reward", "rules"] and parts[2].isdigit():
                i = int(parts[2])
                if i < len(rules) and i not in self.broken:
                    name = rules[i].get("name") if isinstance(rules[i], dict) else None
                    self.broken[i] = (str(name or f"rule {i + 1}"), e.message)
        keep = [r for i, r in enumerate(rules) if i not in self.broken]
        section = {k: v for k, v in tree["reward"].items() if k != "correct_rule" or
                   any(isinstance(r, dict) and r.get("name") == v for r in keep)}
        try:
            reward = RewardSpec.model_validate({**section, "rules": keep})
        except ValidationError:
            return None, "the reward rules have problems (shown at their fields); fix them to try completions"
        try:
            return RewardFunction.from_spec(reward, self.reference_field, spec_dir), None
        except Exception:  # noqa: BLE001 -- a rule validate refused that the engine cannot build: shown at its field
            return None, "the reward rules have problems (shown at their fields); fix them to try completions"

    def as_json(self) -> dict[str, Any]:
        return {"sha": self.sha, "valid": not self.errors, "problems": [problem_json(e) for e in self.problems],
                "omitted": self.omitted,
                "rules": self.rules, "examples": self.examples, "reward_problem": self.reward_problem,
                "rule_names": self.reward_fn.rule_names if self.reward_fn else [],
                "sentences": self.sentences, "pattern_words": self.pattern_words,
                "broken": {str(i): {"name": n, "problem": m} for i, (n, m) in self.broken.items()},
                "only_examples": self.only_examples, "method": self.method,
                "rules_note": rules_note(self.method) if self.rules is None else None,
                "complete": bool(self.loaded.complete)}


class _Listing:
    """A loaded dataset's rows for the page: ``every`` (row, which: train / eval / skipped, skip reason) in source
    order, made once per dataset; :meth:`texts`, each row's fields as lower-case JSON for the search box, made on
    the first search (the page searches as the user types)."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        out = [(r, "train", None) for r in rows.train] + [(r, "eval", None) for r in rows.eval]
        out += [({**s.row, "_index": s.index}, "skipped", s.reason) for s in rows.skipped]
        self.every: list[tuple[dict[str, Any], str, str | None]] = sorted(
            out, key=lambda t: (t[0].get("_index", 0), t[1]))
        self._texts: list[str] | None = None

    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [json.dumps({k: v for k, v in t[0].items() if k != "_index"}, ensure_ascii=False).lower()
                           for t in self.every]
        return self._texts


class Studio:
    """The state behind one ``sailrl studio`` server (thread-safe: handlers run in a thread pool)."""

    def __init__(self, spec_path: Path, run_dir: Path | None = None, *, judge: bool = False,
                 run_command: Any = None) -> None:
        self.spec_path = spec_path.resolve()
        self.runner = Runner(self.spec_path, run_command)  # runs started from the page (``run_command``: tests)
        # kind: judge rules: local judges are called (as `sailrl validate` does), the others only with --judge
        # (``judge``: they cost money and need keys); one client per judge model and one answer cache per studio,
        # so an edit of the spec does not reopen a judge or judge the same completion again
        self.judge_remote = judge
        self._judge_clients: dict[tuple[Any, ...], tuple[Any, str | None]] = {}
        self._judge_cache: Any = None
        self.spec_dir = self.spec_path.parent
        self.run_dir = run_dir.resolve() if run_dir is not None else None
        self._lock = threading.RLock()
        self._new_mode = _new_file_mode()
        self._checked: _LRU = _LRU()
        self._rows: _LRU = _LRU()
        self._tools: _LRU = _LRU()
        self._preflight: _LRU = _LRU()
        self._steps: _LRU = _LRU()

    # ------------------------------------------------------------------------------------------ the spec

    def disk(self) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """(text, sha256 of the bytes, problems reading it) of the spec file as it is on disk now."""
        try:
            text, digest = read_spec_file(self.spec_path)
        except SpecErrors as exc:
            return None, None, [problem_json(e) for e in exc.errors]
        return text, digest, []

    def check(self, text: str) -> Checked:
        if not isinstance(text, str):
            raise StudioError("text must be a string")
        return self._checked.get_or(_sha(text), lambda: self._with_judges(Checked(text, self.spec_path)),
                                    self._lock)

    def _with_judges(self, checked: Checked) -> Checked:
        """``checked`` with its judge rules connected (see ``__init__``) and ``checked.not_checked`` (judge rule ->
        why it is not called) filled in."""
        fn = checked.reward_fn
        if fn is None or not fn.judges:
            return checked
        with self._lock:
            for name, judge in fn.judges.items():
                if self._judge_cache is None:
                    self._judge_cache = judge.cache
                judge.cache = self._judge_cache
                c = judge.config
                if c.sampler != "local" and not self.judge_remote:
                    continue
                key = (c.sampler, c.model, c.renderer)
                if key not in self._judge_clients:
                    problems = connect_judges(fn, spec_dir=self.spec_dir, only={name})
                    self._judge_clients[key] = (judge.client, problems.get(name) or judge.unavailable)
                client, why = self._judge_clients[key]
                judge.connect(client)
                judge.unavailable = why
        checked.not_checked = not_checked(fn, {}, "`sailrl studio --judge`")
        return checked

    def load(self) -> dict[str, Any]:
        text, digest, read_problems = self.disk()
        if text is None:
            return {"path": self.spec_path.name, "text": "", "disk_sha": None, "read_problems": read_problems,
                    "check": None}
        return {"path": self.spec_path.name, "text": text, "disk_sha": digest, "read_problems": [],
                "check": self.check(text).as_json()}

    def save(self, text: str, base_sha: str | None) -> dict[str, Any]:
        """Write ``text`` over the spec when it validates and the file is still the one loaded (``base_sha``)."""
        try:
            return self._save(text, base_sha)
        except OSError as exc:  # a read-only folder, a full disk: nothing replaced (the temporary file is removed)
            raise StudioError(f"{self.spec_path.name} was not written: {exc.strerror or exc} "
                              f"({exc.filename or self.spec_dir}); the file on disk is unchanged", 507) from None

    def _save(self, text: str, base_sha: str | None) -> dict[str, Any]:
        with self._lock:
            _, current, _ = self.disk()
            if current != base_sha:
                raise StudioError(f"{self.spec_path.name} changed on disk since the page loaded it: nothing was "
                                  "written. Reload it (your edits are shown until you do) and make them again.", 409)
            checked = self.check(text)
            if checked.errors:
                raise StudioError(f"{self.spec_path.name} was not written: the spec has {len(checked.errors)} "
                                  "problem(s) (shown at their fields); fix them first", 422)
            data = text.encode("utf-8")
            backup = self.spec_path.with_name(self.spec_path.name + ".bak")
            try:  # a saved spec keeps its permissions (who else may read or edit it)
                mode = self.spec_path.stat().st_mode & 0o7777
            except OSError:
                mode = self._new_mode
            tmp = _durable_temp(self.spec_dir, self.spec_path.name, data, mode)
            try:
                if self.spec_path.exists() and not self.spec_path.is_file():  # a pipe or a device would block
                    raise StudioError(f"{self.spec_path.name} on disk is no longer a file (a pipe, a device or a "
                                      "folder): nothing was written; put the spec file back", 409)
                if not self.spec_path.exists():  # gone since the page loaded it empty: written anew, no backup
                    os.replace(tmp, self.spec_path)
                    return {"disk_sha": hashlib.sha256(data).hexdigest(), "backup": None}
                btmp = _durable_temp(self.spec_dir, backup.name, self.spec_path.read_bytes(), mode)
                try:
                    os.replace(btmp, backup)
                except BaseException:
                    Path(btmp).unlink(missing_ok=True)
                    raise
                os.replace(tmp, self.spec_path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            try:
                dfd = os.open(self.spec_dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError:
                pass
            return {"disk_sha": hashlib.sha256(data).hexdigest(), "backup": backup.name}

    def source(self, relative: str) -> dict[str, Any]:
        """A text file inside the spec's folder (a python rule's module), read-only."""
        try:
            path = confined(self.spec_dir, relative)
        except PathRefused as exc:
            raise StudioError(f"refused: {exc}", 403) from None
        if not path.is_file():
            raise StudioError(f"{relative}: no such file in the spec's folder", 404)
        with path.open("rb") as f:  # at most 256 KiB read, whatever the file's size
            raw = f.read(MAX_SOURCE_BYTES)
        return {"path": relative, "text": raw.decode("utf-8", "replace")}

    # ------------------------------------------------------------------------------------------ trying

    def score(self, text: str, completion: str, fields: dict[str, Any], truncated: bool = False,
              num_tokens: int | None = None) -> dict[str, Any]:
        """Every rule's verdict on one completion, as ``sailrl rewards`` prints it."""
        if not isinstance(completion, str):
            raise StudioError("completion must be a string")
        if len(completion) > MAX_COMPLETION_CHARS + 1:
            completion = completion[:MAX_COMPLETION_CHARS + 1]  # still over the cap: the rules say so
        checked = self.check(text)
        fn = checked.reward_fn
        if fn is None:
            return {"ok": False, "problem": checked.reward_problem, "sha": checked.sha}
        fields = {str(k): v for k, v in (fields or {}).items() if k != "_index"}
        score, traces = fn.trace(completion, fields, truncated=bool(truncated),
                                 num_tokens=int(num_tokens) if isinstance(num_tokens, int) else None)
        unchecked = checked.not_checked
        rules = []
        for t in traces:
            if t.name in unchecked:  # never shown as passed (nor as failed): its judge was not asked
                rules.append({"name": t.name, "passed": None, "score": None, "not_checked": True, "error": None,
                              "why": f"not checked (needs the judge: {unchecked[t.name]})"})
            else:
                rules.append({"name": t.name, "passed": t.passed, "score": t.contribution, "why": t.why,
                              "error": score.errors.get(t.name)})
        for i, (name, problem) in sorted(checked.broken.items()):  # a rule with a problem: its error, in its place
            rules.insert(min(i, len(rules)), {"name": name, "passed": None, "score": None, "broken": True,
                                              "error": problem, "why": f"not tried: this rule has a problem: {problem}"})
        names = ", ".join(f"'{n}'" for n in unchecked)
        broken = ", ".join(f"'{n}'" for n, _ in checked.broken.values())
        note = (f"total not known: judge rule {names} not checked" if unchecked else
                f"total of the other rules: {broken} not tried until its problem is fixed" if broken else None)
        return {"ok": True, "sha": checked.sha, "total": None if unchecked else score.total,
                "total_note": note,
                "correct": score.correct, "rules": rules,
                "reference": fn.reference_answer(fields), "reference_problem": fn.reference_problem(fields),
                "timeouts": score.timeouts}

    def examples(self, text: str) -> dict[str, Any]:
        """The spec's ``examples:`` scored by its rules: each with its expectations and pass / fail."""
        checked = self.check(text)
        fn = checked.reward_fn
        out = []
        for i, ex in enumerate(checked.examples):
            if not isinstance(ex, dict) or not isinstance(ex.get("completion"), str) or fn is None:
                out.append({"index": i, "example": ex, "passed": None,
                            "problem": checked.reward_problem or "this example is not a valid one (see problems)"})
                continue
            reads = set(ex.get("expect") or {}) | (set(fn.rule_names) if "expect_total" in ex else set())
            skipped = [n for n in checked.not_checked if n in reads]
            if skipped:  # listed as not checked, never as passed (as `sailrl validate` does, W112)
                out.append({"index": i, "example": ex, "passed": None, "problem": "not checked (needs the judge: "
                            + "; ".join(checked.not_checked[n] for n in skipped) + ")"})
                continue
            fields = ex.get("fields") if isinstance(ex.get("fields"), dict) else {}
            nt = ex.get("num_tokens")
            score = fn.score(ex["completion"], fields, truncated=bool(ex.get("truncated", False)),
                             num_tokens=nt if isinstance(nt, int) else None)
            misses = []
            total = ex.get("expect_total")
            if isinstance(total, (int, float)) and abs(float(total) - score.total) > 1e-9:
                misses.append(f"total: expected {total:g}, got {score.total:g}")
            for name, want in (ex.get("expect") or {}).items():
                got = score.contributions.get(name)
                if got is None:
                    misses.append(f"{name}: no such rule")
                elif isinstance(want, (int, float)) and abs(float(want) - got) > 1e-9:
                    misses.append(f"{name}: expected {want:g}, got {got:g} ({score.reasons.get(name, '')})")
            out.append({"index": i, "example": ex, "passed": not misses, "misses": misses, "total": score.total,
                        "contributions": score.contributions})
        return {"examples": out}

    def new_scores(self, text: str) -> dict[str, Any]:
        """The page's "use the new scores": every example with the scores its rules give it now, and what that
        changes, per example, in words (``old -> new``).

        An expectation for a rule the spec no longer has is dropped (an example left expecting nothing is dropped
        too), so a removed rule never blocks a save. A change that makes a reply the spec marks as failing pass (an
        expected total or rule score of 0 or less that would now be above 0: a guard, such as a gamed reply that
        must score 0) is flagged ``guard``: the page asks before it accepts one. Answer: ``{"examples"`` (the new
        list), ``"changes"`` (``{"index", "dropped", "words", "guard"}`` per changed example), ``"guards"`` (how
        many changes are guards)``}``.
        """
        checked = self.check(text)
        scored = self.examples(text)["examples"]
        names = set(checked.reward_fn.rule_names) if checked.reward_fn is not None else set()
        out: list[Any] = []
        changes: list[dict[str, Any]] = []
        for e in scored:
            ex = e["example"]
            if e["passed"] is not False or not isinstance(ex, dict):
                out.append(ex)
                continue
            ex = dict(ex)
            words: list[str] = []
            guard = False

            def change(what: str, old: Any, new: float) -> None:
                nonlocal guard
                is_guard = isinstance(old, (int, float)) and old <= 0 < new
                guard = guard or is_guard
                words.append(f"{what} {old:g} -> {new:g}" + (" (it was expected to fail: it would now pass)"
                                                               if is_guard else ""))

            expect = dict(ex.get("expect") or {}) if isinstance(ex.get("expect"), dict) else {}
            removed = [n for n in expect if n not in names]
            for name in list(expect):
                if name not in names:
                    del expect[name]
                    words.append(f"the expectation for '{name}' dropped (no rule has that name now)")
                elif isinstance(expect[name], (int, float)) and abs(expect[name] - e["contributions"][name]) > 1e-9:
                    change(f"'{name}'", expect[name], e["contributions"][name])
                    expect[name] = e["contributions"][name]
            if "expect" in ex:
                if expect:
                    ex["expect"] = expect
                else:
                    del ex["expect"]
            total = ex.get("expect_total")
            if isinstance(total, (int, float)) and "total" in e and abs(total - e["total"]) > 1e-9:
                change("total", total, e["total"])
                ex["expect_total"] = e["total"]
            dropped = "expect" not in ex and "expect_total" not in ex
            if dropped:
                words = ["the example dropped: it expected scores only for rules the spec no longer has ("
                         + ", ".join(f"'{n}'" for n in removed) + ")"]
            else:
                out.append(ex)
            changes.append({"index": e["index"], "dropped": dropped, "words": words, "guard": guard})
        return {"examples": out, "changes": changes, "guards": sum(1 for c in changes if c["guard"])}

    # ------------------------------------------------------------------------------------------ data

    def _spec_or_raise(self, text: str) -> Any:
        checked = self.check(text)
        if checked.spec is None:
            raise StudioError("the spec has problems (shown beside the YAML); the dataset is read once it validates",
                              422)
        return checked

    def _data_key(self, spec: Spec) -> str:
        parts = [*data_key_parts(spec), self._data_stamp(spec)]
        return json.dumps(parts, sort_keys=True, default=str)

    def _data_stamp(self, spec: Spec) -> Any:
        """What changes when the dataset's local file (or saved-dataset folder) is edited, replaced, removed or made:
        (inode, size, mtime) of the file, or of the folder and the files directly in it (at most 256); None for a
        hub dataset. Part of the rows' and preflight's cache keys, so an edited data file is read again."""
        source = spec.dataset.source
        if not is_local(source, self.spec_dir):
            return None
        path = resolve(source, self.spec_dir)

        def stamp(p: Path) -> list[Any]:
            st = p.stat()
            return [p.name, st.st_ino, st.st_size, st.st_mtime_ns]

        try:
            if not path.is_dir():
                return stamp(path)
            with os.scandir(path) as entries:
                inside = sorted(e.name for e in entries)[:256]
            return [stamp(path)] + [stamp(path / name) for name in inside]
        except OSError as exc:  # missing (the rows say so) or unreadable: read again once that changes
            return [type(exc).__name__, os.path.exists(path)]

    def _tools_for(self, spec: Spec) -> tuple[Any, Any, str | None]:
        # lazy: sailrl.preflight loads torch and transformers (seconds); the studio opens without them
        from sailrl.preflight import _load_text_tools  # the same tokenizer/renderer preflight uses

        key = (spec.model.name, spec.model.renderer)
        return self._tools.get_or(key, lambda: _load_text_tools(spec, self.spec_dir), self._lock)

    def rows(self, text: str) -> tuple[Checked, _Listing]:
        checked = self._spec_or_raise(text)
        spec = checked.spec
        key = self._data_key(spec)

        def make() -> Any:
            try:
                if spec.method in METHOD_VIEWS:  # rows skipped as the run skips them: no conversation, no pair
                    check = row_check(spec, PromptBuilder(spec.prompt, None) if spec.prompt is not None else None)
                    return _Listing(load_rows(spec, self.spec_dir, renderer_check=check))
                return _Listing(load_rows(spec, self.spec_dir, checked.reward_fn))
            except DatasetError as exc:
                return exc

        listing = self._rows.get_or(key, make, self._lock)
        if isinstance(listing, Exception):
            raise StudioError(f"the dataset cannot be read: {listing}", 422)
        return checked, listing

    def row_list(self, text: str, query: str = "", offset: int = 0, limit: int = 20) -> dict[str, Any]:
        checked, listing = self.rows(text)
        rows, every = listing.rows, listing.every
        q = (query or "").strip().lower()
        if q:
            every = [t for t, found in zip(every, listing.texts(), strict=True) if q in found]
        limit = max(1, min(int(limit), MAX_ROWS_SHOWN))
        offset = max(0, int(offset))
        page = every[offset:offset + limit]
        return {"total": len(every), "offset": offset, "columns": rows.columns, "source": rows.source,
                "rows": [{"index": r.get("_index"), "split": which, "skip_reason": reason,
                          "fields": {k: _cap(v) for k, v in r.items() if k != "_index"}}
                         for r, which, reason in page],
                "indices": [t[0].get("_index") for t in every][:10_000]}

    def row(self, text: str, index: int | None = None, pick_random: bool = False) -> dict[str, Any]:
        """One row with its rendered prompt (the runtime's sandboxed template), token length and reference."""
        checked, listing = self.rows(text)
        every = listing.every
        if not every:
            raise StudioError("the dataset has no rows", 404)
        if pick_random:
            chosen = random.choice(every)
        else:
            chosen = next((t for t in every if t[0].get("_index") == index), None)
            if chosen is None:
                have = [t[0].get("_index") for t in every]
                raise StudioError(f"row {index} is not among the selected rows (rows {min(have)}..{max(have)}; "
                                  "dataset.range / dataset.limit select them)", 404)
        row, which, reason = chosen
        spec = checked.spec
        tokenizer, renderer, tool_problem = self._tools_for(spec)
        out: dict[str, Any] = {"index": row.get("_index"), "split": which, "skip_reason": reason,
                               "fields": {k: _cap(v) for k, v in row.items() if k != "_index"},
                               "tool_problem": tool_problem}
        if spec.method in METHOD_VIEWS:  # a conversation (sft) or a chosen/rejected pair (dpo)
            out.update(method_row(spec, row, tokenizer, renderer))
            out["reference"] = None
            return out
        try:
            messages = PromptBuilder(spec.prompt, None).messages(row)
            out["messages"] = messages
            if renderer is not None:
                tokens = PromptBuilder(spec.prompt, renderer).model_input(row).to_ints()
                out["prompt"] = str(tokenizer.decode(list(tokens)))
                out["tokens"] = len(tokens)
            else:
                out["prompt"] = "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
                out["tokens"] = None
        except PromptError as exc:
            out["prompt_error"] = str(exc)
        fn = checked.reward_fn
        out["reference"] = fn.reference_answer(row) if fn is not None and reason is None else None
        return out

    def preflight(self, text: str) -> dict[str, Any]:
        """``sailrl preflight``'s report without sampling: data, prompts, tokens, reward and its findings."""
        from sailrl.preflight import PreflightError  # lazy: see _tools_for
        from sailrl.preflight_methods import report_for  # lazy: see _tools_for

        checked = self._spec_or_raise(text)

        def make() -> dict[str, Any]:
            try:
                report = report_for(checked.spec, self.spec_dir, sample=0, show=3,
                                    spec_path=self.spec_path.name, loaded=checked.loaded,
                                    spec_warnings=[e for e in checked.problems if e.is_warning])
            except PreflightError as exc:
                return {"problems": [{"severity": "error", "message": str(exc), "fix": None}], "verdict": str(exc)}
            out = json.loads(json.dumps(report, default=str))
            for problem in out.get("problems") or []:  # the page's words for the CLI's hints
                if isinstance(problem, dict):
                    problem.update({k: page_hint(problem.get(k)) for k in ("message", "fix") if k in problem})
            out["verdict"] = page_hint(out.get("verdict"))
            source = (out.get("data") or {}).get("source")
            if isinstance(source, str) and source.startswith(str(self.spec_dir) + os.sep):
                out["data"]["source"] = source[len(str(self.spec_dir)) + 1:]  # as the spec names it
            return out

        return self._preflight.get_or((checked.sha, json.dumps(self._data_stamp(checked.spec), default=str)), make,
                                      self._lock)

    # ------------------------------------------------------------------------------------------ runs

    def _run_path(self, run: str) -> Path:
        if run == RUN_ALIAS:
            if self.run_dir is None:
                raise StudioError("no --run folder was given", 404)
            return self.run_dir
        if self.run_dir is not None and run.startswith(RUN_ALIAS + "/"):
            base, rest = self.run_dir, run[len(RUN_ALIAS) + 1:]
        else:
            base, rest = self.spec_dir, run
        try:
            path = confined(base, rest)
        except PathRefused as exc:
            raise StudioError(f"refused: {exc}", 403) from None
        if not path.is_dir():
            raise StudioError(f"{run}: no such run folder", 404)
        return path

    def runs(self, text: str | None = None) -> dict[str, Any]:
        """Run folders to choose from: the ``--run`` folder, the spec's ``output.run_dir``, and ``runs/*``."""
        found: dict[str, dict[str, Any]] = {}

        def add(key: str, path: Path) -> None:
            if path.is_dir() and key not in found and ((path / METRICS_FILE).exists()
                                                       or (path / "rollouts.jsonl").exists()):
                found[key] = {"id": key, "name": path.name, "path": str(path)}

        if self.run_dir is not None:
            if self.run_dir.is_dir():
                found[RUN_ALIAS] = {"id": RUN_ALIAS, "name": self.run_dir.name, "path": str(self.run_dir)}
        candidates: list[str] = []
        if text is not None:
            checked = self.check(text)
            if checked.spec is not None:
                candidates.append(str(checked.spec.output.run_dir).replace("{name}", checked.spec.name))
        runs = self.spec_dir / "runs"
        if runs.is_dir() and not runs.is_symlink():
            candidates += [f"runs/{p.name}" for p in sorted(runs.iterdir())[:200]]
        for rel in candidates:
            try:
                path = confined(self.spec_dir, rel)
            except PathRefused:
                continue
            if self.run_dir is not None and path == self.run_dir:
                continue
            add(rel, path)
        return {"runs": list(found.values())}

    def metrics(self, run: str, after: int = 0, file_id: str | None = None) -> dict[str, Any]:
        """``metrics.jsonl`` lines from byte ``after`` on: see :func:`read_metrics`."""
        path = _run_file(self._run_path(run), METRICS_FILE)
        if path is None:
            return {"lines": [], "next": 0, "file": None, "reset": False, "more": False, "exists": False}
        return read_metrics(path, after, file_id)

    def steps(self, run: str) -> dict[str, Any]:
        path = self._run_path(run)
        log = _run_file(path, ROLLOUTS_FILE)
        if log is None:
            return {"train": [], "eval": []}
        try:
            st = log.stat()
        except OSError:
            return {"train": [], "eval": []}
        # the page asks every 2 s while a run is followed: the whole log is scanned again only once it changed
        key = (str(log), st.st_ino, st.st_size, st.st_mtime_ns)
        return self._steps.get_or(key, lambda: logged_steps(path), self._lock)

    def rollouts(self, run: str, step: int, kind: str = "train") -> dict[str, Any]:
        if kind not in ("train", "eval"):
            raise StudioError("kind must be train or eval")
        path = self._run_path(run)
        records = read_rollouts(path, step=step, kind=kind) if _run_file(path, ROLLOUTS_FILE) is not None else []
        return {"step": step, "kind": kind, "records": records}

    # ------------------------------------------------------------------------------------------ labels

    def labels(self, text: str, raw: Any) -> dict[str, Any]:
        """Per rule, which labelled replies it gets right; and rules that get them all right (proposals)."""
        try:
            labels = labels_from(raw)
        except ValueError as exc:
            raise StudioError(str(exc)) from None
        checked = self.check(text)
        fn = checked.reward_fn
        per_rule = agreement(fn, labels, set(checked.not_checked)) if fn is not None else {}
        rules = checked.rules or []
        names = [r.get("name") if isinstance(r, dict) else None for r in rules]
        wrong = {i: sum(1 for v in per_rule.get(n, []) if v is False) for i, n in enumerate(names) if n}
        for i in checked.broken:
            wrong[i] = len(labels)
        proposals = propose(rules, labels, checked.reference_field, self.spec_dir, wrong) if labels else []
        return {"rules": per_rule, "proposals": proposals, "labels": len(labels)}

    @staticmethod
    def starters() -> dict[str, Any]:
        return {"starters": STARTERS}

    # ------------------------------------------------------------------------------------------ runs from the page

    def _own_run_dir(self, checked: Checked) -> tuple[str, Path]:
        """(run id, folder) of the spec's ``output.run_dir``, which must lie inside the spec's folder."""
        rel = str(checked.spec.output.run_dir).replace("{name}", checked.spec.name)
        try:
            return rel, confined(self.spec_dir, rel)
        except PathRefused:
            raise StudioError(f"output.run_dir ({rel}) lies outside the spec's folder: the studio starts runs only "
                              "inside it; run this one with `sailrl run`", 403) from None

    def run_plan(self, text: str, raw_overrides: Any) -> dict[str, Any]:
        """What Start shows before it starts: preflight's verdict, the cost estimate, the folder, whether it can
        resume, and whether the page must save first (a run trains the spec file)."""
        try:
            overrides = check_overrides(raw_overrides)
        except RunError as exc:
            raise StudioError(str(exc), exc.status) from None
        checked = self._spec_or_raise(text)
        problem = override_problem(checked.spec, overrides)
        if problem is not None:
            raise StudioError(problem, 400)
        run_id, path = self._own_run_dir(checked)
        _, digest, _ = self.disk()
        report = self.preflight(text)
        spec = checked.spec
        for key, value in overrides.items():  # the estimate is for the values she chose (the spec's own otherwise)
            section, field = key.split(".")
            part = getattr(spec, section)
            kept = int(value) if isinstance(getattr(part, field), int) else value
            spec = spec.model_copy(update={section: part.model_copy(update={field: kept})})
        cost = [page_hint(line) for line in estimate_run(spec, None).render() if line is not None]
        if overrides:
            cost.append("with " + ", ".join(f"{k}={v:g}" for k, v in overrides.items()) + " (the estimate above is "
                        "for these values)")
        alive = self.runner.alive(path)
        return {"run": run_id, "path": str(path), "needs_save": digest != hashlib.sha256(text.encode()).hexdigest(),
                "verdict": report.get("verdict"), "problems": report.get("problems") or [], "cost": cost,
                "resumable": (path / METRICS_FILE).is_file(),
                "running": alive is not None or (not self.runner.ended_here(path) and self.runner.fresh(path)),
                "overrides": overrides}

    def run_start(self, text: str, mode: str, raw_overrides: Any) -> dict[str, Any]:
        try:
            overrides = check_overrides(raw_overrides)
        except RunError as exc:
            raise StudioError(str(exc), exc.status) from None
        checked = self._spec_or_raise(text)
        problem = override_problem(checked.spec, overrides)
        if problem is not None:
            raise StudioError(problem, 400)
        _, digest, _ = self.disk()
        if digest != hashlib.sha256(text.encode("utf-8")).hexdigest():
            raise StudioError("save the spec first: a run trains the spec file as saved", 409)
        run_id, path = self._own_run_dir(checked)
        try:
            started = self.runner.start(path, mode, overrides)
        except RunError as exc:
            raise StudioError(str(exc), exc.status) from None
        return {"run": run_id, **started}

    def run_stop(self, run: str) -> dict[str, Any]:
        try:
            return self.runner.stop(self._run_path(run))
        except RunError as exc:
            raise StudioError(str(exc), exc.status) from None

    def run_status(self, run: str) -> dict[str, Any]:
        """A run's progress, time left, outcome in words, gaming warnings and its log's tail."""
        path = self._run_path(run)
        f = _run_file(path, METRICS_FILE)
        since = self.runner.since(path, METRICS_FILE)  # a new run started here: none of the previous run's steps
        metrics = read_metrics(f, since)["lines"] if f is not None and since is not None else []
        config_file = _run_file(path, "config.json")
        total, correct_rule, rules, method = None, None, [], "rl"
        if config_file is not None and config_file.stat().st_size < 4 * 1024 * 1024:
            try:
                config = json.loads(config_file.read_text("utf-8"))
                spec = config.get("spec") or {}
                total = int((spec.get("training") or {}).get("steps") or 0) or None
                method = spec.get("method") or "rl"
                reward = spec.get("reward") or {}
                rules = [r for r in reward.get("rules") or [] if isinstance(r, dict)]
                correct_rule = reward.get("correct_rule") or next(
                    (r.get("name") for r in rules if r.get("kind") == "answer"), None)
            except (ValueError, TypeError, AttributeError):
                pass
        if self.runner.started_here(path) and self.runner.steps_asked(path) is not None:
            total = self.runner.steps_asked(path)  # the steps she chose (config.json may still be the last run's)
        alive = self.runner.alive(path) is not None
        # a run this studio started and that has exited is over, however recently it wrote metrics.jsonl
        running = alive or (not self.runner.ended_here(path) and self.runner.fresh(path))
        last = max((m["step"] for m in metrics if isinstance(m.get("step"), int)), default=None)
        prog = progress(metrics, total, running)
        ended = None if running or not self.runner.started_here(path) else self.runner.exit_code(path)
        gaming_since = self.runner.since(path, GAMING_FILE)
        gaming = self.runner.gaming(path, last, gaming_since) if gaming_since is not None else []
        return {"run": run, "running": running, "started_here": self.runner.started_here(path), "alive": alive,
                "exit_code": ended, "progress": prog,
                "outcome": outcome_words(metrics, correct_rule, rules) if method == "rl" else "; ".join(
                    w for w in (method_outcome(metrics, method), outcome_words(metrics, correct_rule, rules)) if w)
                or None,
                "gaming": gaming, "log": self.runner.log_tail(path)}

    # ------------------------------------------------------------------------------------------ take it away

    def sample(self, run: str, fields: Any, n: int = 4) -> dict[str, Any]:
        """The run's final model on a new question (``fields``: the row's fields as she types them; the prompt is
        the spec's template over them), ``n`` samples, each with every rule's verdict (``sailrl sample``)."""
        if not isinstance(fields, dict) or not fields:
            raise StudioError("fields (the question's fields, e.g. {question: '4+5'}) are needed")
        fields = {str(k): str(v)[:MAX_FIELD_CHARS] for k, v in fields.items()}
        path = self._run_path(run)
        try:
            info = RunInfo.read(path)
            ckpt = info.checkpoint("final")
            spec = info.spec()
            try:
                messages = PromptBuilder(spec.prompt, None).messages(fields)
            except PromptError as exc:
                raise StudioError(f"the prompt cannot be built from these fields: {exc}", 422) from None
            user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
            result = sample_run(info, ckpt, prompt=user, fields=fields, n=max(1, min(int(n), 16)))
        except ExportError as exc:
            raise StudioError(str(exc), 422) from None
        out = []
        for c in result.completions:
            out.append({"text": c.text, "truncated": c.truncated, "total": c.score.total,
                        "rules": [{"name": t.name, "passed": t.passed, "score": t.contribution, "why": t.why}
                                  for t in c.traces]})
        return {"checkpoint": ckpt.path, "prompt": user, "reference": result.reward_fn.reference_answer(fields),
                "samples": out}

    def export(self, run: str, fmt: str) -> dict[str, Any]:
        """``sailrl export`` of the run's final checkpoint into ``RUN_DIR/export/<fmt>-final`` (replacing an earlier
        export there), with its model card."""
        if fmt not in ("peft", "merged"):
            raise StudioError("format is peft or merged")
        path = self._run_path(run)
        try:
            done = export_run(path, "final", fmt, overwrite=True)
        except ExportError as exc:
            raise StudioError(str(exc), 422) from None
        files = sorted(p.relative_to(done.folder).as_posix() for p in done.folder.rglob("*") if p.is_file())
        return {"folder": str(done.folder), "name": done.folder.name, "files": files,
                "card": "README.md" if "README.md" in files else None}

    def export_zip(self, run: str, fmt: str) -> tuple[str, bytes]:
        """(file name, zip bytes) of the run's export folder ``RUN_DIR/export/<fmt>-final`` (made by
        :meth:`export`)."""
        if fmt not in ("peft", "merged"):
            raise StudioError("format is peft or merged")
        path = self._run_path(run)
        folder = path / "export" / f"{fmt}-final"
        if not folder.is_dir() or folder.is_symlink():
            raise StudioError("export the model first", 404)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted(folder.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    z.write(p, f"{path.name}-{fmt}/{p.relative_to(folder).as_posix()}")
        return f"{path.name}-{fmt}.zip", buf.getvalue()
