"""``patchword report RUN_OR_SWEEP... --out report.md``: runs side by side (patchword.experiments.report)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "report_outputs", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="RUN_OR_SWEEP", help="run or sweep directories"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("report.md"), help="the Markdown file (default report.md)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="overwrite existing report files (the .md, the .html, the _curves.png and _cost.png beside "
        "them, the --csv)",
    )
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


def report_outputs(out: Path, csv: Path | None) -> list[tuple[Path, str]]:
    """Every file ``write_report`` writes for ``--out out`` (and ``--csv csv``), with the flag that names it:
    the Markdown, the HTML and the two figures beside it (``<stem>_curves.png``, ``<stem>_cost.png``)."""
    from patchword.experiments.report import report_files

    return [*((path, "--out") for path in report_files(out).values()), *([(csv, "--csv")] if csv else [])]


def run(args: argparse.Namespace) -> None:
    from patchword.errors import MissingFileError
    from patchword.experiments.report import write_report
    from patchword.fileio import check_output_file

    # all of them before any work: a figure the user keeps under one of these names is theirs too
    for path, flag in report_outputs(args.out, args.csv):
        check_output_file(path, args.force, flag=flag)
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
