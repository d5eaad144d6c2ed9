"""Runs started, stopped and resumed from the studio's page, and what a run's progress and outcome are in words.

A run is ``sailrl run SPEC`` (``--overwrite`` or ``--resume``, with a few numeric ``--set`` overrides from
:data:`OVERRIDABLE`) started as a detached process: a new session (``start_new_session``: its own process group,
so neither the studio's Ctrl-C nor the studio's exit reaches it), stdin from ``/dev/null``, its output to
``RUN_DIR/studio-run.log``. Closing the tab or stopping the studio leaves it running. It trains the spec file as
saved (the page saves first). One run at a time per spec: a start is refused while a run the studio started is
alive, or while the run folder's ``metrics.jsonl`` grew in the last :data:`FRESH_S` seconds (a run started in a
terminal). Stop acts only on a run this studio started: it sends SIGINT to its process group, as Ctrl-C in its
terminal would (the run saves its state and exits 130; Resume continues it).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sailrl.runtime.loop.gaming import pass_rate
from sailrl.runtime.rundir.directory import GAMING_FILE, METRICS_FILE, SCHEMA_KEY, open_run_file
from sailrl.spec.errors import UserError

__all__ = ["FRESH_S", "LOG_FILE", "OVERRIDABLE", "RunError", "Runner", "outcome_words", "progress"]

LOG_FILE = "studio-run.log"
FRESH_S = 20.0
LOG_TAIL_BYTES = 4096
MAX_GAMING_BYTES = 256 * 1024
#: The ``--set`` keys a run from the page may override (numbers only), and their bounds.
OVERRIDABLE: dict[str, tuple[float, float]] = {
    "training.steps": (1, 100_000), "training.group_size": (2, 1024), "training.groups_per_step": (1, 4096),
    "training.learning_rate": (0, 1), "training.save_every": (1, 100_000), "training.eval_every": (1, 100_000),
    "sampling.max_tokens": (1, 1_048_576), "sampling.temperature": (0, 10),
}


class RunError(UserError):
    """A run request refused: ``str(exc)`` plain words, ``status`` the HTTP status."""

    code = "E214"

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


def default_command(spec_path: Path, mode: str, overrides: dict[str, float]) -> list[str]:
    """``python -m sailrl run SPEC --overwrite|--resume --set K=V ...``."""
    argv = [sys.executable, "-m", "sailrl", "run", str(spec_path), "--resume" if mode == "resume" else "--overwrite"]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value:g}"]
    return argv


def check_overrides(raw: Any) -> dict[str, float]:
    """``raw`` (``{key: number}``) checked against :data:`OVERRIDABLE`; :class:`RunError` (400) otherwise."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RunError("overrides must be an object of key: number", 400)
    out = {}
    for key, value in raw.items():
        if key not in OVERRIDABLE:
            raise RunError(f"{key} cannot be overridden from the page (it takes {', '.join(OVERRIDABLE)})", 400)
        low, high = OVERRIDABLE[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or not low <= value <= high:
            raise RunError(f"{key} takes a number from {low:g} to {high:g}, not {value!r}", 400)
        out[key] = float(value)
    return out


def _read_lines(path: Path, limit: int, offset: int = 0) -> list[dict[str, Any]]:
    f = open_run_file(path)
    if f is None:
        return []
    with f:
        f.seek(offset)
        raw = f.read(limit)
    out = []
    for line in raw.split(b"\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append({k: v for k, v in obj.items() if k != SCHEMA_KEY})
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def rule_scores(rule: dict[str, Any]) -> tuple[float, float]:
    """(contribution on pass, contribution on fail) of a rule as ``config.json`` saves it (its ``scores()``)."""
    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    on_pass, on_fail, weight = num(rule.get("pass_score")), num(rule.get("fail_score")), num(rule.get("weight"))
    if on_pass is not None or on_fail is not None:
        return (on_pass or 0.0, on_fail or 0.0)
    return (1.0 if weight is None else weight, 0.0)


def _rule_rates(metrics: list[dict[str, Any]], rules: list[dict[str, Any]], skip: str | None) -> list[str]:
    """"'format' passed on 0% of replies, from 0%" for each rule but ``skip`` whose ``reward/<rule>`` was logged: its
    pass rate over the last steps and the first (as many as the outcome's sentence averages)."""
    out = []
    for rule in rules:
        name = rule.get("name") if isinstance(rule, dict) else None
        if not isinstance(name, str) or name == skip:
            continue
        scores = rule_scores(rule)
        rates = [r for r in (pass_rate(m.get(f"reward/{name}"), *scores) for m in metrics) if r is not None]
        if len(rates) < 2:
            continue
        n = min(5, len(rates) // 2)
        out.append(f"'{name}' passed on {_mean(rates[-n:]):.0%} of replies, from {_mean(rates[:n]):.0%}")
    return out


def outcome_words(metrics: list[dict[str, Any]], correct_rule: str | None,
                  rules: list[dict[str, Any]] | None = None) -> str | None:
    """"The model now gets 71% right by rule 'correct' (the last 5 steps), up from 38% (the first 5)", from
    ``correct`` (``eval/correct`` when the run has held-out rows), or the reward when there is no correct rule; then
    every other rule of ``rules`` (as ``config.json`` saves them): "'format' passed on 0% of replies, from 0%", so a
    goal the model never reaches shows."""
    head = None
    for key, what in (("eval/correct", "of the held-out prompts"), ("correct", "of the prompts")):
        values = [float(m[key]) for m in metrics if isinstance(m.get(key), (int, float))]
        if len(values) >= 2:
            n = min(5, len(values) // 2)
            first, last = _mean(values[:n]), _mean(values[-n:])
            trend = "up from" if last > first else "down from" if last < first else "the same as"
            by = f" by rule '{correct_rule}'" if correct_rule else ""
            head = (f"the model now gets {last:.0%} {what} right{by} (mean of the last {n} steps), {trend} "
                    f"{first:.0%} (the first {n})")
            break
    if head is None:
        values = [float(m["reward/total"]) for m in metrics if isinstance(m.get("reward/total"), (int, float))]
        if len(values) < 2:
            return None
        n = min(5, len(values) // 2)
        head = f"the mean reward went from {_mean(values[:n]):+.3f} to {_mean(values[-n:]):+.3f}"
    return "; ".join([head, *_rule_rates(metrics, rules or [], correct_rule)])


def progress(metrics: list[dict[str, Any]], total: int | None, running: bool) -> dict[str, Any]:
    """Steps done of ``total``, the seconds a step took lately and the time left."""
    steps = [m["step"] for m in metrics if isinstance(m.get("step"), int)]
    done = max(steps) if steps else 0
    times = [float(m["time/step"]) for m in metrics[-5:] if isinstance(m.get("time/step"), (int, float))]
    per = _mean(times)
    left = (total - done) * per if (total and per is not None and running) else None
    return {"done": done, "total": total, "seconds_per_step": per, "seconds_left": left,
            "fraction": (done / total) if total else None}


class Runner:
    """The runs one studio started (thread-safe). ``command``: builds the argv (tests pass a fake run)."""

    def __init__(self, spec_path: Path, command: Callable[[Path, str, dict[str, float]], list[str]] | None = None
                 ) -> None:
        self.spec_path = spec_path
        self.command = command or default_command
        self._lock = threading.Lock()
        self._procs: dict[Path, subprocess.Popen[bytes]] = {}
        # a new run (not a resume): what its folder held before it started, so its status never shows the previous
        # run's steps, outcome or warnings: file name -> (inode, size) at the start, and the steps asked for
        self._before: dict[Path, dict[str, tuple[int, int] | None]] = {}
        self._steps: dict[Path, int | None] = {}

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size)

    def since(self, run_dir: Path, name: str) -> int | None:
        """The byte offset in ``run_dir/name`` where the new run this studio started there begins: what it appended
        after the previous run's lines (0 when it wrote the file anew, when the run is a resume, or when the studio
        started none there); None while the file is still the previous run's, unchanged."""
        with self._lock:
            before = self._before.get(run_dir)
        if before is None:
            return 0
        was, now = before.get(name), self._stamp(run_dir / name)
        if was is None or now is None or now[0] != was[0] or now[1] < was[1]:
            return 0  # none before, or replaced or cut: all of it is the new run's
        return was[1] if now[1] > was[1] else None

    def steps_asked(self, run_dir: Path) -> int | None:
        with self._lock:
            return self._steps.get(run_dir)

    def ended_here(self, run_dir: Path) -> bool:
        """Whether the last run this studio started in ``run_dir`` has exited (its records are final: the folder's
        recent writes were that run's, not one going on elsewhere)."""
        with self._lock:
            proc = self._procs.get(run_dir)
            return proc is not None and proc.poll() is not None

    def alive(self, run_dir: Path) -> subprocess.Popen[bytes] | None:
        """The process this studio started in ``run_dir`` while it runs (None otherwise; a finished one is reaped)."""
        with self._lock:
            proc = self._procs.get(run_dir)
            if proc is not None and proc.poll() is not None:
                return None
            return proc

    def exit_code(self, run_dir: Path) -> int | None:
        with self._lock:
            proc = self._procs.get(run_dir)
            return proc.poll() if proc is not None else None

    def started_here(self, run_dir: Path) -> bool:
        with self._lock:
            return run_dir in self._procs

    @staticmethod
    def fresh(run_dir: Path) -> bool:
        """Whether ``metrics.jsonl`` grew in the last :data:`FRESH_S` seconds (a run going on, wherever started)."""
        try:
            return time.time() - (run_dir / METRICS_FILE).stat().st_mtime < FRESH_S
        except OSError:
            return False

    def start(self, run_dir: Path, mode: str, overrides: dict[str, float]) -> dict[str, Any]:
        if mode not in ("new", "resume"):
            raise RunError("mode is new or resume", 400)
        with self._lock:
            running = [d for d, p in self._procs.items() if p.poll() is None]
            if running:
                raise RunError(f"a run of this spec is going on ({running[0]}): stop it first, or wait for it")
            ours = run_dir in self._procs  # its recent writes were the run this studio started (ended, see above)
            if not ours and self.fresh(run_dir):
                raise RunError(f"{run_dir} is being written by a run started elsewhere (its metrics.jsonl grew in "
                               f"the last {FRESH_S:.0f} s): one run at a time per spec")
            if mode == "resume" and not (run_dir / METRICS_FILE).is_file():
                raise RunError(f"{run_dir} holds no run to resume: start a new one", 404)
            run_dir.mkdir(parents=True, exist_ok=True)
            argv = self.command(self.spec_path, mode, overrides)
            log = (run_dir / LOG_FILE).open("ab")
            try:
                log.write(f"\n# sailrl studio started: {' '.join(argv)}\n".encode())
                log.flush()
                proc = subprocess.Popen(  # noqa: S603 -- our own argv, no shell
                    argv, cwd=self.spec_path.parent, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, close_fds=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            finally:
                log.close()
            self._procs[run_dir] = proc
            self._before[run_dir] = {n: self._stamp(run_dir / n) for n in (METRICS_FILE, GAMING_FILE)} \
                if mode == "new" else None
            self._steps[run_dir] = int(overrides["training.steps"]) if "training.steps" in overrides else None
        return {"pid": proc.pid, "argv": argv, "log": str(run_dir / LOG_FILE)}

    def stop(self, run_dir: Path) -> dict[str, Any]:
        """SIGINT to the process group of the run this studio started in ``run_dir`` (as Ctrl-C)."""
        proc = self.alive(run_dir)
        if proc is None:
            raise RunError("no run this studio started is going on there: the studio stops only the runs it started "
                           "(stop one started in a terminal with Ctrl-C there)")
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            return {"stopping": False}
        return {"stopping": True, "pid": proc.pid}

    @staticmethod
    def log_tail(run_dir: Path) -> str:
        f = open_run_file(run_dir / LOG_FILE)
        if f is None:
            return ""
        with f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read(LOG_TAIL_BYTES).decode("utf-8", "replace")

    @staticmethod
    def gaming(run_dir: Path, last_step: int | None, offset: int = 0) -> list[dict[str, Any]]:
        """The run's gaming warnings (``gaming.jsonl`` from byte ``offset`` on) of the steps it still has."""
        out = _read_lines(run_dir / GAMING_FILE, MAX_GAMING_BYTES, offset)
        for g in out:  # the page's own wording where the warning has one (its Try box, not a command)
            if isinstance(g.get("studio_message"), str):
                g["message"] = g.pop("studio_message")
        return [g for g in out if last_step is None or (isinstance(g.get("step"), int) and g["step"] <= last_step)]
