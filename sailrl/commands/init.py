"""``sailrl init [PATH] [--force]``: write a commented starter spec that validates and trains locally.

The starter (``spec/starter.yaml``, package data of ``sailrl.spec``) trains the embedded backend's tiny model on
``data/addition.jsonl``; that file is copied next to the spec when the packaged example data exists and
the destination does not. The starter's comments name the file as it was given (``sailrl run PATH``). An
existing spec is never overwritten without ``--force`` (exit 1).
"""

from __future__ import annotations

import argparse
import sys

STARTER_DATA = "data/addition.jsonl"  # the starter's dataset.source, relative to the spec
DEFAULT_PATH = "spec.yaml"  # the file name the starter's comments use


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", default=DEFAULT_PATH, metavar="PATH",
                   help="where to write the starter spec (default: spec.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite PATH if it exists")


def starter_text(starter: str, path: str) -> str:
    """The starter spec whose comments name the file it is written to (``sailrl run myspec.yaml``).

    Only comment lines change; a path with spaces or shell characters is quoted as a shell needs it.
    """
    import re
    import shlex

    name = shlex.quote(path)
    if name == DEFAULT_PATH:
        return starter
    grow = len(name) - len(DEFAULT_PATH)

    def named(m: re.Match) -> str:  # keeps a trailing comment in its column where there is room
        return name + (" " * max(1, len(m.group(1)) - grow) if m.group(1) else "")

    def fix(line: str) -> str:
        if not line.lstrip().startswith("#"):
            return line
        return re.sub(re.escape(DEFAULT_PATH) + r"( +(?=#))?", named, line)

    return "".join(fix(line) for line in starter.splitlines(keepends=True))


def run(args: argparse.Namespace) -> int:
    import shlex
    from importlib import resources
    from pathlib import Path

    spec_pkg = resources.files("sailrl.spec")
    out = Path(args.path)
    starter = starter_text(spec_pkg.joinpath("starter.yaml").read_text(encoding="utf-8"), args.path)
    if out.is_dir():
        print(f"sailrl init: {out} is a folder; give a file name such as {out / 'spec.yaml'}", file=sys.stderr)
        return 1
    if out.exists() and not args.force:
        print(f"sailrl init: {out} already exists; not overwriting it (use --force to replace it)",
              file=sys.stderr)
        return 1
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(starter, encoding="utf-8")
    except OSError as exc:
        print(f"sailrl init: cannot write {out}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {out}")

    data_dst = out.parent / STARTER_DATA
    data_src = spec_pkg.joinpath("examples", *STARTER_DATA.split("/"))
    if data_dst.exists():
        print(f"kept {data_dst} (already there)")
    elif data_src.is_file():
        data_dst.parent.mkdir(parents=True, exist_ok=True)
        data_dst.write_bytes(data_src.read_bytes())
        print(f"wrote {data_dst}")
    else:
        print(f"note: put a JSON-lines file with question/answer fields at {data_dst}", file=sys.stderr)
    shown = shlex.quote(args.path)
    print(f"next: sailrl validate {shown}  then  sailrl run {shown}")
    return 0
