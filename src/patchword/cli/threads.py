"""``--threads N``: torch's intra-op CPU threads for a verb's model work, one spelling in every verb that
encodes or scores (``eval``, ``index build``, ``search``, ``serve``, ``hash eval``, ``hash search``,
``densify``; ``bench`` has its own, 0 being torch's default there). Training sets them with the config key
``train.num_threads`` instead, recorded with the run.

The count is checked before anything is read (one ``error: --threads: ...`` line, exit code 2) and set for
the verb's work only: ``main()`` also runs in-process (tests, the top-level CLI), so the caller's count is
restored afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from patchword.cli.argtypes import Spelled, spelling
from patchword.errors import ConfigError

__all__ = ["THREADS_HELP", "add_threads_argument", "check_threads", "threads_of"]

#: ``--threads``'s help where its default is torch's own count.
THREADS_HELP = (
    "torch intra-op CPU threads for the model work, at least 1 (default: torch's own, OMP_NUM_THREADS or "
    "one per core)"
)


def add_threads_argument(
    parser: argparse.ArgumentParser,
    *,
    default: int | None = None,
    help: str = THREADS_HELP,  # noqa: A002 - argparse's own name for it
    alias: str | None = None,
) -> None:
    """``--threads N`` (``dest`` ``threads``); ``alias``: an older spelling kept working, hidden from
    ``--help`` (an error names the spelling given: :func:`~patchword.cli.argtypes.spelling`)."""
    parser.add_argument("--threads", type=int, default=default, metavar="N", action=Spelled, help=help)
    if alias is not None:
        parser.add_argument(
            alias, dest="threads", type=int, default=default, action=Spelled, help=argparse.SUPPRESS
        )


def check_threads(args: argparse.Namespace, low: int = 1, meaning: str = "") -> None:
    """Refuse ``args.threads`` below ``low`` (None: not given); ``meaning`` of the lowest value
    (``"0: CPUs // --workers"``) goes into the message.

    Raises:
        ConfigError: naming the spelling given (``--threads``, or a hidden alias).
    """
    if args.threads is not None and args.threads < low:
        note = f" ({meaning})" if meaning else ""
        raise ConfigError(
            spelling(args, "threads", "--threads"), f"must be >= {low}{note}, got {args.threads}"
        )


@contextlib.contextmanager
def threads_of(args: argparse.Namespace) -> Iterator[None]:
    """``args.threads`` checked (>= 1), then torch's thread count for the block (None: left as it is), the
    previous count restored after it."""
    check_threads(args)
    from patchword.train.process import torch_threads

    with torch_threads(args.threads or 0):
        yield
