"""The rollout log: every logged rollout of a run as one JSON line in ``RUN_DIR/rollouts.jsonl``.

Train and eval rollouts share the file; ``kind`` tells them apart. One record per rollout (keys in this order)::

    step, kind, group, sample, step_records,    # where it sits: step, "train"/"eval", index in step / in group
    row,                                        # the dataset row's ``_index``
    sampler_step, staleness, sampler_path,      # the sampler checkpoint it came from; staleness = step - sampler_step
    total, advantage, truncated, num_tokens,    # reward, advantage (null for eval / not trained), cut at max_tokens
    degenerate,                                 # its group's totals are all equal (no gradient); null for eval
    rules,                                      # {rule: {"score": float|null, "passed": bool|null, "why": str}}
                                                # (+ "judge": the judge's answer, "judge_score": its <score> text)
    completion, reference, prompt               # the text the rules read, the row's reference, the decoded prompt
    episode                                     # only for episodes (environment:): {"end": why it ended,
                                                #   "turns": [{role, text, tool_calls?, name?, error?}]}

``step_records`` is how many records that step wrote for that kind. Text fields are capped (``PROMPT_CHARS``,
``COMPLETION_CHARS``, ``REFERENCE_CHARS``, ``WHY_CHARS``): the head and tail are kept around a marker
``…[N characters cut]…``. Floats that are NaN or infinite are written as null.

Crash safety: each step's records are written with one ``write`` and one ``fsync``. A kill mid-write leaves a
torn tail; the reader drops a step that has fewer than ``step_records`` complete lines, and the next
:meth:`RolloutLog.write_step` of a process first cuts a partial last line, so a torn step never merges with the
next. :meth:`RolloutLog.truncate` (for resume) atomically keeps only steps before the first re-run step, so the
log has each step once, like ``metrics.jsonl``. If a (step, kind) was nevertheless written twice, the reader keeps
the later copy.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from sailrl.runtime.rundir.directory import (
    ROLLOUTS_FILE,
    append_whole,
    not_regular_file,
    open_run_file,
    run_file_lines,
    stamped,
    too_large,
    unstamped,
)
from sailrl.runtime.rundir.writes import writing
from sailrl.runtime.sandbox.redact import redact

KINDS = ("train", "eval")
#: Most bytes of records the reader holds at once: one step's (``sailrl show``, the studio) or, with no step
#: named, every step's. A quickstart step's 128 records are about 75 KiB; the file itself is read a line at a time,
#: whatever its size.
MAX_HELD_BYTES = 256 * 2**20

PROMPT_CHARS = 4000
COMPLETION_CHARS = 8000
JUDGE_CHARS = 2000  # a judge rule's answer (rules.<rule>.judge)
REFERENCE_CHARS = 2000
WHY_CHARS = 500
PATH_CHARS = 1000
RULE_NAME_CHARS = 100
MAX_RULES = 64
# Tokens decoded from each end of a prompt: decoding a 100k-token prompt to keep 4,000 characters is waste.
_PROMPT_TOKENS_PER_END = 4 * PROMPT_CHARS

_PREFIX = re.compile(rb'\{"step": (-?\d+), "kind": "(train|eval)", "group": (\d+), "sample": (\d+), '
                     rb'"step_records": (\d+)[,}]')


def cap_text(text: str, limit: int, *, head_share: float = 0.5) -> str:
    """``text`` cut to at most about ``limit`` characters: head and tail kept around ``…[N characters cut]…``.

    ``head_share`` is the fraction of ``limit`` kept from the start (prompts keep more of the end, where the
    question is). Lone surrogates (undecodable bytes) become U+FFFD so the result always encodes as UTF-8.
    """
    if len(text) > limit:
        head = int(limit * head_share)
        tail = limit - head
        cut = len(text) - head - tail
        text = f"{text[:head]}…[{cut:,} characters cut]…{text[len(text) - tail:]}"
    return _SURROGATE.sub("\ufffd", text) if _has_surrogate(text) else text


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _float(value: Any) -> float | None:
    """A finite float, or None (NaN, infinity, not a number)."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def _passed(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return None if isinstance(value, float) and math.isnan(value) else bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "pass", "passed"):
            return True
        if low in ("0", "false", "no", "fail", "failed"):
            return False
    return None


def _json_value(value: Any, limit: int) -> Any:
    """A JSON-safe, bounded copy of a row value: numbers and booleans as they are, anything else as capped text."""
    if value is None or isinstance(value, bool) or isinstance(value, int) and abs(value) < 10**18:
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return cap_text(value, limit)
    try:
        text = json.dumps(value, ensure_ascii=False, default=_safe_str)
    except (TypeError, ValueError, RecursionError):
        text = _safe_str(value)
    return cap_text(text, limit)


def _safe_str(value: Any) -> str:
    """``str(value)``, or ``<type>`` when that fails (an int over Python's 4,300-digit limit, a broken __str__)."""
    try:
        return value if isinstance(value, str) else str(value)
    except Exception:
        return f"<{type(value).__name__}>"


def rule_verdicts(logs: dict[str, Any], metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{rule: {"score", "passed", "why"}}`` from one transition's ``logs`` and ``metrics``.

    Reads ``score/<rule>``, ``passed/<rule>`` and ``why/<rule>`` from ``logs`` (and, for a judge rule,
    ``judge/<rule>``, the judge's answer, and ``judge_score/<rule>``, the text of the ``<score>`` tag taken from it:
    the entry then has ``"judge"`` and ``"judge_score"`` too); a rule without ``score/<rule>``
    takes ``metrics["reward/<rule>"]``. When ``logs`` has none of these keys (environments that only report
    metrics), the rules are the ``reward/<rule>`` metrics, with ``passed`` null and ``why`` empty. At most
    ``MAX_RULES`` rules, names capped at ``RULE_NAME_CHARS``.
    """
    rules: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any] | None:
        name = cap_text(name, RULE_NAME_CHARS)
        if name not in rules:
            if len(rules) >= MAX_RULES:
                return None
            rules[name] = {"score": None, "passed": None, "why": ""}
        return rules[name]

    scored: set[str] = set()
    for key, value in logs.items():
        if not isinstance(key, str) or "/" not in key:
            continue
        field, name = key.split("/", 1)
        if field not in ("score", "passed", "why", "judge", "judge_score") or not name:
            continue
        e = entry(name)
        if e is None:
            continue
        if field == "score":
            e["score"] = _float(value)
            scored.add(name)
        elif field == "passed":
            e["passed"] = _passed(value)
        elif field == "judge":  # a judge rule: the judge's answer, and the text of the <score> tag read from it
            e["judge"] = cap_text(_safe_str(value), JUDGE_CHARS)
        elif field == "judge_score":
            e["judge_score"] = cap_text(_safe_str(value), WHY_CHARS)
        else:
            e["why"] = cap_text(_safe_str(value), WHY_CHARS)
    reward_metrics = {k.split("/", 1)[1]: v for k, v in metrics.items()
                      if isinstance(k, str) and k.startswith("reward/") and k != "reward/total"}
    if not rules:
        for name, value in reward_metrics.items():
            e = entry(name)
            if e is not None:
                e["score"] = _float(value)
    else:
        for name, e in rules.items():
            if name not in scored and name in reward_metrics:
                e["score"] = _float(reward_metrics[name])
    return rules


def decode_prompt(model_input: Any, tokenizer: Any) -> str:
    """The text of a ``tinker.ModelInput`` (non-text chunks shown as ``[image]``), capped at ``PROMPT_CHARS``.

    Of a very long prompt only ``_PROMPT_TOKENS_PER_END`` tokens from each end are decoded. A tokenizer that
    fails gives ``[prompt not decodable: <error>]`` instead of raising.
    """
    parts: list[str] = []
    try:
        for chunk in getattr(model_input, "chunks", []):
            tokens = getattr(chunk, "tokens", None)
            if tokens is None:
                parts.append(f"[{getattr(chunk, 'type', 'image')}]")
                continue
            tokens = list(tokens)
            n = _PROMPT_TOKENS_PER_END
            if len(tokens) > 2 * n:
                parts.append(tokenizer.decode(tokens[:n]))
                parts.append(f"…[{len(tokens) - 2 * n:,} tokens not decoded]…")
                parts.append(tokenizer.decode(tokens[-n:]))
            else:
                parts.append(tokenizer.decode(tokens))
    except Exception as exc:  # a log line must never stop a run
        return cap_text(f"[prompt not decodable: {type(exc).__name__}: {exc}]", WHY_CHARS)
    return cap_text("".join(parts), PROMPT_CHARS, head_share=0.25)


def _completion(transition: Any, tokenizer: Any) -> str:
    text = (transition.logs or {}).get("completion")
    if text is None:
        try:
            text = tokenizer.decode(list(transition.ac.tokens))
        except Exception as exc:  # a log line must never stop a run
            text = f"[completion not decodable: {type(exc).__name__}: {exc}]"
    return cap_text(_safe_str(text), COMPLETION_CHARS)


#: Most turns of one episode kept in the log, and the longest text of each.
EPISODE_TURNS = 64
TURN_CHARS = 2000


def episode_record(logs: dict[str, Any]) -> dict[str, Any]:
    """``{"end", "turns"}`` of an episode from its final transition's logs (``episode``: the turns as JSON, from
    :class:`sailrl.runtime.rollouts.episode.EpisodeMessageEnv`), each text capped; a log that does not parse is kept as
    one note."""
    try:
        turns = json.loads(str(logs.get("episode") or "[]"))
        if not isinstance(turns, list):
            raise ValueError("not a list")
    except ValueError as exc:
        turns = [{"role": "note", "text": f"[episode not readable: {exc}]"}]
    kept: list[dict[str, Any]] = []
    for t in turns[:EPISODE_TURNS]:
        if not isinstance(t, dict):
            continue
        item = {"role": _safe_str(t.get("role", "")), "text": cap_text(_safe_str(t.get("text", "")), TURN_CHARS)}
        if isinstance(t.get("tool_calls"), list):
            item["tool_calls"] = [{"name": cap_text(_safe_str(c.get("name", "")), RULE_NAME_CHARS),
                                   "arguments": cap_text(_safe_str(c.get("arguments", "")), WHY_CHARS)}
                                  for c in t["tool_calls"][:16] if isinstance(c, dict)]
        if t.get("role") == "tool":
            item["name"] = cap_text(_safe_str(t.get("name", "")), RULE_NAME_CHARS)
            item["error"] = bool(t.get("error"))
        kept.append(item)
    return {"end": _safe_str(logs.get("episode_end", "")), "turns": kept}


def _per_group(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, (str, int)) or value is None:
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"RolloutLog.write_step: {name} has {len(value)} entries for {n} groups")
    return value


class RolloutLog:
    """Writes a run's rollouts to ``run_dir/rollouts.jsonl`` (see the module docstring for the record).

    ``limit`` is ``output.log_rollouts``: ``"all"``, the first N groups of each step (train and eval each), or 0
    (nothing is written, no file is created). ``reference_field`` is the row field holding the reference answer
    (``None``: records carry ``reference: null``). Raises ``ValueError`` for a limit that is not "all" or >= 0.
    """

    def __init__(self, run_dir: str | Path, limit: Literal["all"] | int = "all", *,
                 reference_field: str | None = None) -> None:
        if not (limit == "all" or isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0):
            raise ValueError(f"log_rollouts is 'all', 0 (none) or a number of groups per step >= 1; got {limit!r}")
        self.path = Path(run_dir) / ROLLOUTS_FILE
        self.limit = limit
        self.reference_field = reference_field
        self._tail_checked = False

    @property
    def enabled(self) -> bool:
        return self.limit != 0

    def records(self, step: int, kind: str, groups: Sequence[Any], rows: Sequence[dict[str, Any]],
                advantages: Sequence[Any] | None, *, sampler_paths: str | Sequence[str],
                sampler_steps: int | Sequence[int], tokenizer: Any,
                degenerate: Sequence[bool] | None = None) -> list[dict[str, Any]]:
        """The records :meth:`write_step` would write (same arguments), without writing them."""
        if kind not in KINDS:
            raise ValueError(f"RolloutLog: kind is 'train' or 'eval'; got {kind!r}")
        n = len(groups)
        if len(rows) != n:
            raise ValueError(f"RolloutLog.write_step: {len(rows)} rows for {n} groups")
        paths = _per_group(sampler_paths, n, "sampler_paths")
        steps = _per_group(sampler_steps, n, "sampler_steps")
        advs = _per_group(advantages, n, "advantages")
        degen = None if degenerate is None else _per_group(degenerate, n, "degenerate")
        keep = n if self.limit == "all" else min(n, int(self.limit))
        out: list[dict[str, Any]] = []
        for g in range(keep):
            group, row = groups[g], rows[g] or {}
            trajectories = list(group.trajectories_G)
            totals = [_float(t) for t in group.get_total_rewards()]
            adv = advs[g]
            if adv is not None and hasattr(adv, "tolist"):
                adv = adv.tolist()
            if adv is not None and not isinstance(adv, (list, tuple)):  # one number for the whole group
                adv = [adv] * len(trajectories)
            if degen is not None:
                is_degenerate: bool | None = bool(degen[g])
            else:  # eval rollouts train nothing: "degenerate" does not apply to them
                is_degenerate = None if kind == "eval" else bool(totals) and len(set(totals)) == 1
            first = next((t.transitions[0] for t in trajectories if t.transitions), None)
            prompt = decode_prompt(first.ob, tokenizer) if first is not None else ""
            reference = (_json_value(row.get(self.reference_field), REFERENCE_CHARS)
                         if self.reference_field else None)
            sampler_step = int(steps[g]) if steps[g] is not None else None
            for i, traj in enumerate(trajectories):
                transitions = list(traj.transitions)
                last = transitions[-1] if transitions else None
                logs = dict(last.logs or {}) if last is not None else {}
                metrics = dict(last.metrics or {}) if last is not None else {}
                truncated = any(getattr(t.ac, "stop_reason", None) == "length" for t in transitions) or (
                    (_float(metrics.get("truncated")) or 0.0) >= 0.5)
                out.append({
                    "step": int(step),
                    "kind": kind,
                    "group": g,
                    "sample": i,
                    "step_records": 0,  # filled in below
                    "row": _json_value(row.get("_index"), 100),
                    "sampler_step": sampler_step,
                    "staleness": None if sampler_step is None else int(step) - sampler_step,
                    "sampler_path": None if paths[g] is None else cap_text(_safe_str(paths[g]), PATH_CHARS),
                    "total": totals[i] if i < len(totals) else None,
                    "advantage": _float(adv[i]) if adv is not None and i < len(adv) else None,
                    "truncated": bool(truncated),
                    "num_tokens": sum(len(t.ac.tokens) for t in transitions),
                    "degenerate": is_degenerate,
                    "rules": rule_verdicts(logs, metrics),
                    "completion": _completion(last, tokenizer) if last is not None else "",
                    "reference": reference,
                    "prompt": prompt,
                })
                if "episode" in logs:
                    out[-1]["episode"] = episode_record(logs)
        for r in out:
            r["step_records"] = len(out)
        return out

    def write_step(self, step: int, kind: Literal["train", "eval"], groups: Sequence[Any],
                   rows: Sequence[dict[str, Any]], advantages: Sequence[Any] | None, *,
                   sampler_paths: str | Sequence[str], sampler_steps: int | Sequence[int], tokenizer: Any,
                   degenerate: Sequence[bool] | None = None) -> int:
        """Append one step's rollouts (one line each) in one write, then fsync. Returns the records written.

        ``groups``: tinker_cookbook ``TrajectoryGroup``s; ``rows``: their dataset rows (same order);
        ``advantages``: per group a 1-D tensor / list of floats, or None (eval; a group that was not trained),
        or None for all; ``sampler_paths`` / ``sampler_steps``: per group the sampler checkpoint and the policy
        step that saved it (one value is used for every group); ``tokenizer``: decodes prompts (``.decode``);
        ``degenerate``: per group, or None to mark train groups whose totals are all equal (eval records get
        null). Raises ``ValueError`` when a per-group list has the wrong length; ``OSError`` from the file system.
        """
        if not self.enabled:
            return 0
        records = self.records(step, kind, groups, rows, advantages, sampler_paths=sampler_paths,
                               sampler_steps=sampler_steps, tokenizer=tokenizer, degenerate=degenerate)
        if not records:
            return 0
        text = "".join(json.dumps(stamped(ROLLOUTS_FILE, r), ensure_ascii=False, allow_nan=False) + "\n"
                       for r in records)
        data = redact(text).encode("utf-8")  # a key a tool or rule printed never reaches the file
        if not self._tail_checked:
            _cut_partial_line(self.path)
            self._tail_checked = True
        with writing(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        append_whole(self.path, data)  # the step's lines whole or none: a full disk leaves no torn step
        return len(records)

    def truncate(self, first_step_to_rerun: int) -> None:
        """Keep only complete steps before ``first_step_to_rerun`` (atomic rewrite; for resume). No file: no-op."""
        if not self.path.exists() and not self.path.is_symlink():
            return
        tmp = self.path.with_name(ROLLOUTS_FILE + ".tmp")
        try:
            with open(tmp, "wb") as out:
                for step, _kind, lines in _complete_batches(self.path, lambda s, k: s < first_step_to_rerun):
                    if step < first_step_to_rerun:
                        out.writelines(lines)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:  # a log that is not a regular file: nothing is left behind
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.path)
        self._tail_checked = True
        _fsync_dir(self.path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _cut_partial_line(path: Path) -> None:
    """Drop bytes after the last newline (a line a killed writer left half written). A log that is not a regular
    file (a FIFO would block the write) is a :class:`~sailrl.runtime.rundir.directory.RunFileError`."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise not_regular_file(path, st.st_mode)
    size = st.st_size
    if size == 0:
        return
    with open(path, "r+b") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        while pos > 0:
            start = max(0, pos - 65536)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(start + nl + 1)
                break
            pos = start
        else:
            f.truncate(0)
        f.flush()
        os.fsync(f.fileno())


def _key(line: bytes) -> tuple[int, str, int, int, int] | None:
    """(step, kind, group, sample, step_records) of a complete record line, or None for a torn / foreign line."""
    if not line.endswith(b"}\n"):
        return None
    m = _PREFIX.match(line)
    if m is not None:  # the writer's own key order: no need to parse the whole line to place it
        return int(m[1]), m[2].decode(), int(m[3]), int(m[4]), int(m[5])
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    fields = [obj.get(k) for k in ("step", "group", "sample", "step_records")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in fields) or obj.get("kind") not in KINDS:
        return None
    return fields[0], obj["kind"], fields[1], fields[2], fields[3]


def _complete_batches(path: Path, keep: Callable[[int, str], bool] | None = None
                      ) -> Iterator[tuple[int, str, list[bytes]]]:
    """(step, kind, raw lines) of every complete write in file order (a torn or interleaved write is dropped).

    A write is a run of lines with one (step, kind) whose (group, sample) increase; it is complete when it has
    ``step_records`` lines. The file is read a line at a time (``runtime.rundir.run_file_lines``: a line longer
    than ``MAX_LINE_BYTES`` counts as torn), and only the lines of writes ``keep(step, kind)`` accepts (default:
    every write) are held, at most :data:`MAX_HELD_BYTES` of one write; the other writes come with no lines. A
    missing file has no writes; one that is not a regular file is a ``RunFileError``.
    """
    f = open_run_file(path)
    if f is None:
        return
    batch: list[bytes] = []
    count = held = 0
    keeping = False
    current: tuple[int, str, int, int, int] | None = None

    def flush():
        if current is not None and count == current[4]:
            return current[0], current[1], batch
        return None

    with f:
        for line in run_file_lines(f):
            key = None if line is None else _key(line)
            if key is None:
                continue
            if (current is None or key[:2] != current[:2] or key[2:4] <= current[2:4] or key[4] != current[4]
                    or count >= current[4]):
                done = flush()
                if done is not None:
                    yield done
                batch, count, held = [], 0, 0
                keeping = keep is None or keep(key[0], key[1])
            count += 1
            if keeping:
                held += len(line)
                if held > MAX_HELD_BYTES:
                    raise too_large(path, held, MAX_HELD_BYTES)
                batch.append(line)
            current = key
    done = flush()
    if done is not None:
        yield done


def _selected(run_dir: str | Path, step: int | None, kind: str | None) -> dict[tuple[int, str], list[bytes]]:
    path = Path(run_dir) / ROLLOUTS_FILE
    chosen: dict[tuple[int, str], list[bytes]] = {}
    held: dict[tuple[int, str], int] = {}

    def wanted(s: int, k: str) -> bool:
        return (step is None or s == step) and (kind is None or k == kind)

    for s, k, lines in _complete_batches(path, wanted):
        chosen.pop((s, k), None)  # a later copy of the same step wins and moves to the end
        chosen[(s, k)] = lines
        held[(s, k)] = sum(map(len, lines))
        if sum(held.values()) > MAX_HELD_BYTES:  # every step at once: name one
            raise too_large(path, sum(held.values()), MAX_HELD_BYTES)
    return chosen


def read_rollouts(run_dir: str | Path, step: int | None = None, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of ``run_dir/rollouts.jsonl``, complete steps only, optionally of one ``step`` and/or ``kind``.

    Returns ``[]`` when the file does not exist. Records come in file order; torn steps are left out. A log that is
    not a regular file, or records past :data:`MAX_HELD_BYTES`, are a ``RunFileError``.
    """
    out: list[dict[str, Any]] = []
    for lines in _selected(run_dir, step, kind).values():
        try:
            records = [unstamped(Path(run_dir) / ROLLOUTS_FILE, json.loads(line)) for line in lines]
        except (ValueError, RecursionError):  # a line spliced from a torn write: the step is not whole
            continue
        out.extend(records)
    return out


def logged_steps(run_dir: str | Path) -> dict[str, list[int]]:
    """``{"train": [steps...], "eval": [steps...]}``: the complete steps in the log, sorted (no record is held)."""
    found: dict[str, set[int]] = {k: set() for k in KINDS}
    for s, k, _ in _complete_batches(Path(run_dir) / ROLLOUTS_FILE, lambda s, k: False):
        found[k].add(s)
    return {k: sorted(v) for k, v in found.items()}
