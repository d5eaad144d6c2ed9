"""Write the DPO example's preference pairs: ``addition_pairs.jsonl``, from the quickstart's sums.

Each row is ``{"question": "3+4", "chosen": "7", "rejected": "6"}``: the chosen completion is the right sum, the
rejected one a wrong sum near it (every value within ``--spread`` of the right one, at least 0, except the right
one itself), so each sum gives 2 to 2 x spread pairs. Rows are in an order shuffled with a fixed seed, so the file
is byte-for-byte reproducible::

    python spec/examples/data/make_addition_pairs.py             # rewrites addition_pairs.jsonl next to this script
    python spec/examples/data/make_addition_pairs.py --spread 1 --out /tmp/pairs.jsonl

Standard library only; the sums are ``make_addition.make_rows`` (every pair of single-digit operands).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_addition import make_rows, write_jsonl  # noqa: E402 -- the script next to this one


def make_pairs(spread: int = 2, seed: int = 0, max_operand: int = 9) -> list[dict[str, str]]:
    """For every sum of ``make_rows(max_operand)``, one row per wrong value v with ``0 <= v``,
    ``0 < |v - sum| <= spread``: ``{"question", "chosen": the sum, "rejected": v}``, shuffled by
    ``random.Random(seed)``."""
    if spread < 1:
        raise ValueError("spread must be >= 1")
    rows = []
    for row in make_rows(max_operand, seed):
        answer = int(row["answer"])
        for wrong in range(max(0, answer - spread), answer + spread + 1):
            if wrong != answer:
                rows.append({"question": row["question"], "chosen": row["answer"], "rejected": str(wrong)})
    random.Random(seed).shuffle(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=int, default=2, help="largest distance of a rejected sum (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row order (default 0)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("addition_pairs.jsonl"))
    args = parser.parse_args(argv)
    rows = make_pairs(args.spread, args.seed)
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
