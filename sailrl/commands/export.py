"""``sailrl export RUN_DIR``: a run's checkpoint as a PEFT adapter or a merged Hugging Face model, with a model card.

``--checkpoint final`` (default) or a step number; ``--format peft`` (default: an adapter vLLM / SGLang load with
the base model) or ``merged``; ``-o DIR`` (default ``RUN_DIR/export/<format>-<final|step-N>``); ``--overwrite``
replaces a folder an earlier export wrote (never another folder); ``--push REPO_ID`` then uploads it to the Hugging
Face Hub (private unless ``--public``). See :mod:`sailrl.export`. Exit 0, or 1 with one line saying what to do.
"""

from __future__ import annotations

import argparse
import sys

from sailrl.export import export_run
from sailrl.export.publish import push


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (output.run_dir, e.g. runs/quickstart)")
    p.add_argument("--checkpoint", default="final", metavar="final|STEP",
                   help="which checkpoint: 'final' (default) or the step a checkpoint was saved after")
    p.add_argument("--format", choices=("peft", "merged"), default="peft",
                   help="peft: a LoRA adapter for vLLM / SGLang / peft (default); merged: a full Hugging Face model")
    p.add_argument("-o", "--output", metavar="DIR", help="output folder (default RUN_DIR/export/FORMAT-CHECKPOINT)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the output folder if an earlier sailrl export wrote it")
    p.add_argument("--push", metavar="REPO_ID", help="upload the folder to the Hugging Face Hub (e.g. user/my-model)")
    p.add_argument("--public", action="store_true", help="with --push: make the repository public (default private)")


def run(args: argparse.Namespace) -> int:
    done = export_run(args.run_dir, args.checkpoint, args.format, args.output, args.overwrite)
    what = "PEFT adapter" if args.format == "peft" else "merged model"
    print(f"exported {done.checkpoint.path} (step {done.checkpoint.step}) as a {what}: {done.folder}")
    print(f"  base model: {done.built.base_model}; LoRA rank {done.built.lora_rank}; model card: "
          f"{done.folder / 'README.md'}")
    if args.push:
        url = push(done.folder, args.push, private=not args.public)
        print(f"pushed to {url} ({'public' if args.public else 'private'})")
    elif args.public:
        print("note: --public only matters with --push", file=sys.stderr)
    return 0
