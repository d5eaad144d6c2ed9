"""Write the quickstart's addition data: ``addition.jsonl``, one row per pair of operands.

Each row is ``{"question": "3+4", "answer": "7"}``. With the defaults every ordered pair of single-digit
operands (0..9 x 0..9, 100 rows) appears once, in an order shuffled with a fixed seed, so the file is
byte-for-byte reproducible::

    python spec/examples/data/make_addition.py                      # rewrites addition.jsonl next to this script
    python spec/examples/data/make_addition.py --max-operand 19 --out /tmp/add19.jsonl

Standard library only; the script is deterministic for given arguments (``random.Random(seed)``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def make_rows(max_operand: int = 9, seed: int = 0) -> list[dict[str, str]]:
    """Every pair (a, b) with 0 <= a, b <= max_operand as {"question": "a+b", "answer": "a+b's value"}.

    Returns (max_operand + 1) ** 2 rows in an order shuffled by ``random.Random(seed)``.
    """
    if max_operand < 0:
        raise ValueError("max_operand must be >= 0")
    rows = [
        {"question": f"{a}+{b}", "answer": str(a + b)}
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    random.Random(seed).shuffle(rows)
    return rows


def write_jsonl(rows: list[dict[str, str]], path: Path) -> None:
    """Write ``rows`` as JSON Lines (one compact object per line, "\\n" line endings, UTF-8)."""
    text = "".join(json.dumps(row, separators=(", ", ": ")) + "\n" for row in rows)
    path.write_text(text, encoding="utf-8", newline="\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-operand", type=int, default=9, help="largest operand (default 9: single digits)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row order (default 0)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("addition.jsonl"))
    args = parser.parse_args(argv)
    rows = make_rows(args.max_operand, args.seed)
    write_jsonl(rows, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
