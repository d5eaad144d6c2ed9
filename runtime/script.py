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


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``config`` with each ``dotted.key=yaml`` override applied.

    Changing ``model.name`` without also setting ``model.renderer`` clears a renderer the spec did not choose
    explicitly, so the new model's default renderer is used. Raises ``ValueError`` on a malformed override.
    """
    out = copy.deepcopy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        value = yaml.safe_load(raw) if raw.strip() else None
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {p} is not a section")
        node[parts[-1]] = value
    keys = {o.partition("=")[0] for o in overrides}
    if "model.name" in keys and "model.renderer" not in keys and isinstance(out.get("model"), dict):
        out["model"]["renderer"] = None  # the new model's default renderer, not the old model's
    return out


def build_spec(config: dict[str, Any], overrides: list[str]):
    """Validate the script's config (plus overrides) into a :class:`~sailrl.spec.schema.Spec`."""
    from pydantic import ValidationError

    from sailrl.spec.schema import Spec

    try:
        return Spec.model_validate(apply_overrides(config, overrides))
    except (ValidationError, ValueError) as exc:
        print(f"error: invalid --set override: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def resume_command(argv: list[str] | None = None) -> str:
    """The command that resumes this run: the same script and overrides, ``--resume`` instead of ``--overwrite``."""
    import shlex

    argv = list(sys.argv if argv is None else argv)
    args = [a for a in argv[1:] if a not in ("--resume", "--overwrite")]
    return shlex.join(["python", argv[0], *args, "--resume"])


def run(main: Callable[..., Awaitable[Any]], **kwargs: Any) -> int:
    """Run ``main`` under asyncio; user-facing faults become one message and exit status 1; Ctrl-C exits 130."""
    from sailrl.runtime.backends import BackendError
    from sailrl.runtime.loop import RunError

    user_errors: tuple[type[BaseException], ...] = (BackendError, RunError, FileExistsError)
    try:
        from sailrl.runtime.data import DatasetError

        user_errors += (DatasetError,)
    except ImportError:  # pragma: no cover - data module always present in a release
        pass
    try:
        asyncio.run(main(**kwargs))
    except KeyboardInterrupt:
        return 130
    except user_errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
