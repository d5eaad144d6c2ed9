"""Bounded off-policy sampling: steps per minute with ``training.max_steps_off_policy`` K=1 against K=0.

Two settings, each run as a whole `sailrl run` of the quickstart spec in a fresh child process (arms interleaved,
the same steps and repetitions for each; the first step of every run is left out as warm-up):

- ``sail``: Tinker trains (the embedded backend standing in, in process) and a loopback Sail server samples,
  answering each rollout after a fixed service time set to the measured mean training time of a K=0 run, so
  sampling and training take about as long (the case where overlapping them matters most). Its sampler returns a
  right and a wrong answer alternately, so no group is degenerate and every step trains.
- ``local``: the embedded backend trains and samples (the quickstart's shape: 16 groups x 8, max_tokens 12).

Reported per arm: RL steps per minute from the runs' ``time/step`` (median and min over repetitions) and the
ratio K=1 / K=0, plus the mean reward and ``correct`` of the runs (what off-policy sampling does to learning).

    .venv/bin/python benchmarks/bench_off_policy.py                 # both settings, 3 repetitions, 12 steps
    .venv/bin/python benchmarks/bench_off_policy.py --settings local --reps 2 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _Env:
    """``os.environ`` with pytest monkeypatch's setenv / delenv (what ``point_sail_sdk_at`` takes)."""

    def setenv(self, name: str, value: str) -> None:
        os.environ[name] = value

    def delenv(self, name: str, raising: bool = True) -> None:
        os.environ.pop(name, None)


def _child(setting: str, k: int, steps: int, run_dir: str, service_time: float) -> int:
    """One run (in this child process): the quickstart for ``steps`` RL steps with max_steps_off_policy ``k``."""
    sets = [f"training.steps={steps}", "training.warmup=null", f"training.max_steps_off_policy={k}",
            f"output.run_dir={run_dir}", "output.log_rollouts=0", "training.save_every=0"]
    args = ["run", str(ROOT / "spec/examples/quickstart.yaml")]
    if setting == "local":
        from sailrl.cli import main

        return main(args + sum((["--set", s] for s in sets), []))
    import re
    from collections import Counter

    import tinker

    from sailrl.cli import main
    from sailrl.runtime.local import LocalServiceClient
    from tests.fakes.sail_server import FakeSailServer, Sample, point_sail_sdk_at

    service = LocalServiceClient("sailrl/tiny", base_dir=os.path.join(run_dir, "ckpt"))
    tok = service.create_sampling_client(base_model="sailrl/tiny").result().get_tokenizer()
    seen: Counter = Counter()

    def sampler(prompt_tokens, payload):
        a, b = map(int, re.search(r"(\d+)\+(\d+)=", tok.decode(prompt_tokens)).groups())
        seen[tuple(prompt_tokens)] += 1
        answer = a + b if seen[tuple(prompt_tokens)] % 2 else a + b + 1
        ids = tok.encode(f"{answer}", add_special_tokens=False)
        return Sample(ids, [-0.5] * len(ids), "stop")

    server = FakeSailServer(service_time_s=service_time, sampler=sampler).start()
    point_sail_sdk_at(server.url, _Env())
    os.environ["TINKER_API_KEY"] = "tml-benchmark"
    tinker.ServiceClient = lambda *a, **kw: service  # the embedded backend stands in for Tinker
    try:
        return main(args + ["--sampler", "sail"] + sum((["--set", s] for s in sets), []))
    finally:
        server.close()


def _run(setting: str, k: int, steps: int, service_time: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [sys.executable, __file__, "--child", setting, str(k), str(steps), run_dir, str(service_time)]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                           env={**os.environ, "SAILRL_HOME": os.path.join(tmp, "home")})
        if r.returncode != 0:
            raise SystemExit(f"{setting} K={k} failed:\n{r.stderr[-3000:]}")
        lines = [json.loads(x) for x in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    timed = lines[1:]  # the first step warms up
    seconds = sum(m["time/step"] for m in timed)
    trained = [m.get("time/train", 0.0) for m in timed]
    return {"steps_per_min": 60 * len(timed) / seconds, "train_s": statistics.mean(trained),
            "reward": statistics.mean(m["reward/total"] for m in lines),
            "correct": statistics.mean(m.get("correct", 0.0) for m in lines),
            "staleness": statistics.mean(m.get("staleness/max", 0.0) or 0.0 for m in lines)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["sail", "local"], choices=["sail", "local"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        setting, k, steps, run_dir, service_time = args.child
        return _child(setting, int(k), int(steps), run_dir, float(service_time))
    for setting in args.settings:
        service_time = 0.0
        if setting == "sail":  # sampling as long as training: measure training on a K=0 run first
            service_time = round(_run("sail", 0, 4, 0.0)["train_s"], 3)
            print(f"sail: service time per rollout set to the measured training time, {service_time:.3f} s")
        results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
        for rep in range(args.reps):
            for k in ((0, 1) if rep % 2 == 0 else (1, 0)):  # interleaved, alternating order
                results[k].append(_run(setting, k, args.steps, service_time))
        spm = {k: [r["steps_per_min"] for r in rs] for k, rs in results.items()}
        for k in (0, 1):
            rs = results[k]
            print(f"{setting} K={k}: steps/min median {statistics.median(spm[k]):.1f} min {min(spm[k]):.1f} | "
                  f"reward {statistics.mean(r['reward'] for r in rs):+.3f} correct "
                  f"{statistics.mean(r['correct'] for r in rs):.3f} | staleness {rs[0]['staleness']:.2f}")
        print(f"{setting}: K=1 / K=0 steps per minute (medians) = "
              f"{statistics.median(spm[1]) / statistics.median(spm[0]):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
