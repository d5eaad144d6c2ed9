"""The ``sailrl`` command line.

Each subcommand lives in its own module under ``sailrl.commands`` and is imported only when it runs,
so ``sailrl validate`` and ``sailrl compile`` never pay for torch or transformers.

Exit codes: 0 ok (also when the reader of a pipe closes it early, as in ``sailrl explain spec.yaml | head``), 1
invalid spec / stale output / failed check / failed run (a service fault included), 2 usage error (a bad ``--set``
included), 3 ``sailrl run`` stopped at ``training.max_cost_usd`` (state saved, resumable), 4 ``sailrl run`` stopped
where its spec says to stop (``training.on_all_degenerate`` or ``sampling.on_policy_mismatch``: ``stop``; state
saved), 130 interrupted with Ctrl-C (state saved), 70 internal error (a bug in sailrl: the traceback is printed;
it never exits 1, which means "your input has a problem" or "a service failed").
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from sailrl import __version__

INTERNAL_ERROR = 70  # sysexits.h EX_SOFTWARE

# name -> (module under sailrl.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("validate", "check one or more specs and report every problem, located"),
    "compile": ("compile", "render a spec into a standalone Python training script"),
    "run": ("run", "compile a spec and train it now (on the spec's sampler; --sampler local trains here)"),
    "schema": ("schema", "print the JSON Schema of the spec (for editor completion)"),
    "init": ("init", "write a commented starter spec that validates"),
    "rewards": ("rewards", "score completions with a spec's reward rules and print a per-rule table"),
    "explain": ("explain", "print a spec's reward formula in plain words"),
    "preflight": ("preflight", "check data, prompts and (optionally) base-policy rewards before training"),
    "plot": ("plot", "write a PNG of reward (total, per rule, eval) and degenerate / truncated fractions per step"),
    "show": ("show", "print a run's logged rollouts: completions with each rule's verdict, best or worst first"),
    "export": ("export", "write a run's checkpoint as a PEFT adapter or a merged Hugging Face model, with a model "
                         "card"),
    "sample": ("sample", "sample the trained policy of a run on a prompt or a dataset row and score it with the rules"),
    "studio": ("studio", "a local web page to write reward rules, try them on dataset rows and read a run's rollouts"),
    "clean": ("clean", "list and remove the embedded backend's checkpoints under $SAILRL_HOME/checkpoints"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2, as argparse does, with our hint
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{self._dash_value_hint(message)}\n")

    def _dash_value_hint(self, message: str) -> str:
        """For argparse's "argument --completion/-c: expected one argument": how to pass a value that starts
        with '-' (argparse reads ``-c -0x`` as two options; ``--completion=-0x`` and ``-c=-0x`` pass the value)."""
        found = re.fullmatch(r"argument (\S+): expected one argument", message)
        if found is None:
            return ""
        names = found.group(1).split("/")
        action = next((a for a in self._actions if names[0] in a.option_strings), None)
        metavar = action.metavar if action is not None and isinstance(action.metavar, str) else "VALUE"
        forms = [f"{name}={metavar}" for name in names if name.startswith("-")]
        return f" (a value that starts with '-' is written {' or '.join(forms)})" if forms else ""


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser. Only ``chosen``'s module is imported (for its arguments); ``None`` imports them all."""
    parser = _Parser(
        prog="sailrl",
        description="Compile and run RL fine-tuning specs (Tinker + Sail, or the embedded local backend).",
    )
    parser.add_argument("--version", action="version", version=f"sailrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if chosen is None or chosen == name:
            importlib.import_module(f"sailrl.commands.{module}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(chosen if chosen in COMMANDS else "")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    module = importlib.import_module(f"sailrl.commands.{COMMANDS[args.command][0]}")
    try:
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # a block-buffered pipe is written here: a reader that left must end quietly too
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except SystemExit as exc:
        if isinstance(exc.__context__, BrokenPipeError):  # rich's Console ends a closed pipe with SystemExit(1)
            return _closed_pipe()
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- the last line of defence: never a bare traceback with exit 1
        from sailrl.spec.errors import SpecErrors, UserError  # lazy: `sailrl --help` imports nothing of the stages

        if isinstance(exc, SpecErrors):
            print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
            return 1
        if isinstance(exc, UserError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        import traceback

        traceback.print_exc()
        print(f"sailrl {args.command}: internal error (a bug in sailrl, not a problem in your files): "
              f"{type(exc).__name__}: {exc}. Please report it with the traceback above.", file=sys.stderr)
        return INTERNAL_ERROR


def _closed_pipe() -> int:
    """The reader of stdout went away (``sailrl explain spec.yaml | head``): end quietly with exit 0, as ``git log |
    head`` does. stdout is pointed at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0
