"""``patchword demo``: the synthetic fine-tuning demo (see :mod:`patchword.recipes.demo`)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. train.max_steps=100")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG figures")


def run(args: argparse.Namespace) -> None:
    from patchword.recipes.demo import run_demo

    run_demo(args.overrides, plots=not args.no_plots)
