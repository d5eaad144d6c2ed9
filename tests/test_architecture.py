"""The stages import one way: every import of every module (those inside functions included) is checked.

Layers, lowest first (docs/architecture.md):

- ``sailrl`` (``sailrl/__init__.py``): the version; imports nothing of sailrl.
- the spec language ``sailrl.spec`` (``spec/``): imports only ``sailrl`` and itself.
- the runtime ``sailrl.runtime`` (``runtime/``): imports only ``sailrl``, the spec and itself. Its self-contained
  pieces (``SELF_CONTAINED``: prompts, reward rules, answers), which the validation stage uses, import only
  ``sailrl``, the spec and each other.
- rendering (``sailrl.compiler.render``, ``sailrl.compiler.docgen``): imports only ``sailrl`` and the spec.
- the validation stage (``VALIDATION``): imports ``sailrl``, the spec, itself and the runtime's self-contained
  pieces.
- the top (``sailrl.cli``, ``sailrl.__main__``, ``sailrl.launch``, ``sailrl.commands.*``, ``sailrl.export.*``,
  ``sailrl.studio.*``): anything, except that a
  command imports no other command (shared helpers live in ``sailrl.commands._common``).

``importlib.import_module("sailrl....")`` with a literal name counts as an import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Folder -> the package it is mapped to (pyproject.toml package-dir).
FOLDERS = {"spec": "sailrl.spec", "compiler": "sailrl.compiler", "runtime": "sailrl.runtime", "sailrl": "sailrl"}
SKIP = ("spec/examples",)  # example specs and the script that makes their data: not part of the package

# Prompts, the reward rule engine (rules, answers, python rules and the worker processes they run in), and the
# cost arithmetic with the data order it replays (pure functions of the spec).
SELF_CONTAINED = frozenset({"sailrl.runtime.prompts", "sailrl.runtime.rewards", "sailrl.runtime.answers",
                            "sailrl.runtime.python_rules", "sailrl.runtime.workers", "sailrl.runtime.cost",
                            "sailrl.runtime.judge", "sailrl.runtime.data.order", "sailrl.runtime.data.base",
                            "sailrl.runtime.data.readers", "sailrl.runtime.data.sources",
                            "sailrl.runtime.tools", "sailrl.runtime.calculator"})
RENDERING = frozenset({"sailrl.compiler.render", "sailrl.compiler.docgen"})
VALIDATION = frozenset({"sailrl.compiler", "sailrl.compiler.validate", "sailrl.compiler.checks",
                        "sailrl.compiler.reward_checks", "sailrl.compiler.cost_checks",
                        "sailrl.compiler.episode_checks"})
TOP = frozenset({"sailrl.cli", "sailrl.__main__", "sailrl.launch"})
TOP_PACKAGES = ("sailrl.commands", "sailrl.export", "sailrl.studio")

ALLOWED = {
    "sailrl": {"sailrl"},
    "spec": {"sailrl", "spec"},
    "runtime": {"sailrl", "spec", "runtime", "self-contained"},
    "self-contained": {"sailrl", "spec", "self-contained"},
    "rendering": {"sailrl", "spec"},
    "validation": {"sailrl", "spec", "validation", "self-contained"},
}
RULES = {
    "sailrl": "the sailrl package root holds only the version: it imports nothing of sailrl",
    "spec": "the spec language imports nothing above it (only sailrl and sailrl.spec)",
    "runtime": "the runtime imports only sailrl, the spec and the runtime",
    "self-contained": "a self-contained runtime piece (prompts, rewards, answers, python_rules, workers, cost, "
                      "data.order, data.base, tools, calculator) "
                      "imports only sailrl, the spec and the other self-contained pieces",
    "rendering": "rendering imports only sailrl and the spec",
    "validation": "the validation stage imports only sailrl, the spec, itself and the runtime's self-contained "
                  "pieces (prompts, rewards, answers, python_rules, workers, cost, data.order, data.base, tools, "
                  "calculator)",
}


def module_name(path: Path, root: Path) -> str | None:
    """The dotted module a file under ``root`` is installed as, or None when it is not part of the package."""
    rel = path.relative_to(root)
    if rel.parts[0] not in FOLDERS or any(rel.as_posix().startswith(s + "/") for s in SKIP):
        return None
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    """The layer of a sailrl module: a key of ALLOWED, "top", or "unassigned"."""
    if module == "sailrl":
        return "sailrl"
    if module in TOP or module.startswith(TOP_PACKAGES):
        return "top"
    if module == "sailrl.spec" or module.startswith("sailrl.spec."):
        return "spec"
    if module in SELF_CONTAINED:
        return "self-contained"
    if module == "sailrl.runtime" or module.startswith("sailrl.runtime."):
        return "runtime"
    if module in RENDERING:
        return "rendering"
    if module in VALIDATION:
        return "validation"
    return "unassigned"


def imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported sailrl module) for every import in ``tree``, at any depth (functions included)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((node.lineno, full if full in known else base))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) and isinstance(
                    node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    found = [(line, target) for line, target in out if target == "sailrl" or target.startswith("sailrl.")]
    return list(dict.fromkeys(found))


def _commands_rule(module: str, target: str) -> str | None:
    if module.startswith("sailrl.commands.") and target.startswith("sailrl.commands.") and target != module:
        if target != "sailrl.commands._common":
            return "a command imports no other command; shared helpers live in sailrl.commands._common"
    return None


def wrong_way_edges(root: Path = ROOT) -> list[str]:
    """One line per import that breaks a layer rule: ``path:line: module imports target: rule``."""
    files = sorted(p for folder in FOLDERS for p in (root / folder).rglob("*.py"))
    modules = {m: p for p in files if (m := module_name(p, root)) is not None}
    known = set(modules)
    problems = []
    for module, path in modules.items():
        where = path.relative_to(root).as_posix()
        own = layer(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=where)
        if own == "unassigned":
            problems.append(f"{where}:1: {module} belongs to no stage: add it to a layer in tests/test_architecture.py "
                            "and docs/architecture.md")
            continue
        for line, target in imports(tree, module, path.name == "__init__.py", known):
            if own == "top":
                rule = _commands_rule(module, target)
            else:
                rule = None if layer(target) in ALLOWED[own] else RULES[own]
            if rule:
                problems.append(f"{where}:{line}: {module} imports {target} ({layer(target)}): {rule}")
    return problems


def test_every_import_points_down_the_stages():
    problems = wrong_way_edges()
    assert not problems, "imports that point the wrong way:\n" + "\n".join(problems)


def test_the_walker_sees_imports_inside_functions_and_import_module(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "__init__.py").write_text("")
    (tmp_path / "spec" / "loader.py").write_text(
        "import yaml\n"
        "from sailrl.spec.errors import SpecError\n"
        "def load():\n"
        "    from sailrl.compiler.checks import check_spec\n"
        "    import importlib\n"
        "    return importlib.import_module('sailrl.runtime.data')\n"
    )
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "prompts.py").write_text("from . import data\nfrom .data import rows\n")
    (tmp_path / "runtime" / "data.py").write_text("")
    (tmp_path / "compiler").mkdir()
    (tmp_path / "compiler" / "surprise.py").write_text("")
    (tmp_path / "sailrl" / "commands").mkdir(parents=True)
    (tmp_path / "sailrl" / "commands" / "explain.py").write_text(
        "from sailrl.commands.rewards import load_spec_lenient\nfrom sailrl.commands._common import use_color\n")
    assert wrong_way_edges(tmp_path) == [
        "compiler/surprise.py:1: sailrl.compiler.surprise belongs to no stage: add it to a layer in "
        "tests/test_architecture.py and docs/architecture.md",
        "runtime/prompts.py:1: sailrl.runtime.prompts imports sailrl.runtime.data (runtime): " + RULES["self-contained"],
        "runtime/prompts.py:2: sailrl.runtime.prompts imports sailrl.runtime.data (runtime): " + RULES["self-contained"],
        "sailrl/commands/explain.py:1: sailrl.commands.explain imports sailrl.commands.rewards (top): a command "
        "imports no other command; shared helpers live in sailrl.commands._common",
        "spec/loader.py:4: sailrl.spec.loader imports sailrl.compiler.checks (validation): " + RULES["spec"],
        "spec/loader.py:6: sailrl.spec.loader imports sailrl.runtime.data (runtime): " + RULES["spec"],
    ]


def test_the_folders_are_the_packages_pyproject_maps():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir = config["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dir.items():
        top = folder.split("/")[0]
        assert FOLDERS[top] == ".".join(package.split(".")[: 1 + (top != "sailrl")]), package
        assert module_name(ROOT / folder / "__init__.py", ROOT) == package
