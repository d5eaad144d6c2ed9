"""The package's shape in numbers: modules and lines per folder, the largest classes and modules, functions over
80 lines, loose runtime modules, function-level imports, module cycles, the ``Run`` class, and tokenizer classes
the tests define more than once.

    python benchmarks/measure_architecture.py [ROOT]

ROOT (default: this checkout) is any sailrl tree, e.g. an older commit checked out with ``git worktree add``, so two
trees compare with the same script. Counted: every ``.py`` under ``spec/``, ``compiler/``, ``runtime/`` and
``sailrl/`` but ``spec/examples/`` (as ``tests/test_architecture.py`` counts them); tests under ``tests/``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

DIRS = {"sailrl": "sailrl", "spec": "sailrl.spec", "compiler": "sailrl.compiler", "runtime": "sailrl.runtime"}
SKIP = ("spec/examples/",)
HEAVY = frozenset({"torch", "transformers", "peft", "datasets", "tinker", "tinker_cookbook", "sail", "matplotlib",
                   "wandb", "math_verify", "rich", "jinja2", "uvicorn", "starlette", "numpy", "safetensors"})
LONG_FUNCTION = 80
BIG_CLASS = 250
TOP = 5


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's ``__init__``) for every module of the package under ``root``."""
    out = {}
    for d, pkg in DIRS.items():
        for p in sorted((root / d).rglob("*.py")):
            if p.relative_to(root).as_posix().startswith(SKIP):
                continue
            parts = [x for x in p.relative_to(root / d).with_suffix("").parts if x != "__init__"]
            out[".".join([pkg, *parts])] = (p, p.name == "__init__.py")
    return out


def span(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def base_of(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module if is_package else module.rsplit(".", 1)[0]
    for _ in range(level - 1):
        base = base.rsplit(".", 1)[0]
    return base + ("." + name if name else "")


def folders(root: Path, mods: dict[str, tuple[Path, bool]]) -> None:
    count: dict[str, int] = defaultdict(int)
    lines: dict[str, int] = defaultdict(int)
    for path, _ in mods.values():
        folder = path.parent.relative_to(root).as_posix() + "/"
        count[folder] += 1
        lines[folder] += len(path.read_text(encoding="utf-8").splitlines())
    total = sum(lines.values())
    print(f"modules: {len(mods)} in {len(count)} folders, {total:,} lines")
    print(f"  {'folder':38s} {'modules':>7s} {'lines':>7s}")
    for folder in sorted(count):
        print(f"  {folder:38s} {count[folder]:7d} {lines[folder]:7,d}")
    loose = sorted(p.name for p, _ in mods.values() if p.parent == root / "runtime" and p.name != "__init__.py")
    print(f"loose runtime modules (runtime/*.py but __init__): {len(loose)}: {' '.join(loose)}")


def sizes(root: Path, mods: dict[str, tuple[Path, bool]]) -> None:
    classes, functions, files = [], [], []
    for path, _ in mods.values():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        files.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                classes.append((span(node), f"{rel}::{node.name}"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((span(node), f"{rel}::{node.name}"))
    classes.sort(reverse=True)
    files.sort(reverse=True)
    long = sorted((f for f in functions if f[0] > LONG_FUNCTION), reverse=True)
    print("largest classes:", ", ".join(f"{name} {n}" for n, name in classes[:TOP]))
    print(f"classes over {BIG_CLASS} lines: {sum(n > BIG_CLASS for n, _ in classes)}; "
          f"over 300: {sum(n > 300 for n, _ in classes)}")
    print("largest modules:", ", ".join(f"{name} {n}" for n, name in files[:TOP]))
    print(f"functions over {LONG_FUNCTION} lines: {len(long)} of {len(functions)}")
    for n, name in long:
        print(f"  {n:4d} {name}")


def imports_and_cycles(mods: dict[str, tuple[Path, bool]]) -> None:
    fn_project = fn_heavy = tagged = files_dup = 0
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (p, ispkg) in mods.items():
        src = p.read_text(encoding="utf-8")
        tree = ast.parse(src)
        lines = src.splitlines()
        per_target: dict[str, set[str]] = {}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level:
                    names = [base_of(m, ispkg, node.level, node.module)]
                above = lines[node.lineno - 2] if node.lineno >= 2 else ""
                is_lazy = "# lazy:" in lines[node.lineno - 1] or above.strip().startswith("# lazy:")
                for n in names:
                    if n.startswith("sailrl"):
                        fn_project += 1
                        tagged += is_lazy
                        per_target.setdefault(n, set()).add(fn.name)
                    elif n.split(".")[0] in HEAVY:
                        fn_heavy += 1
                        tagged += is_lazy
        files_dup += any(len(v) > 1 for v in per_target.values())
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.body:
                    skip.update(range(child.lineno, child.end_lineno + 1))
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = base_of(m, ispkg, node.level, node.module) if node.level else node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            graph[m].update(t for t in targets if t in mods and t != m)
    sccs = strongly_connected(graph)
    print(f"function-level imports: project modules {fn_project}, heavy libraries {fn_heavy}, "
          f"tagged '# lazy:' {tagged}")
    print(f"files importing one project module in several functions: {files_dup}")
    print(f"module cycles (strongly connected components; TYPE_CHECKING imports left out): {len(sccs)}")
    for s in sccs:
        print("  ", " <-> ".join(s))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def run_class(root: Path) -> None:
    run = root / "runtime/run.py"
    text = run.read_text(encoding="utf-8")
    for n in ast.parse(text).body:
        if isinstance(n, ast.ClassDef) and n.name == "Run":
            meths = [b for b in n.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
            print(f"Run: {span(n)} lines, {len(meths)} methods; run.py {len(text.splitlines())} lines")
        if isinstance(n, ast.AsyncFunctionDef) and n.name == "open_run":
            print(f"open_run: {span(n)} lines")


def test_tokenizers(root: Path) -> None:
    """Tokenizer classes the tests define (``class *Tokenizer``), and the names defined in more than one file."""
    where: dict[str, list[str]] = defaultdict(list)
    per_folder: dict[str, int] = defaultdict(int)
    for p in sorted((root / "tests").rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if p.name.startswith("test_"):
            per_folder[p.parent.relative_to(root).as_posix() + "/"] += 1
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Tokenizer"):
                where[node.name].append(rel)
    total = sum(len(v) for v in where.values())
    dup = {k: v for k, v in where.items() if len(v) > 1}
    print(f"tokenizer classes defined in tests: {total}; names defined in more than one file: "
          + (", ".join(f"{k} x{len(v)} ({' '.join(v)})" for k, v in sorted(dup.items())) or "none"))
    print("test files per folder:", ", ".join(f"{k} {v}" for k, v in sorted(per_folder.items())))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the sailrl tree to measure (default: this checkout)")
    root = parser.parse_args(argv).root
    mods = modules(root)
    folders(root, mods)
    sizes(root, mods)
    imports_and_cycles(mods)
    run_class(root)
    test_tokenizers(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
