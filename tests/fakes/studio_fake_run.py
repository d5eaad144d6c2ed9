"""A stand-in for ``sailrl run`` that the studio's run tests start: ``python studio_fake_run.py RUN_DIR STEPS MODE``.

It writes ``config.json`` and one ``metrics.jsonl`` line per step (one step each time ``RUN_DIR/go`` appears, so a
test decides when a step happens, with no sleeps in its assertions), its pid, process group and session in
``RUN_DIR/fake.json``; on SIGINT it writes ``RUN_DIR/stopped`` and exits 130, as a real run does after saving.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    run_dir, steps, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    run_dir.mkdir(parents=True, exist_ok=True)

    def stop(signum, frame):  # noqa: ARG001
        (run_dir / "stopped").write_text(f"{signum}\n")
        sys.exit(130)

    signal.signal(signal.SIGINT, stop)
    (run_dir / "fake.json").write_text(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                                                    "mode": mode}))
    (run_dir / "config.json").write_text(json.dumps({"spec": {"training": {"steps": steps}, "reward": {
        "rules": [{"name": "correct", "kind": "answer"}]}}}))
    done = 0
    metrics = run_dir / "metrics.jsonl"
    if mode == "resume" and metrics.exists():
        done = sum(1 for _ in metrics.open())
    print(f"fake run: {mode} from step {done + 1}", flush=True)
    deadline = time.monotonic() + 60
    while done < steps and time.monotonic() < deadline:
        go = run_dir / "go"
        if go.exists():
            go.unlink()
            done += 1
            with metrics.open("a") as f:
                f.write(json.dumps({"step": done, "correct": 0.3 + 0.1 * done, "reward/total": 0.1 * done,
                                    "time/step": 2.0}) + "\n")
            print(f"step {done}/{steps}", flush=True)
        time.sleep(0.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
