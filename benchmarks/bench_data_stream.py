"""Memory and time of loading a large JSONL dataset: streamed rows (this tree) vs rows read whole (a baseline tree).

For each size (default 10k, 100k, 1M rows of gsm8k-like sums, ~36 bytes a row), each arm runs in a fresh Python
process, interleaved (size by size, arm after arm, same repetitions), and reports:

- ``first step``: seconds from a parsed spec to the first step's rows, as a run does it (``load_rows`` with the
  model's renderer and the reward rules, then ``rows_for_step(train, 0, ...)``), and the process's peak RSS;
- ``preflight``: wall seconds and peak RSS of ``sailrl preflight SPEC --sample 0`` (CLI start included);
- with ``dataset.limit: 1000`` the same first step (reading stops after 1,000 rows).

The baseline is another git revision of sailrl (``--baseline REF``, e.g. 38c3a29, the commit before streaming),
exported to a temporary folder with ``git archive`` and imported from there; without it only this tree is measured.
Prints the load average first (the numbers are only comparable at a similar load).

    python benchmarks/bench_data_stream.py [--sizes 10000,100000,1000000] [--reps 1] [--baseline REF]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SPEC = """name: bench
model: {{name: sailrl/tiny-arith, renderer: role_colon}}
dataset:
  source: rows.jsonl
  fields: [question, answer]
{limit}prompt:
  user: '{{{{ question }}}}='
reward:
  rules:
    - name: correct
      kind: answer
      extract: {{from: whole}}
      reference: {{extract: {{from: whole}}}}
      compare: numeric
training: {{steps: 10, groups_per_step: 8, group_size: 4}}
sampling: {{max_tokens: 4}}
"""

FIRST_STEP = r"""
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from sailrl.compiler.validate import validate_file
from sailrl.runtime.data import load_rows, rows_for_step, shuffle_seed
from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.rewards.rules import RewardFunction
loaded = validate_file(sys.argv[1])
spec = loaded.spec
tok = get_tokenizer(spec.model.name, loaded.base_dir)
renderer = get_renderer(spec.model.renderer, tok)
fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field, spec_dir=loaded.base_dir)
t1 = time.perf_counter()
rows = load_rows(spec, loaded.base_dir, fn, renderer=renderer)
first = rows_for_step(rows.train, 0, spec.training.groups_per_step, shuffle_seed(spec))
t2 = time.perf_counter()
print(json.dumps({"seconds": t2 - t1, "setup": t1 - t0, "train": len(rows.train), "first": len(first),
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

PREFLIGHT = r"""
import json, resource, sys, time, io, contextlib
t0 = time.perf_counter()
from sailrl.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["preflight", sys.argv[1], "--sample", "0"])
print(json.dumps({"seconds": time.perf_counter() - t0, "rc": rc,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write_rows(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            a, b = i % 10, (i // 10) % 10
            f.write(json.dumps({"question": f"{a}+{b}", "answer": str(a + b)}) + "\n")


def baseline_tree(ref: str, into: Path) -> Path:
    """``ref`` exported under ``into``, laid out as the import package (pyproject's package-dir mapping)."""
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "pkg" / "sailrl"
    pkg.parent.mkdir()
    os.symlink(src / "sailrl", pkg)
    for name in ("spec", "compiler", "runtime"):
        os.symlink(src / name, src / "sailrl" / name)
    return into / "pkg"


def measure(code: str, spec: Path, pythonpath: Path | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
        env["PYTHONSAFEPATH"] = "1"
    out = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True, env=env,
                         cwd=spec.parent, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"arm failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--baseline", default="none")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min), cpus: {os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="sailrl-bench-") as tmp:
        tmp_path = Path(tmp)
        arms: list[tuple[str, Path | None]] = [("streamed", None)]
        if args.baseline != "none":
            arms.append((f"whole ({args.baseline})", baseline_tree(args.baseline, tmp_path)))
        print(f"{'rows':>9} {'MB':>6}  {'arm':<22} {'first step s':>12} {'RSS MiB':>8}  {'limit 1000 s':>12} "
              f"{'RSS MiB':>8}  {'preflight s':>11} {'RSS MiB':>8}")
        for n in (int(x) for x in args.sizes.split(",")):
            folder = tmp_path / f"n{n}"
            folder.mkdir()
            write_rows(folder / "rows.jsonl", n)
            (folder / "spec.yaml").write_text(SPEC.format(limit=""))
            (folder / "limited.yaml").write_text(SPEC.format(limit="  limit: 1000\n"))
            mb = (folder / "rows.jsonl").stat().st_size / 1e6
            for _ in range(args.reps):
                for label, path in arms:
                    t = time.perf_counter()
                    first = measure(FIRST_STEP, folder / "spec.yaml", path)
                    limited = measure(FIRST_STEP, folder / "limited.yaml", path)
                    pre = measure(PREFLIGHT, folder / "spec.yaml", path)
                    assert first["train"] == n and limited["train"] == min(n, 1000), (first, limited)
                    print(f"{n:>9,} {mb:>6.1f}  {label:<22} {first['seconds']:>12.2f} {first['rss_mib']:>8.0f}  "
                          f"{limited['seconds']:>12.2f} {limited['rss_mib']:>8.0f}  {pre['seconds']:>11.2f} "
                          f"{pre['rss_mib']:>8.0f}   ({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
