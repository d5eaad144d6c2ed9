"""Bounded off-policy sampling: steps per minute with ``training.max_steps_off_policy`` K=1 against K=0.

Three settings. ``sail`` and ``local`` run whole `sailrl run`s of the quickstart spec, each in a fresh child process
(arms interleaved, alternating order, the same steps and repetitions for each; the first step of every run is left
out as warm-up):

- ``sail``: Tinker trains (the embedded backend standing in, training in its child process as Tinker trains on
  machines of its own) and a loopback Sail server samples,
  answering each rollout after a fixed service time set to the measured mean training time of a K=0 run, so
  sampling and training take about as long (the case where overlapping them matters most). Its sampler returns a
  right and a wrong answer alternately, so no group is degenerate and every step trains.
- ``local``: the embedded backend trains and samples (the quickstart's shape: 16 groups x 8, max_tokens 12). Arms:
  K=0 as shipped (training and sampling on threads of the run's process), K=1 as shipped (training and sampling in
  the backend's two child processes, ``SAILRL_LOCAL_PROCESSES`` unset), and the two other combinations
  (``SAILRL_LOCAL_PROCESSES=0`` / ``=1``), so each choice is measured against its alternative.
- ``contention``: why child processes: the time of one update (forward_backward + optim_step on 128
  quickstart-like datums) alone, beside a thread sampling 16 x 8 rollouts in a loop in the same process, and beside
  the same loop in the sampling process (median of ``--reps`` x 15 updates after 3 warm-ups, interleaved).

Reported per arm: RL steps per minute from the runs' ``time/step`` (median and min over repetitions), the mean of
``time/train`` (the update, which slows when the sampler shares the interpreter), the ratio to K=0, plus the mean
reward and ``correct`` of the runs (what off-policy sampling does to learning).

    .venv/bin/python benchmarks/bench_off_policy.py                 # all settings, 3 repetitions, 12 steps
    .venv/bin/python benchmarks/bench_off_policy.py --settings local --reps 4 --steps 30
    .venv/bin/python benchmarks/bench_off_policy.py --settings local --busy 1   # beside a competing busy process

``--busy N`` starts N busy processes (a pure-Python loop each, one core's worth of work) before the first run and
stops them after the last, so every arm of every repetition competes with them alike.
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
    from sailrl.runtime.backends.local import LocalServiceClient
    from tests.fakes.sail_server import FakeSailServer, Sample, point_sail_sdk_at

    # trains in its own process, as Tinker trains on its own machines: the loop's Python does not slow it
    service = LocalServiceClient("sailrl/tiny", base_dir=os.path.join(run_dir, "ckpt"), processes=True)
    tok = service.create_sampling_client(base_model="sailrl/tiny").get_tokenizer()
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


def _run(setting: str, k: int, steps: int, service_time: float, process: str | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [sys.executable, __file__, "--child", setting, str(k), str(steps), run_dir, str(service_time)]
        env = {**os.environ, "SAILRL_HOME": os.path.join(tmp, "home")}
        env.pop("SAILRL_LOCAL_PROCESSES", None)
        if process is not None:
            env["SAILRL_LOCAL_PROCESSES"] = process
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
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


#: (label, K, SAILRL_LOCAL_PROCESSES) per arm of a setting; None = as shipped (the default for that K).
ARMS = {"sail": [("K=0", 0, None), ("K=1", 1, None)],
        "local": [("K=0", 0, None), ("K=1", 1, None), ("K=1 in process", 1, "0"),
                  ("K=0 child processes", 0, "1")]}


def _contention(reps: int) -> None:
    """Median update time alone / beside a sampling thread / beside a sampling process (see the docstring)."""
    import random
    import threading
    import time

    import tinker
    import torch
    from tinker import types

    from sailrl.runtime.backends.local import LocalServiceClient

    def client(process: bool, base_dir: str):
        svc = LocalServiceClient("sailrl/tiny-arith", processes=process, base_dir=base_dir)
        return svc, svc.create_lora_training_client(base_model="sailrl/tiny-arith", rank=16, seed=0)

    def sample_loop(stop: threading.Event, process: bool, base_dir: str) -> None:
        svc, tc = client(process, base_dir)
        sampler = tc.create_sampling_client(tc.save_weights_for_sampler("bench").result().path)
        tok = tc.get_tokenizer()
        prompts = [types.ModelInput.from_ints(tok.encode(f"User: {i % 10}+{i // 10}=\n\nAssistant:",
                                                         add_special_tokens=False)) for i in range(16)]
        params = types.SamplingParams(max_tokens=12, temperature=1.0)
        while not stop.is_set():
            for f in [sampler.sample(p, 8, params) for p in prompts]:
                f.result()
        svc.close("done")

    with tempfile.TemporaryDirectory() as tmp:
        svc, tc = client(False, os.path.join(tmp, "train"))
        tok, rng, data = tc.get_tokenizer(), random.Random(0), []
        for _ in range(128):
            p = tok.encode(f"User: {rng.randint(0, 9)}+{rng.randint(0, 9)}=\n\nAssistant:", add_special_tokens=False)
            c = tok.encode(f" {rng.randint(0, 18)}", add_special_tokens=False) + [tok.eos_token_id]
            zeros = [0.0] * (len(p) - 1)
            data.append(types.Datum(model_input=types.ModelInput.from_ints((p + c)[:-1]), loss_fn_inputs={
                "target_tokens": types.TensorData.from_torch(torch.tensor((p + c)[1:])),
                "logprobs": types.TensorData.from_torch(torch.tensor(zeros + [-0.5] * len(c))),
                "advantages": types.TensorData.from_torch(torch.tensor(zeros + [0.3] * len(c)))}))
        adam = tinker.AdamParams(learning_rate=1e-4)

        def update_s() -> float:
            times = []
            for _ in range(18):
                t0 = time.perf_counter()
                tc.forward_backward(data, "importance_sampling").result()
                tc.optim_step(adam).result()
                times.append(time.perf_counter() - t0)
            return statistics.median(times[3:])

        results: dict[str, list[float]] = {"alone": [], "beside a sampling thread": [],
                                           "beside a sampling process": []}
        for rep in range(reps):
            for arm in results:
                if arm == "alone":
                    results[arm].append(update_s())
                    continue
                stop = threading.Event()
                th = threading.Thread(target=sample_loop, args=(stop, arm.endswith("process"),
                                                                os.path.join(tmp, f"s{rep}{arm[-4:]}")))
                th.start()
                time.sleep(4.0)  # the sampler is loaded and sampling
                results[arm].append(update_s())
                stop.set()
                th.join()
        alone = statistics.median(results["alone"])
        for arm, times in results.items():
            print(f"contention: update {arm}: median {statistics.median(times) * 1000:.1f} ms "
                  f"({statistics.median(times) / alone:.2f}x alone)")
        svc.close("done")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["sail", "local", "contention"],
                   choices=["sail", "local", "contention"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--busy", type=int, default=0, help="competing busy processes during the runs (CPU contention)")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        setting, k, steps, run_dir, service_time = args.child
        return _child(setting, int(k), int(steps), run_dir, float(service_time))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        return _settings(args)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def _settings(args: argparse.Namespace) -> int:
    if args.busy:
        print(f"beside {args.busy} competing busy process(es); load average at start {os.getloadavg()[0]:.2f}")
    for setting in args.settings:
        if setting == "contention":
            _contention(args.reps)
            continue
        service_time = 0.0
        if setting == "sail":  # sampling as long as training: measure training on a K=0 run first
            service_time = round(_run("sail", 0, 4, 0.0)["train_s"], 3)
            print(f"sail: service time per rollout set to the measured training time, {service_time:.3f} s")
        arms = ARMS[setting]
        results: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in arms}
        for rep in range(args.reps):
            for label, k, process in (arms if rep % 2 == 0 else arms[::-1]):  # interleaved, alternating order
                results[label].append(_run(setting, k, args.steps, service_time, process))
        base = statistics.median(r["steps_per_min"] for r in results["K=0"])
        for label, _, _ in arms:
            rs = results[label]
            spm = [r["steps_per_min"] for r in rs]
            print(f"{setting} {label}: steps/min median {statistics.median(spm):.1f} min {min(spm):.1f} "
                  f"({statistics.median(spm) / base:.2f}x K=0) | time/train "
                  f"{statistics.mean(r['train_s'] for r in rs):.3f} s"
                  f" | reward {statistics.mean(r['reward'] for r in rs):+.3f} correct "
                  f"{statistics.mean(r['correct'] for r in rs):.3f} | staleness {rs[0]['staleness']:.2f}")
        k1 = statistics.median(r["steps_per_min"] for r in results["K=1"])
        print(f"{setting}: K=1 / K=0 steps per minute (medians, as shipped) = {k1 / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
