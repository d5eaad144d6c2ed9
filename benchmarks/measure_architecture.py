"""Counts for issue 23: function-level imports of project modules / heavy libraries, module cycles, Run size."""

import ast
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
DIRS = {"sailrl": "sailrl", "spec": "sailrl.spec", "compiler": "sailrl.compiler", "runtime": "sailrl.runtime"}
HEAVY = {
    "torch",
    "transformers",
    "peft",
    "datasets",
    "tinker",
    "tinker_cookbook",
    "sail",
    "matplotlib",
    "wandb",
    "math_verify",
    "rich",
    "jinja2",
    "uvicorn",
    "starlette",
    "numpy",
    "safetensors",
}
mods = {}
for d, pkg in DIRS.items():
    for p in (ROOT / d).rglob("*.py"):
        rel = p.relative_to(ROOT / d).with_suffix("")
        parts = [x for x in rel.parts if x != "__init__"]
        name = ".".join([pkg, *parts]) if parts else pkg
        mods[name] = (p, p.name == "__init__.py")
fn_project = fn_heavy = 0
tagged = 0
files_dup = 0
graph = {m: set() for m in mods}
for m, (p, ispkg) in mods.items():
    src = p.read_text()
    tree = ast.parse(src)
    lines = src.splitlines()
    per_fn_targets = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = m if ispkg else m.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        base = base.rsplit(".", 1)[0]
                    names = [base + ("." + node.module if node.module else "")]
                for n in names:
                    above = lines[node.lineno - 2] if node.lineno >= 2 else ""
                    is_lazy = "# lazy:" in lines[node.lineno - 1] or above.strip().startswith("# lazy:")
                    if n.startswith("sailrl"):
                        fn_project += 1
                        tagged += is_lazy
                        per_fn_targets.setdefault(n, set()).add(fn.name)
                    elif n.split(".")[0] in HEAVY:
                        fn_heavy += 1
                        tagged += is_lazy
    if any(len(v) > 1 for v in per_fn_targets.values()):
        files_dup += 1
    tc = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for ch in node.body:
                tc.update(range(ch.lineno, ch.end_lineno + 1))
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in tc:
            continue
        if isinstance(node, ast.Import):
            ts = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = m if ispkg else m.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                mod = base + ("." + node.module if node.module else "")
            else:
                mod = node.module or ""
            ts = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in ts:
            if t in mods and t != m:
                graph[m].add(t)
# strongly connected components (Tarjan)
idx = {}
low = {}
st = []
on = set()
sccs = []
c = [0]
sys.setrecursionlimit(10000)


def sc(v):
    idx[v] = low[v] = c[0]
    c[0] += 1
    st.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in idx:
            sc(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


for v in graph:
    if v not in idx:
        sc(v)
print(f"function-level imports: project modules {fn_project}, heavy libraries {fn_heavy}, tagged '# lazy:' {tagged}")
print(f"files importing one project module in several functions: {files_dup}")
print(f"module cycles (strongly connected components; TYPE_CHECKING imports left out): {len(sccs)}")
for s in sccs:
    print("  ", " <-> ".join(s))
run = ROOT / "runtime/run.py"
tree = ast.parse(run.read_text())
for n in tree.body:
    if isinstance(n, ast.ClassDef) and n.name == "Run":
        meths = [b for b in n.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
        run_lines = len(run.read_text().splitlines())
        print(f"Run: {n.end_lineno - n.lineno + 1} lines, {len(meths)} methods; run.py {run_lines} lines")
    if isinstance(n, ast.AsyncFunctionDef) and n.name == "open_run":
        print(f"open_run: {n.end_lineno - n.lineno + 1} lines")
big = []
for m, (p, _) in mods.items():
    for n in ast.walk(ast.parse(p.read_text())):
        if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > 250:
            big.append(f"{m}.{n.name} {n.end_lineno - n.lineno + 1}")
print("classes over 250 lines:", ", ".join(big) or "none")
