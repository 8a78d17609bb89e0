"""The ``patchword`` command (also ``python -m patchword``).

Configuration is the :class:`~patchword.runs.config.RunConfig` dataclass; ``--config run.yaml`` and
dotted overrides (``model.seps.sparse_ratio=0.6 train.epochs=3``) apply on top of its defaults. ``main(argv)``
is importable so tests run the CLI in-process.

Errors a user can fix (a bad config value, a missing file, bad data, a model not found offline) are
printed as one ``error: ...`` line with exit code 2; ``-v`` adds the traceback. Anything else is a bug
and keeps its traceback. A Ctrl-C is one ``interrupted:`` line and exit code 130, also while the verb's
modules (torch among them) are still being imported: :func:`main` imports them inside its handler. The
executable (:mod:`patchword.cli.console`) handles SIGTERM as a Ctrl-C (:class:`~patchword.errors.Terminated`,
exit code 143) wherever a verb gives it no meaning of its own (training stops at a step), and a stopped
command's process ends by the signal.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patchword.errors import ConfigError, interrupt_signal, run_command, stop_signals_held
from patchword.logs import setup_logging

__all__ = [
    "VERBS",
    "VERBOSE_HELP",
    "Verb",
    "file_or_stdout",
    "main",
    "report_errors",
    "setup_logging",
    "verbose_after_verb",
]

#: What ``-v`` does, on every page that lists it (a page is read alone: no "as above").
VERBOSE_HELP = "show debug logging and the traceback of an error"


@dataclass(frozen=True)
class Verb:
    """A verb of the ``patchword`` command: its module in this package, and how it takes its arguments.

    ``entry`` None: the module has ``add_arguments(parser)`` and ``run(args)`` (parsed here, with dotted
    overrides); otherwise the name of its function taking the arguments after the verb (verbs with
    sub-commands of their own, ``hash train | eval | search``, parse them themselves).
    """

    module: str
    help: str
    entry: str | None = None


#: Every verb, in the order ``patchword --help`` lists them: the one dispatch table.
VERBS: dict[str, Verb] = {
    "demo": Verb("patchword.cli.demo", "train and evaluate SEPS on the synthetic scenes (CPU, no download)"),
    "pretrain": Verb(
        "patchword.cli.pretrain", "contrastive pretraining of the tiny encoders (CLIP-style InfoNCE)"
    ),
    "train": Verb(
        "patchword.cli.train", "train a model (or --resume a run) and evaluate its best dev checkpoint"
    ),
    "eval": Verb("patchword.cli.evaluate", "evaluate a trained run directory"),
    "data": Verb("patchword.cli.data", "datasets: data check (validate a layout) | data export synthetic"),
    "export": Verb("patchword.cli.export", "a run as a self-contained model directory with a model card"),
    "sweep": Verb("patchword.cli.sweep", "one recipe over several seeds (and variants): mean and spread"),
    "report": Verb("patchword.cli.report", "runs and sweeps side by side: metrics, differing keys, curves"),
    "import": Verb(
        "patchword.cli.imports", "an official SEPS/LAPS/SCAN/NAAF/TGDT/UCMFH checkpoint as a run directory"
    ),
    "hash": Verb("patchword.cli.hash", "cross-modal hashing (UCMFH): hash train | eval | search", "main"),
    "bench": Verb("patchword.cli.bench", "benchmarks: bench scoring | two-stage | gallery", "main"),
    "densify": Verb(
        "patchword.cli.densify",
        "dense captions from a vision-language model: densify | densify merge | densify stats",
        "main",
    ),
    "index": Verb(
        "patchword.cli.search", "index a folder of images: index build RUN --images DIR", "main_index"
    ),
    "search": Verb("patchword.cli.search", 'search an index: search INDEX "query" -k 10', "main_search"),
    "serve": Verb("patchword.cli.serve", "web page + JSON API over an index (extra: serve)", "main_serve"),
}


def report_errors(run: Callable[[], int | None], verbose: bool) -> int:
    """Run a verb through :func:`patchword.errors.run_command`: user and operating-system errors become one
    ``error:`` line and exit code 2 (plus the traceback with ``verbose``), an interrupt one
    ``interrupted:`` line saying how to continue and exit code 128 + signal."""
    return run_command(run, verbose)


def verbose_after_verb() -> argparse.ArgumentParser:
    """The parent parser giving a verb's (or sub-verb's) parser ``-v``: ``patchword data check -v`` as
    ``patchword -v data check``. Its default is SUPPRESS, so that a parser below does not reset a ``-v``
    given before it (argparse lets a sub-parser's defaults win)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    return common


def file_or_stdout(out, force: bool, replaced: str = "--out file") -> Path | None:
    """The file an ``--out`` that prints its JSON on stdout also writes: None when not given or ``-``
    (stdout alone); ``--force`` with ``-``, which replaces nothing (``replaced``: what it would), is
    refused."""
    if out is not None and str(out) != "-":
        return Path(out)
    if out is not None and force:
        raise ConfigError("--force", f"overwrites an existing {replaced}; --out - writes none: drop one")
    return None


def _parser() -> argparse.ArgumentParser:
    from patchword.version import __version__

    parser = argparse.ArgumentParser(
        prog="patchword",
        description="Fine-grained image-text retrieval: train, evaluate, compare and search.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument(
        "--version", action="version", version=f"patchword {__version__}", help="print the version and exit"
    )
    common = verbose_after_verb()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, verb in VERBS.items():
        if verb.entry is None:
            parser_of_verb = sub.add_parser(name, help=verb.help, parents=[common])
            importlib.import_module(verb.module).add_arguments(parser_of_verb)
            # an unrecognised option is reported with this verb's usage (parse_with_overrides)
            parser_of_verb.set_defaults(_parser=parser_of_verb)
        else:
            sub.add_parser(name, help=verb.help, add_help=False)
    return parser


def _global_option(arg: str) -> bool:
    """Whether argparse takes ``arg`` as ``-v`` / ``-h`` / ``--version`` (``--verb``: a long option may be
    abbreviated; ``--ver`` is argparse's to call ambiguous)."""
    long_options = ("--verbose", "--help", "--version")
    return arg in ("-v", "-h") or (len(arg) > 2 and any(o.startswith(arg) for o in long_options))


def main(argv: list[str] | None = None) -> int:
    """Run ``patchword <argv>`` (default ``sys.argv[1:]``); the exit code.

    A Ctrl-C (or SIGTERM, under :func:`~patchword.cli.console.console_main`) before the verb's own handling
    (:func:`report_errors`) starts, while the parsers and the verb's modules are imported (``import
    torch`` takes a second or more), ends quietly too: one ``interrupted:`` line, exit code 130 (143), no
    traceback. One that lands while the verb's own report is printed (a second signal) adds nothing to it.
    """
    reporting: list[bool] = []  # one entry once the verb's own handling started
    try:
        return _main(argv, reporting)
    except KeyboardInterrupt as err:
        signum, name = interrupt_signal(err)
        if not reporting:
            print(f"interrupted: {name} before the command started: nothing was done", file=sys.stderr)
        return 128 + signum


def _main(argv: list[str] | None, reporting: list[bool]) -> int:
    from patchword.config import parse_with_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    # Global flags (-v) may precede a delegated verb: they are handed on with the rest.
    flags = [a for a in itertools.takewhile(lambda a: a in ("-v", "--verbose"), argv)]
    rest = argv[len(flags) :]
    if rest and rest[0] in VERBS and VERBS[rest[0]].entry is not None:
        verb = VERBS[rest[0]]
        verbose = bool(flags) or "-v" in rest or "--verbose" in rest
        sub_argv = [*rest[1:], *flags]
        _import_torch()
        entry = _reporting(
            lambda: getattr(importlib.import_module(verb.module), verb.entry)(sub_argv), reporting
        )
        return report_errors(entry, verbose)
    parser = _parser()
    if all(a.startswith("-") for a in rest) and "-h" not in rest and "--help" not in rest:
        unknown = [a for a in rest if not _global_option(a)]
        if unknown:  # no COMMAND: argparse would say only that it is missing, never naming the option
            parser.error(
                f"unknown option {' '.join(unknown)}: patchword takes only -h, -v and --version before the "
                "COMMAND (a command's options go after it: patchword COMMAND --help)"
            )
    from patchword.runs.config import RunConfig

    # overrides may follow options too; an unknown --eval-split is suggested as the override eval.split=
    args = parse_with_overrides(parser, argv, config=RunConfig)
    setup_logging(args.verbose)
    _import_torch()
    module = importlib.import_module(VERBS[args.command].module)
    return report_errors(_reporting(lambda: module.run(args), reporting), args.verbose)


def _reporting(run: Callable[[], int | None], reporting: list[bool]) -> Callable[[], int | None]:
    """``run`` noting in ``reporting`` that it began, inside :func:`report_errors`' handling: a signal from
    then on is reported by that handling (a second one, landing while it prints, by nothing more)."""

    def began() -> int | None:
        reporting.append(True)
        return run()

    return began


def _import_torch() -> None:
    """Import torch (every verb needs it; ``--help`` returned before) with SIGINT / SIGTERM held until the
    import ends (:func:`~patchword.errors.stop_signals_held`): torch's C++ start-up imports Python modules
    (numpy among them) and swallows the KeyboardInterrupt a signal raises there, and the command went on with
    numpy half imported, failing later with a traceback (``module 'numpy' has no attribute 'matrix'``), or
    ran to its end as if no signal had come; once a C++ ``terminate`` aborted the process. Raised after the
    import, the signal is an interruption "before the command started"."""
    with stop_signals_held():
        import torch  # noqa: F401
