"""``patchword pretrain``: contrastive pretraining of the tiny encoders (patchword.recipes.pretrain)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory for the encoders (model.safetensors, config.json, vocab.json)",
    )
    parser.add_argument("--force", action="store_true", help="replace the encoders in a non-empty --out")
    parser.add_argument(
        "--config",
        help="the pretraining recipe: a YAML file or a shipped name (default pretrain-synthetic-64)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. train.epochs=4")


def run(args: argparse.Namespace) -> None:
    from patchword.recipes.pretrain import run_pretrain

    run_pretrain(args.overrides, out=args.out, force=args.force, config=args.config)
