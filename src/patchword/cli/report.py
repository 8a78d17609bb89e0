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
    parser.add_argument("--csv", type=Path, help="also write one CSV row per run or sweep variant here")
    parser.add_argument(
        "--index",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a search index built from one of the runs: its bytes per image join that run's row",
    )
    parser.add_argument(
        "--gallery",
        type=Path,
        action="append",
        default=[],
        metavar="JSON",
        help="a `patchword bench gallery --json` file: its scale table joins the report (repeatable)",
    )


def run(args: argparse.Namespace) -> None:
    from patchword.errors import MissingFileError
    from patchword.experiments.report import write_report
    from patchword.fileio import check_output_file

    check_output_file(args.out, args.force)
    check_output_file(args.out.with_suffix(".html"), args.force)
    if args.csv is not None:
        check_output_file(args.csv, args.force, flag="--csv")
    for index in args.index:
        if not (index / "manifest.json").is_file():
            raise MissingFileError(f"--index {index}: not a search index (no manifest.json)")
    for gallery in args.gallery:
        if not gallery.is_file():
            raise MissingFileError(f"--gallery {gallery} does not exist")
    out = write_report(
        args.paths, args.out, csv=args.csv, indexes=tuple(args.index), galleries=tuple(args.gallery)
    )
    written = [out, out.with_suffix(".html"), *([args.csv] if args.csv else [])]
    print("written: " + ", ".join(map(str, written)))
