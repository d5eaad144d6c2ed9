"""Cost of reading local data files with sailrl's checks, against the plain readers they replace.

Arms, interleaved (each repetition runs every arm once, in turn), same data, same warm-up:

- jsonl: ``sailrl.runtime.data.readers.json_rows`` (duplicate keys, integer digits and nesting depth checked,
  every problem located) vs ``json.loads`` per line (the reader before those checks).
- csv: ``sailrl.runtime.data.sources.CsvSource`` (Python's ``csv`` module, record by record, ragged records
  located) vs ``datasets.load_dataset("csv", ...)`` with string features (the reader it replaced).
- prompt length: ``load_rows`` with the tiny model's renderer (every prompt rendered to tokens and checked
  against the context window) vs without.

Prints min and median seconds per arm and, per pair, the ratios of mins and of medians.

    python benchmarks/bench_data_load.py [ROWS] [REPS]
"""

from __future__ import annotations

import csv
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def rows(n: int) -> list[dict]:
    rng = random.Random(0)
    words = ["apples", "costs", "each", "how", "many", "dollars", "Natalia", "sold", "clips", "friends", "May"]
    out = []
    for i in range(n):
        q = " ".join(rng.choice(words) for _ in range(60)) + f" {rng.randint(1, 999)}?"
        out.append({"question": q, "answer": f"step by step ... #### {rng.randint(1, 9999)}", "id": i,
                    "tags": ["gsm8k", "train"], "meta": {"level": rng.randint(1, 5)}})
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def plain_jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in io.StringIO(text) if line.strip()]


def datasets_csv(path: Path) -> list[dict]:
    import datasets

    header = next(csv.reader(io.StringIO(path.read_text())))
    features = datasets.Features({name: datasets.Value("string") for name in header})
    with tempfile.TemporaryDirectory() as cache:
        datasets.disable_progress_bars()
        return datasets.load_dataset("csv", data_files=str(path), split="train", cache_dir=cache,
                                     keep_in_memory=True, features=features).to_list()


def main() -> None:
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.data import load_rows
    from sailrl.runtime.data.readers import json_rows
    from sailrl.runtime.data.sources import CsvSource
    from sailrl.spec.schema import Spec

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    data = rows(n)
    tmp = Path(tempfile.mkdtemp())
    jsonl = tmp / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in data))
    csv_path = tmp / "rows.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question", "answer"])
        w.writerows([r["question"], r["answer"]] for r in data)
    text = jsonl.read_text()
    spec = Spec.model_validate({
        "name": "bench", "model": {"name": "sailrl/tiny", "renderer": "role_colon"},
        "dataset": {"source": "rows.jsonl", "fields": ["question", "answer"]},
        "prompt": {"user": "{{ question }}"},
        "reward": {"rules": [{"name": "c", "kind": "answer", "extract": {"from": "last_number"},
                              "reference": {"extract": {"from": "after_marker", "marker": "####"}}}]},
        "sampling": {"max_tokens": 512},
    })
    renderer = get_renderer("role_colon", get_tokenizer("sailrl/tiny"))

    def csv_rows(path: Path) -> list[dict]:
        return [row for _, _, row in CsvSource(path).scan(0, None)]

    assert json_rows(text, jsonl, lines=True) == plain_jsonl(text)
    assert csv_rows(csv_path) == datasets_csv(csv_path)
    arms = {
        "jsonl: sailrl json_rows": lambda: json_rows(text, jsonl, lines=True),
        "jsonl: json.loads per line": lambda: plain_jsonl(text),
        "csv: sailrl CsvSource": lambda: csv_rows(csv_path),
        "csv: datasets csv builder": lambda: datasets_csv(csv_path),
        "load_rows with prompt-length check": lambda: load_rows(spec, tmp, renderer=renderer),
        "load_rows without": lambda: load_rows(spec, tmp),
    }
    for fn in arms.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(reps):
        for name, fn in arms.items():
            times[name].append(timed(fn))
    print(f"{n:,} rows, {reps} repetitions ({jsonl.stat().st_size / 1e6:.1f} MB jsonl)")
    print(f"{'arm':38s} {'min s':>8s} {'median s':>9s}")
    for name, ts in times.items():
        print(f"{name:38s} {min(ts):8.3f} {statistics.median(ts):9.3f}")
    names = list(arms)
    for a, b in zip(names[::2], names[1::2], strict=True):
        r_min = min(times[a]) / min(times[b])
        r_med = statistics.median(times[a]) / statistics.median(times[b])
        print(f"{a} / {b}: ratio of mins {r_min:.2f}, of medians {r_med:.2f}")


if __name__ == "__main__":
    main()
