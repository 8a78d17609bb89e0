"""``patchword report RUN_OR_SWEEP... --out report.md``: runs side by side (patchword.experiments.report)."""

from __future__ import annotations

import argparse
import sys
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


def _read_files(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """The run directories the report reads (each given run, every run of a given sweep, and the sweep
    directory itself), and the other files it reads: the runs' recorded evaluations (``eval*.json``), the
    sweeps' ``sweep.json``, the ``--index`` manifests and ``--gallery`` files."""
    from patchword.experiments.sweep import SWEEP_FILE
    from patchword.runs.files import CONFIG_FILE
    from patchword.search.manifest import MANIFEST_FILE

    sweeps = [p / SWEEP_FILE for p in args.paths if (p / SWEEP_FILE).is_file()]
    runs = [*args.paths, *(c.parent for sweep in sweeps for c in sweep.parent.rglob(CONFIG_FILE))]
    reads = [*sweeps, *(index / MANIFEST_FILE for index in args.index), *args.gallery]
    return runs, [*reads, *(f for run in runs for f in run.glob("eval*.json"))]


def _refuse_shared_outputs(out: Path, csv: Path | None) -> None:
    """Two of the report's files under one name (``--csv`` one of the files ``--out`` writes, or ``--out
    report.html``, whose HTML is written beside it under the same name): the second would overwrite the
    first. Refused.

    Raises:
        ConfigError: naming the flag and the file.
    """
    from patchword.errors import ConfigError

    for flag, path in (("--out", out), ("--csv", csv)):
        if path is not None and str(path) == "-":  # '-' is stdout elsewhere: never a file named '-'
            what = "the report is several files (.md, .html, figures)" if flag == "--out" else "a file"
            raise ConfigError(flag, f"- (stdout) is not taken here: {what}; name the file to write")
    if out.suffix.lower() == ".html":
        raise ConfigError(
            "--out", f"{out} is an HTML name: --out names the Markdown file (the .html is written beside it)"
        )
    written = {path.resolve() for path, _ in report_outputs(out, None)}
    if csv is not None and csv.resolve() in written:
        raise ConfigError(
            "--csv",
            f"{csv} is one of the files --out {out} writes (the Markdown, the .html and the figures beside "
            "it): give --csv another file",
        )


def run(args: argparse.Namespace) -> None:
    from patchword.errors import MissingFileError
    from patchword.experiments.report import write_report
    from patchword.fileio import check_output_file
    from patchword.readers import require_file
    from patchword.runs.load import refuse_run_output
    from patchword.search.manifest import MANIFEST_FILE

    # all of them before any work: a figure the user keeps under one of these names is theirs too; a file
    # the report reads (a run's summary.json, checkpoint or config) is never one, --force or not
    runs, reads = _read_files(args)
    _refuse_shared_outputs(args.out, args.csv)
    for path, flag in report_outputs(args.out, args.csv):
        refuse_run_output(path, runs, reads, flag=flag)
        check_output_file(path, args.force, flag=flag)
    for index in args.index:
        if not (index / MANIFEST_FILE).is_file():
            raise MissingFileError(f"--index {index}: not a search index (no {MANIFEST_FILE})")
    for gallery in args.gallery:
        require_file(gallery, "--gallery", hint="--gallery names a gallery JSON file")
    outputs = [path for path, _ in report_outputs(args.out, args.csv)]
    before = {path: _identity(path) for path in outputs}
    write_report(args.paths, args.out, csv=args.csv, indexes=tuple(args.index), galleries=tuple(args.gallery))
    # every file written, the figures too (one is left out when there is nothing to draw, and an earlier
    # report's figure left beside it is not this report's), on stderr as in the other verbs
    written = [path for path in outputs if path.is_file() and _identity(path) != before[path]]
    print("written: " + ", ".join(map(str, written)), file=sys.stderr)


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which file is at ``path`` (inode, modification time, size; None: none): a write replaces it."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size
