"""The Tinker API over HTTP against the embedded backend in process: one RL step at the same work, and the cost of
one call.

Two settings, arms interleaved (alternating which goes first), the same work for each:

- ``step``: the quickstart (``sailrl/tiny-arith``, 16 groups x 8 rollouts, max_tokens 12, importance_sampling)
  compiled and run for ``--steps`` steps as a fresh child process per repetition, ``sampler: tinker`` against SkyRL's
  Tinker API server on loopback (JAX on the CPU; ``tests/fakes/skyrl_server.py``; one server for every repetition,
  so JAX compiles each shape once) and ``sampler: local`` (the embedded backend). Reported: the median of each run's
  ``time/step`` past its first ``--skip`` steps (the first ones compile), and its ``time/rollout`` and
  ``time/train``; the HTTP / embedded ratio per repetition.
- ``call``: the per-call overhead of the HTTP path: ``forward`` on one 16-token datum (``cross_entropy``) and
  ``compute_logprobs`` of one 16-token sequence, each timed ``--calls`` times after 3 warm-ups, on the server
  through the real tinker SDK and on the embedded backend, in this process; the median, and the difference.

The server runs on the same 2 cores as the client, so its JAX work and sailrl's Python compete as they would not on
a GPU box: the step ratio is the CPU's, not a GPU deployment's. Needs SkyRL's environment (``SAILRL_SKYRL_PYTHON``).

    .venv/bin/python benchmarks/bench_tinker_http.py                        # both settings, 3 repetitions
    .venv/bin/python benchmarks/bench_tinker_http.py --settings call --calls 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tinker  # noqa: E402

from sailrl.runtime.backends.local import LocalServiceClient  # noqa: E402
from sailrl.runtime.backends.tinker_service import service_client  # noqa: E402
from tests.fakes.skyrl_server import MODEL, SkyRLServer, export_model_folder  # noqa: E402

#: LoRA slots on the server: every repetition of the step setting opens a model, and the call setting one more.
BACKEND_CONFIG = '{"max_lora_adapters": 32, "max_lora_rank": 16}'


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def compile_spec(folder: Path, sampler: str, steps: int) -> Path:
    text = (ROOT / "spec/examples/quickstart.yaml").read_text(encoding="utf-8")
    changes = {"  steps: 100": f"  steps: {steps}", "  sampler: local": f"  sampler: {sampler}",
               "  save_every: 20": f"  save_every: {steps}", "  run_dir: runs/quickstart": "  run_dir: run"}
    for old, new in changes.items():
        assert f"\n{old}" in text, old
        text = text.replace(f"\n{old}", f"\n{new}", 1)
    folder.mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "data" / "addition.jsonl").write_bytes((ROOT / "spec/examples/data/addition.jsonl").read_bytes())
    (folder / "spec.yaml").write_text(text, encoding="utf-8")
    subprocess.run([sys.executable, "-m", "sailrl", "compile", str(folder / "spec.yaml"), "-o",
                    str(folder / "train.py")], check=True, capture_output=True, timeout=120)
    return folder / "train.py"


def run_steps(script: Path, env: dict[str, str], skip: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(x) for x in (script.parent / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    kept = rows[skip:]
    return {k: statistics.median(r[f"time/{k}"] for r in kept) for k in ("step", "rollout", "train")}


def bench_steps(server: SkyRLServer, work: Path, reps: int, steps: int, skip: int) -> None:
    env_http = {**os.environ, "TINKER_BASE_URL": server.url, "no_proxy": "127.0.0.1,localhost"}
    env_http.pop("TINKER_API_KEY", None)
    env_local = dict(os.environ)
    results: dict[str, list[dict[str, float]]] = {"http": [], "embedded": []}
    for rep in range(reps):
        order = ["http", "embedded"] if rep % 2 == 0 else ["embedded", "http"]
        for arm in order:
            script = compile_spec(work / f"{arm}-{rep}", "tinker" if arm == "http" else "local", steps)
            results[arm].append(run_steps(script, env_http if arm == "http" else env_local, skip))
            print(f"  rep {rep + 1} {arm:8s} step {results[arm][-1]['step']:.3f} s (rollout "
                  f"{results[arm][-1]['rollout']:.3f}, train {results[arm][-1]['train']:.3f}); load {load()}",
                  flush=True)
    print(f"\nstep: median time/step of steps {skip + 1}-{steps}, quickstart shape (16 x 8, max_tokens 12)")
    print("| arm | time/step (median over reps) | min | time/rollout | time/train |")
    print("|---|---|---|---|---|")
    for arm, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("step", "rollout", "train")}
        print(f"| {arm} | {med['step']:.3f} s | {min(r['step'] for r in rs):.3f} s | {med['rollout']:.3f} s | "
              f"{med['train']:.3f} s |")
    ratios = [h["step"] / e["step"] for h, e in zip(results["http"], results["embedded"], strict=True)]
    print(f"HTTP / embedded time per step, per repetition: {', '.join(f'{r:.1f}x' for r in ratios)} "
          f"(median {statistics.median(ratios):.1f}x)")


def _timed(call, n: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_calls(server: SkyRLServer, work: Path, calls: int, reps: int) -> None:
    os.environ["TINKER_BASE_URL"] = server.url
    os.environ.pop("TINKER_API_KEY", None)
    tokens = list(range(40, 56))
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    arms = {}
    for arm, service in (("http", service_client()),
                         ("embedded", LocalServiceClient(MODEL, base_dir=work / "local", seed=0, device="cpu"))):
        training = service.create_lora_training_client(base_model=MODEL, rank=16, seed=0)
        sampler = training.save_weights_and_get_sampling_client()
        arms[arm] = {
            "forward": lambda t=training: t.forward([datum], "cross_entropy").result(),
            "compute_logprobs": lambda s=sampler: s.compute_logprobs(tinker.ModelInput.from_ints(tokens)).result(),
        }
    results: dict[tuple[str, str], list[float]] = {}
    for rep in range(reps):
        order = ["http", "embedded"] if rep % 2 == 0 else ["embedded", "http"]
        for arm in order:
            for name, call in arms[arm].items():
                results.setdefault((arm, name), []).append(_timed(call, calls))
    print(f"\ncall: median seconds of one call ({calls} calls x {reps} repetitions, interleaved; 16 tokens)")
    print("| call | HTTP (SkyRL) | embedded | HTTP overhead |")
    print("|---|---|---|---|")
    for name in ("forward", "compute_logprobs"):
        h, e = statistics.median(results[("http", name)]), statistics.median(results[("embedded", name)])
        print(f"| {name} | {h * 1000:.1f} ms | {e * 1000:.1f} ms | {(h - e) * 1000:.1f} ms ({h / e:.0f}x) |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=["step", "call"], choices=["step", "call"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip", type=int, default=2, help="leading steps of each run left out (JIT compiles)")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print(f"CPU: {cpu()}; load at start {load()}; python {platform.python_version()}, tinker {tinker.__version__}")
    with tempfile.TemporaryDirectory(prefix="bench-tinker-http-") as tmp:
        work = Path(tmp)
        model = export_model_folder(MODEL, work / "tiny-arith")
        with SkyRLServer(model, work / "server", backend_config=BACKEND_CONFIG) as server:
            if "step" in args.settings:
                bench_steps(server, work, args.reps, args.steps, args.skip)
            if "call" in args.settings:
                bench_calls(server, work, args.calls, args.reps)
    print(f"load at end {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
