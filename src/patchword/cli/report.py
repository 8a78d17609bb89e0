"""``patchword report RUN_OR_SWEEP... --out report.md``: runs side by side (patchword.experiments.report)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="RUN_OR_SWEEP", help="run or sweep directories"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("report.md"), help="the Markdown file (default report.md)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing report")


def run(args: argparse.Namespace) -> None:
    from patchword.experiments.report import write_report
    from patchword.fileio import check_output_file

    check_output_file(args.out, args.force)
    check_output_file(args.out.with_suffix(".html"), args.force)
    out = write_report(args.paths, args.out)
    print(f"written: {out}, {out.with_suffix('.html')}")
