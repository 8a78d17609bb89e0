"""Progress of long loops: a tqdm bar where a person watches, periodic log lines everywhere else.

A batch job (cluster, CI, ``nohup``) has no terminal, so a bar would either be hidden or fill the log
with carriage returns; there the same loop logs one line every ``log_every_s`` seconds with the count,
the rate and an estimate of the time left, and one line when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from types import TracebackType

from tqdm.auto import tqdm

__all__ = ["progress_bar", "terminal_bar"]

_logger = logging.getLogger("patchword.progress")


class _LogProgress:
    """The tqdm subset the library uses (``update``, context manager), reported through ``logging``."""

    def __init__(self, total: int, desc: str, unit: str, log_every_s: float) -> None:
        self.total, self.desc, self.unit, self.log_every_s = total, desc, unit, log_every_s
        self.n = 0
        self.start = self.last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.log_every_s and self.n < self.total:
            self.last = now
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = now - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.n) / rate if rate > 0 else float("nan")
        pct = 100.0 * self.n / self.total if self.total else 100.0
        _logger.info(
            "%s: %d/%d %s (%.0f%%), %.1f %s/s, %.0f s elapsed, ~%.0f s left",
            self.desc,
            self.n,
            self.total,
            self.unit,
            pct,
            rate,
            self.unit,
            elapsed,
            left,
        )

    def close(self) -> None:
        now = time.perf_counter()
        # Short loops stay quiet; a loop that already logged reports its end.
        if now - self.start >= self.log_every_s:
            _logger.info("%s: %d %s in %.1f s", self.desc, self.n, self.unit, now - self.start)

    def __enter__(self) -> _LogProgress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()


def progress_bar(
    total: int, desc: str, enabled: bool | None = None, *, unit: str = "it", log_every_s: float = 30.0
) -> tqdm | _LogProgress:
    """A progress reporter for a loop of ``total`` units; use as a context manager, call ``update(n)``.

    Args:
        total: units the loop will process.
        desc: what the loop does (``"encode images"``).
        enabled: True: always a bar; False: never a bar; None: a bar only when stderr is a terminal.
            Without a bar, progress is logged every ``log_every_s`` seconds (and once at the end of a
            loop that ran that long).
        unit: the unit's name in the bar and the log lines.
        log_every_s: seconds between log lines.
    """
    bar = sys.stderr.isatty() if enabled is None else enabled
    if bar:
        return tqdm(total=total, desc=desc, leave=False, unit=unit, unit_scale=unit == "pair")
    return _LogProgress(total, desc, unit, log_every_s)


@contextlib.contextmanager
def terminal_bar(
    total: int | None, desc: str, enabled: bool | None = None, *, initial: int = 0, unit: str = "it"
) -> Iterator[tqdm | None]:
    """A bar for a loop that logs its own periodic lines (training logs a record every ``log_every``
    steps): a tqdm bar where a person watches, None elsewhere, where those lines report the progress.

    While the bar is shown, the root logger's console lines are written above it (``tqdm.write``) so
    that a log line does not break the bar in two.

    Args:
        total: units the loop will process in all (None: unknown, the bar counts without a percentage).
        desc: what the loop does (``"train"``).
        enabled: True: always a bar; False: never; None: a bar only when stderr is a terminal.
        initial: units already done before this session (a resumed run).
        unit: the unit's name in the bar.
    """
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield None
        return
    with _log_above_bar(), tqdm(total=total, initial=initial, desc=desc, unit=unit) as bar:
        yield bar


class _AboveBar(logging.StreamHandler):
    """A console handler's records written above the bar (``tqdm.write``). tqdm's own such handler
    (``logging_redirect_tqdm``) catches every exception but KeyboardInterrupt and SystemExit, so a stop
    signal raised inside a log write (``StopNow``, ``Interrupted``) was taken for a failed write: "--- Logging
    error ---" and the work went on."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - a failed write, as logging reports it; a stop signal passes
            self.handleError(record)


@contextlib.contextmanager
def _log_above_bar() -> Iterator[None]:
    """The root logger's console handlers (stdout / stderr) replaced by :class:`_AboveBar` in the block."""
    root = logging.getLogger()
    consoles = [
        h
        for h in root.handlers
        if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
    ]
    above = []
    for handler in consoles:
        replacement = _AboveBar(handler.stream)
        replacement.setFormatter(handler.formatter)
        replacement.setLevel(handler.level)
        above.append(replacement)
    before = root.handlers
    root.handlers = [h for h in before if h not in consoles] + above
    try:
        yield
    finally:
        root.handlers = before
