"""Write ``word_problems.jsonl``: GSM8K-style grade-school word problems with worked solutions.

Each row is ``{"question": ..., "answer": "<worked solution>\\n#### <number>"}``, the layout of GSM8K's
``answer`` field, so the same reward rule (the number after ``####``) scores both. The problems are two- and
three-step arithmetic and, so that a small model gets some right, one-step arithmetic, built from templates
with numbers drawn by ``random.Random(seed)``; every answer is computed, never typed, so the file is correct
and byte-for-byte reproducible::

    python spec/examples/data/make_word_problems.py                  # rewrites word_problems.jsonl next to it
    python spec/examples/data/make_word_problems.py --count 200 --out /tmp/wp.jsonl

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ["Tom", "Maria", "Aiko", "Liam", "Fatima", "Noah", "Priya", "Omar", "Chen", "Sofia", "Kwame", "Elena"]
Problem = tuple[str, str, int]


def _shopping(r: random.Random, n: str) -> Problem:
    a, b, c = r.randint(5, 30), r.randint(2, 20), r.randint(1, 5)
    return (f"{n} has {a} apples. {n} buys {b} more and then gives {c} to a friend. How many apples does {n} "
            f"have now?", f"{n} has {a} + {b} = {a + b} apples after buying. After giving {c} away, {n} has "
            f"{a + b} - {c} = {a + b - c} apples.", a + b - c)


def _boxes(r: random.Random, n: str) -> Problem:
    a, b = r.randint(6, 24), r.randint(2, 9)
    c = r.randint(1, a * b - 1)
    return (f"A box holds {a} pencils. {n} buys {b} boxes and uses {c} pencils. How many pencils are left?",
            f"{n} buys {a} * {b} = {a * b} pencils. {a * b} - {c} = {a * b - c} pencils are left.", a * b - c)


def _wages(r: random.Random, n: str) -> Problem:
    a, b, c = r.randint(8, 25), r.randint(2, 8), r.randint(2, 6)
    return (f"{n} earns ${a} an hour and works {b} hours a day for {c} days. How many dollars does {n} earn?",
            f"{n} earns {a} * {b} = {a * b} dollars a day, so {a * b} * {c} = {a * b * c} dollars in {c} days.",
            a * b * c)


def _train(r: random.Random, n: str) -> Problem:
    a, b, c = r.randint(40, 90), r.randint(2, 5), r.randint(5, 60)
    return (f"A train travels {a} km an hour for {b} hours and then {c} km more. How many km does it travel in "
            f"total?", f"In {b} hours it travels {a} * {b} = {a * b} km. In total {a * b} + {c} = {a * b + c} km.",
            a * b + c)


def _reading(r: random.Random, n: str) -> Problem:
    a = r.randint(5, 40)
    return (f"{n} reads {a} pages on Monday and twice as many pages on Tuesday. How many pages does {n} read on "
            f"the two days?", f"On Tuesday {n} reads 2 * {a} = {2 * a} pages. In total {a} + {2 * a} = {3 * a} "
            f"pages.", 3 * a)


def _class(r: random.Random, n: str) -> Problem:
    a = r.randint(20, 35)
    b, c = r.randint(5, a - 5), r.randint(2, 4)
    return (f"There are {a} students in a class and {b} of them are girls. Each boy brings {c} books. How many "
            f"books do the boys bring?", f"There are {a} - {b} = {a - b} boys. They bring {a - b} * {c} = "
            f"{(a - b) * c} books.", (a - b) * c)


def _bakery(r: random.Random, n: str) -> Problem:
    a, b = r.randint(3, 12), r.randint(4, 10)
    c = r.randint(1, a * b - 1)
    return (f"A baker makes {a} cakes and cuts each cake into {b} slices. {c} slices are sold. How many slices "
            f"are left?", f"There are {a} * {b} = {a * b} slices. {a * b} - {c} = {a * b - c} slices are left.",
            a * b - c)


def _savings(r: random.Random, n: str) -> Problem:
    a, b = r.randint(5, 20), r.randint(3, 12)
    return (f"{n} saves ${a} every week. How many weeks does {n} need to save ${a * b}?",
            f"{a * b} / {a} = {b} weeks.", b)


def _sharing(r: random.Random, n: str) -> Problem:
    b, q = r.randint(2, 8), r.randint(3, 12)
    e = r.randint(1, 9)
    a = b * q + e
    return (f"{n} has {a} stickers, keeps {e} and shares the rest equally among {b} friends. How many stickers "
            f"does each friend get?", f"{n} shares {a} - {e} = {a - e} stickers. Each friend gets {a - e} / {b} = "
            f"{q} stickers.", q)


def _garden(r: random.Random, n: str) -> Problem:
    a, b, c = r.randint(3, 9), r.randint(4, 12), r.randint(2, 15)
    return (f"A garden has {a} rows of {b} tomato plants and {c} pepper plants. How many plants are in the "
            f"garden?", f"There are {a} * {b} = {a * b} tomato plants, so {a * b} + {c} = {a * b + c} plants.",
            a * b + c)


def _marbles(r: random.Random, n: str) -> Problem:
    a, b = r.randint(3, 40), r.randint(2, 30)
    return (f"{n} has {a} marbles and finds {b} more. How many marbles does {n} have?",
            f"{a} + {b} = {a + b} marbles.", a + b)


def _cookies(r: random.Random, n: str) -> Problem:
    a = r.randint(10, 60)
    b = r.randint(1, a - 1)
    return (f"There are {a} cookies in a jar. {n} eats {b} of them. How many cookies are left in the jar?",
            f"{a} - {b} = {a - b} cookies are left.", a - b)


def _packs(r: random.Random, n: str) -> Problem:
    a, b = r.randint(2, 12), r.randint(2, 12)
    return (f"{n} buys {a} packs of cards with {b} cards in each pack. How many cards does {n} buy?",
            f"{a} * {b} = {a * b} cards.", a * b)


def _teams(r: random.Random, n: str) -> Problem:
    b, q = r.randint(2, 9), r.randint(2, 9)
    return (f"{b * q} children are split into {b} equal teams. How many children are in each team?",
            f"{b * q} / {b} = {q} children.", q)


#: Two- and three-step problems (GSM8K's kind), then one-step ones, so a small model gets some right.
TEMPLATES: list[Callable[[random.Random, str], Problem]] = [
    _shopping, _boxes, _wages, _train, _reading, _class, _bakery, _savings, _sharing, _garden,
    _marbles, _cookies, _packs, _teams]


def make_rows(count: int = 84, seed: int = 0) -> list[dict[str, str]]:
    """``count`` rows ``{"question", "answer"}``, templates in turn, numbers from ``random.Random(seed)``."""
    if count < 1:
        raise ValueError("count must be >= 1")
    r = random.Random(seed)
    rows = []
    for i in range(count):
        question, solution, value = TEMPLATES[i % len(TEMPLATES)](r, r.choice(NAMES))
        rows.append({"question": question, "answer": f"{solution}\n#### {value}"})
    r.shuffle(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=84)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("word_problems.jsonl"))
    args = parser.parse_args(argv)
    rows = make_rows(args.count, args.seed)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8", newline="\n")
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
