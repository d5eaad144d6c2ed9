"""``sailrl schema [-o FILE]``: print (or write) the JSON Schema of the spec, for editor completion.

Editors with yaml-language-server (VS Code's YAML extension, Neovim, ...) validate and complete a spec when
its first line is ``# yaml-language-server: $schema=spec.schema.json`` and ``sailrl schema -o
spec.schema.json`` wrote that file.
"""

from __future__ import annotations

import argparse
import sys

from sailrl.spec.schema import json_schema


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write the schema to FILE instead of printing it")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    text = json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
    if not args.output or args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    try:
        if out.parent != Path("."):
            out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"sailrl schema: cannot write {out}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {out}", file=sys.stderr)
    return 0
