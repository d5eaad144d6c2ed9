"""Support for generated training scripts: command-line flags, spec assembly, and a clean exit on user errors.

A generated script calls :func:`parse_args`, :func:`build_spec` and :func:`run` so that its own text stays the
config block plus the loop. Flags every script takes:

- ``--resume``: continue the run in the spec's run directory from its last saved state.
- ``--overwrite``: start over in a run directory that already holds a run.
- ``--set KEY=VALUE`` (repeatable): override one spec value by its dotted key, e.g. ``--set training.steps=2``
  ``--set sampling.sampler=local``. VALUE is read as YAML. The run's config.json records the overrides.
- ``--sampler {sail,tinker,local}``: shorthand for ``--set sampling.sampler=...``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import yaml


def parse_args(argv: list[str] | None, doc: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--resume", action="store_true", help="continue from the run directory's last saved state")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a run directory that already holds a run (its records are cleared)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec value by dotted key (VALUE is YAML), e.g. training.steps=2")
    parser.add_argument("--sampler", choices=("sail", "tinker", "local"),
                        help="shorthand for --set sampling.sampler=...")
    args = parser.parse_args(argv)
    if args.sampler:
        args.overrides.append(f"sampling.sampler={args.sampler}")
    return args


def _override_value(raw: str) -> Any:
    """VALUE of ``--set KEY=VALUE``: YAML, except that a Jinja template (``{{ ... }}``) stays text."""
    text = raw.strip()
    if not text:
        return None
    if text.startswith(("{{", "{%", "{#")):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"VALUE {raw!r} is not valid YAML ({problem}); quote it, e.g. --set \"key='...'\"") from None


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``config`` with each ``dotted.key=yaml`` override applied.

    A number in the key indexes a list (``reward.rules.0.weight=1``). Changing ``model.name`` without also setting
    ``model.renderer`` clears the renderer, so the new model's default renderer is used. Raises ``ValueError``
    (plain words) on a malformed override.
    """
    out = copy.deepcopy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        value = _override_value(raw)
        node: Any = out
        parts = key.split(".")
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise ValueError(f"--set {key}: {'.'.join(parts[:i])} is a list of {len(node)}; "
                                     f"use an index 0..{len(node) - 1}")
                if last:
                    node[int(p)] = value
                else:
                    node = node[int(p)]
            elif isinstance(node, dict):
                if last:
                    node[p] = value
                else:
                    if node.get(p) is None:
                        node[p] = {}
                    node = node[p]
            else:
                raise ValueError(f"--set {key}: {where.rsplit('.', 1)[0]} is a value, not a section")
    keys = {o.partition("=")[0] for o in overrides}
    if "model.name" in keys and "model.renderer" not in keys and isinstance(out.get("model"), dict):
        out["model"]["renderer"] = None  # the new model's default renderer, not the old model's
    return out


def build_spec(config: dict[str, Any], overrides: list[str], spec_dir: Any = None):
    """Validate the script's config (plus overrides) into a :class:`~sailrl.spec.schema.Spec`.

    With overrides, the result goes through every check ``sailrl validate`` makes (located in a YAML rendering
    of the overridden spec); a problem prints plain words and exits with status 2.
    """
    from pathlib import Path

    from sailrl.spec.schema import Spec

    if not overrides:
        return Spec.model_validate(config)
    from sailrl.spec.errors import SpecErrors
    from sailrl.spec.loader import load_spec_text

    try:
        merged = apply_overrides(config, overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    text = yaml.safe_dump(merged, sort_keys=False, allow_unicode=True)
    where = Path(spec_dir).resolve() / "spec-with-overrides.yaml" if spec_dir is not None else None
    try:
        return load_spec_text(text, filename="<spec with --set overrides>", path=where).spec
    except SpecErrors as exc:
        print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        print("(these come from the --set overrides: " + " ".join(overrides) + ")", file=sys.stderr)
        raise SystemExit(2) from None


def resume_command(argv: list[str] | None = None) -> str:
    """The command that resumes this run: the same script and overrides, ``--resume`` instead of ``--overwrite``."""
    import os
    import shlex

    if argv is None and os.environ.get("SAILRL_RESUME_COMMAND"):  # set by `sailrl run`
        return os.environ["SAILRL_RESUME_COMMAND"]
    argv = list(sys.argv if argv is None else argv)
    args = [a for a in argv[1:] if a not in ("--resume", "--overwrite")]
    return shlex.join(["python", argv[0], *args, "--resume"])


def run(main: Callable[..., Awaitable[Any]], **kwargs: Any) -> int:
    """Run ``main`` under asyncio; user-facing faults become one message and exit status 1; Ctrl-C exits 130."""
    from sailrl.runtime.backends import BackendError
    from sailrl.runtime.loop import RunError

    user_errors: tuple[type[BaseException], ...] = (BackendError, RunError, FileExistsError)
    from sailrl.runtime.data import DatasetError
    from sailrl.runtime.local import BaseModelError, CheckpointPathError

    user_errors += (DatasetError, BaseModelError, CheckpointPathError)
    try:
        asyncio.run(main(**kwargs))
    except KeyboardInterrupt:
        return 130
    except user_errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
