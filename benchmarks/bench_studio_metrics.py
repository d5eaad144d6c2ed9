"""What one 2 s poll of ``/api/run/metrics`` costs while the studio follows a run, as metrics.jsonl grows.

Run:  python benchmarks/bench_studio_metrics.py [--mib 8 64] [--polls 30] [--warmup 5]

A ``metrics.jsonl`` of about ``--mib`` MiB (lines shaped like a run's: ~60 metrics each) is written to a temporary
folder; each poll then appends one step's line and asks for what is new. Arms, interleaved poll by poll, the same
warm-up (``--warmup`` polls each, not counted):

* ``before``: the poll as it was before this change (commit e39008f^): read up to 64 MiB of the file, split every
  line, skip the first ``after`` lines, parse the rest (``next`` was a line count);
* ``offset``: :func:`sailrl.studio.session.read_metrics` from the byte offset the last answer gave (``next`` is a
  byte offset), which reads only the appended bytes (and one byte before them).

Both should give the page the new line; the ``before`` arm does not once the file is past 64 MiB (it read only the
first 64 MiB, so a long run stopped being followed), and the count of such polls is printed. Prints the median
and p95 per arm and size, the ratio of the medians, and ``uptime`` (the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sailrl.studio.session import read_metrics


def before(path: Path, after: int) -> dict:
    """The poll of commit e39008f^ (``Studio.metrics``), restated: ``after`` counts lines."""
    with path.open("rb") as f:
        raw = f.read(64 * 1024 * 1024)
    lines = raw.split(b"\n")
    if not raw.endswith(b"\n"):
        lines = lines[:-1]
    lines = [ln for ln in lines if ln.strip()][:100_000]
    out = []
    for ln in lines[after:]:
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return {"lines": out, "next": len(lines)}


def line(step: int) -> str:
    m = {"step": step, "reward/total": 0.5, "correct": 0.4, "degenerate_frac": 0.1, "frac_truncated": 0.0}
    m.update({f"metric/{i:02d}": i / 7 + step / 1000 for i in range(60)})
    return json.dumps(m) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, nargs="+", default=[8, 64])
    ap.add_argument("--polls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for mib in args.mib:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "metrics.jsonl"
            one = line(0)
            steps = max(1, int(mib * 1024 * 1024 / len(one)))
            with path.open("w") as f:
                for s in range(1, steps + 1):
                    f.write(line(s))
            step = steps
            old_next = before(path, 0)["next"]  # the page's state after its first poll, in each arm's terms
            new = read_metrics(path, 0, None, chunk=1 << 30)
            new_next, fid = new["next"], new["file"]
            times: dict[str, list[float]] = {"before": [], "offset": []}
            missed = 0
            for i in range(args.warmup + args.polls):
                step += 1
                with path.open("a") as f:
                    f.write(line(step))
                t0 = time.perf_counter()
                a = before(path, old_next)
                t1 = time.perf_counter()
                b = read_metrics(path, new_next, fid)
                t2 = time.perf_counter()
                assert [x["step"] for x in b["lines"]] == [step], b
                if [x["step"] for x in a["lines"]] != [step]:
                    missed += 1  # past 64 MiB the old poll never read the new lines
                old_next, new_next = a["next"], b["next"]
                if i >= args.warmup:
                    times["before"].append(t1 - t0)
                    times["offset"].append(t2 - t1)
            size = os.path.getsize(path) / 2**20
            med = {k: statistics.median(v) for k, v in times.items()}
            p95 = {k: sorted(v)[int(0.95 * (len(v) - 1))] for k, v in times.items()}
            for k in times:
                print(f"{size:6.1f} MiB ({steps:,} steps)  {k:7s} median {med[k] * 1e3:9.3f} ms   "
                      f"p95 {p95[k] * 1e3:9.3f} ms")
            print(f"{size:6.1f} MiB  before / offset (medians): {med['before'] / med['offset']:,.0f}x; polls whose new "
                  f"line 'before' did not return: {missed} of {args.warmup + args.polls}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
