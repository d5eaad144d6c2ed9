"""Keystroke-to-verdict latency of ``sailrl studio``'s try API, for the built-in rules.

Run:  python benchmarks/bench_studio.py [--keystrokes 300] [--warmup 30] [--cli 6] [--browser]

For each example spec (quickstart: answer whole/numeric + all_of match/termination; gsm8k and sail_guide:
boxed answers against ``####`` references, has_answer + termination, normalized and numeric compares), a
completion is typed one character at a time (a worked GSM8K-style answer ending in ``\\boxed{N}``, ~300
characters), and each keystroke sends what the page sends: ``POST /api/try`` with the full spec text, the
completion so far and the row's fields. The server is ``sailrl studio`` itself, started as a subprocess (the
page's browser is another process too), reached over loopback HTTP with the session cookie.

Arms, interleaved keystroke by keystroke with the same warm-up (``--warmup`` keystrokes of each, not counted):

* ``studio``: the HTTP round trip, from sending the request to having the parsed verdicts (what the page waits
  for before it redraws the table; the browser's redraw of a 3-row table is not included);
* ``in-process``: ``RewardFunction.trace`` on the same completion in this process (the floor: what scoring
  alone costs, without HTTP, JSON or the spec-text cache lookup);
* ``browser`` (with ``--browser``, quickstart only): the page itself in Debian's Chromium: the time from setting
  the completion box and firing its ``input`` event to the verdict table showing that text's verdicts
  (``#verdicts[data-chars]``), i.e. the request, the JSON and the redraw; keystrokes sent one after another;
* ``cli``: what a user does without the studio, ``sailrl rewards SPEC --completion TEXT --field ... --json``
  (a new process per try), on every ``keystrokes / --cli``-th keystroke.

Prints p50 / p95 / max per spec and arm, the ratio of the p95s, and ``uptime`` (the machine's load).
Target (issue 19): p95 <= 150 ms for the studio arm on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ["spec/examples/quickstart.yaml", "spec/examples/gsm8k.yaml", "spec/examples/sail_guide.yaml"]
COMPLETION = ("Natalia sold 48 clips in April. In May she sold half as many, so 48 / 2 = 24 clips. "
              "Altogether she sold 48 + 24 = 72 clips in April and May. Let me double-check: 24 is half "
              "of 48, and 48 + 24 is 72, so the total number of clips is seventy-two. "
              "The answer is \\boxed{72}.")
FIELDS = {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                      "May. How many clips did Natalia sell altogether in April and May?",
          "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"}


def start(spec: str) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "sailrl", "studio", spec], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=(\S+)", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the studio did not start: {line!r} {proc.stderr.read()}")
    return proc, found.group(1), found.group(2)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def cli_try(spec: str, typed: str) -> None:
    argv = [sys.executable, "-m", "sailrl", "rewards", spec, "--completion", typed, "--json"]
    for k, v in FIELDS.items():
        argv += ["--field", f"{k}={v}"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode in (0, 1) and done.stdout.startswith("{"), done.stderr  # 1: a reference problem


def bench(spec: str, keystrokes: int, warmup: int, cli: int) -> dict[str, list[float]]:
    text = (ROOT / spec).read_text()
    loaded = load_spec(ROOT / spec).spec
    fn = RewardFunction.from_spec(loaded.reward, loaded.prompt.reference_field, (ROOT / spec).parent)
    proc, base, token = start(spec)
    times: dict[str, list[float]] = {"studio": [], "in-process": [], "cli": []}
    every = max(1, keystrokes // cli) if cli else 0
    try:
        with httpx.Client(base_url=base, headers={"X-Studio-Token": token}, timeout=30) as client:
            for i in range(warmup + keystrokes):
                typed = COMPLETION[: (i % len(COMPLETION)) + 1]
                t0 = time.perf_counter()
                r = client.post("/api/try", json={"text": text, "completion": typed, "fields": FIELDS,
                                                  "truncated": False, "num_tokens": None})
                verdict = r.json()
                t1 = time.perf_counter()
                assert verdict["ok"], verdict
                fn.trace(typed, FIELDS)
                t2 = time.perf_counter()
                if i >= warmup:
                    times["studio"].append((t1 - t0) * 1000)
                    times["in-process"].append((t2 - t1) * 1000)
                    if every and (i - warmup) % every == 0:
                        t3 = time.perf_counter()
                        cli_try(spec, typed)
                        times["cli"].append((time.perf_counter() - t3) * 1000)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return times


BROWSER_LOOP = """async ([text, n, warm]) => {
    const box = document.querySelector('#completion'), table = document.querySelector('#verdicts');
    const out = [];
    for (let i = 0; i < warm + n; i++) {
        const typed = text.slice(0, (i % text.length) + 1);
        const t0 = performance.now();
        box.value = typed;
        box.dispatchEvent(new Event('input'));
        while (table.dataset.chars !== String(typed.length)) await new Promise((r) => requestAnimationFrame(r));
        if (i >= warm) out.push(performance.now() - t0);
    }
    return out; }"""


def bench_browser(spec: str, keystrokes: int, warmup: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    proc, base, token = start(spec)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            page = browser.new_context().new_page()  # the page under its own CSP, as a user gets it
            page.goto(f"{base}/?token={token}")
            page.wait_for_selector("#verdicts tbody tr")
            times = page.evaluate(BROWSER_LOOP, [COMPLETION, keystrokes, warmup])
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keystrokes", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--cli", type=int, default=6, help="how many keystrokes also run `sailrl rewards` (0: none)")
    ap.add_argument("--browser", action="store_true", help="also time the page in Chromium (quickstart)")
    args = ap.parse_args()
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"cores: {os.cpu_count()}; {args.keystrokes} keystrokes per spec after {args.warmup} of warm-up")
    print(f"{'spec':<32} {'arm':<11} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for spec in SPECS:
        times = bench(spec, args.keystrokes, args.warmup, args.cli)
        for arm, values in times.items():
            if not values:
                continue
            print(f"{spec:<32} {arm:<11} {statistics.median(values):8.2f} {pct(values, 0.95):8.2f} "
                  f"{max(values):8.2f}")
        line = f"studio p95 / in-process p95 = {pct(times['studio'], .95) / pct(times['in-process'], .95):.0f}x"
        if times["cli"]:
            ratio = statistics.median(times["cli"]) / statistics.median(times["studio"])
            line += f"; cli median / studio median = {ratio:.0f}x"
        print(f"{'':<32} {line}")
    if args.browser:
        values = bench_browser(SPECS[0], args.keystrokes, args.warmup)
        print(f"{SPECS[0]:<32} {'browser':<11} {statistics.median(values):8.2f} {pct(values, 0.95):8.2f} "
              f"{max(values):8.2f}")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
