"""``patchword export RUN OUT``: a run as a self-contained model directory (:mod:`patchword.runs.export`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN", help="a run directory (trained or imported)")
    parser.add_argument("out", type=Path, metavar="OUT", help="the model directory to write (must not exist)")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint file of RUN (default best.pt); one outside RUN is refused",
    )


def run(args: argparse.Namespace) -> None:
    from patchword.errors import ConfigError
    from patchword.fileio import check_output_dir
    from patchword.runs.export import export_run

    if str(args.out) == "-":  # '-' is stdout elsewhere: never a directory named '-'
        raise ConfigError("OUT", "- (stdout) is not taken here: OUT is the model directory to write")

    # before the run is read: a file in the place of OUT or of one of its parents (export_run's own probe,
    # after the run's checks, said "[Errno 20] Not a directory" naming neither OUT nor the file)
    check_output_dir(args.out, "OUT", what="the model directory to write")
    out = export_run(args.run_dir, args.out, args.checkpoint)
    # on stderr, as every verb says what it wrote
    print(
        f"written: {out} (README.md, model.safetensors, config.yaml, tokenizer, metrics.json)",
        file=sys.stderr,
    )
