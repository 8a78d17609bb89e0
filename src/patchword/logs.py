"""Logging set-up of the command-line verbs (library modules only call ``logging.getLogger(__name__)``)."""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_FORMAT", "setup_logging"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted.

    A verb run in-process (the command line's ``main`` from a test or a notebook) may outlive the stderr it
    started with: a handler bound to that stream would write to a closed file (pytest's capture) or to a
    stream nobody reads.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def setup_logging(verbose: bool = False, *, level: int | str | None = None, fmt: str = LOG_FORMAT) -> None:
    """Log to stderr at INFO (DEBUG with ``verbose``, or ``level``); calling it again replaces the handler
    it added before, so verbs run one after another in one process log once each."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _CurrentStderr)]:
        root.removeHandler(handler)
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level if level is not None else logging.DEBUG if verbose else logging.INFO)
