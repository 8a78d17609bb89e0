"""Process-wide settings a long command installs for a block and restores after it: the intra-op CPU
threads (:func:`torch_threads`) and what SIGTERM / SIGINT do.

A signal is recorded for a loop that stops at a step boundary with ``last.pt`` written
(:func:`record_stop_signals`), raised as :class:`StopNow` inside work a resume redoes (a validation:
:func:`stop_signals_raise`), or raised as :class:`~patchword.errors.Interrupted` where no such loop
runs (:func:`stop_raises`). SIGTERM's default action kills the process on the spot, leaving a half-made
run directory behind and no ``interrupted:`` line; cluster pre-emption sends it. Both training commands
use these (``patchword train``'s :class:`~patchword.train.trainer.Trainer`, ``patchword hash train``'s
trainer and runners), and ``patchword densify`` (and ``densify merge``) :func:`stop_raises`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from patchword.errors import Interrupted, ResumeHint

__all__ = [
    "StopNow",
    "TrainingInterrupted",
    "on_stop_signals",
    "record_stop_signals",
    "stop_raises",
    "stop_signals_raise",
    "torch_threads",
]


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Use ``count`` intra-op CPU threads inside the block (0: leave torch's setting), then restore."""
    previous = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def on_stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for SIGTERM / SIGINT during the block, the previous handlers back after it (from the main
    thread only: elsewhere signal handlers cannot be installed, and the block runs without)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


#: Holds the signal a :func:`record_stop_signals` block ended on while that stop unwinds to the command's
#: :func:`stop_raises` (its handler back): a second signal then changes nothing. Without it the handler,
#: which had not seen the first, raised again, saying "received before training started: nothing was
#: kept" although last.pt was written (a slow tracker closing when the second came).
_loop_stopped: dict[str, int] = {}


@contextlib.contextmanager
def stop_raises(phase: dict[str, Any]) -> Iterator[None]:
    """SIGTERM / SIGINT outside a training loop (which stops at a step, last.pt written) raise
    :class:`Interrupted` saying ``phase["then"]``: what is kept and how to go on (the runners update it as
    they go). SIGTERM's default action kills the process on the spot, leaving a half-made run directory
    behind and no ``interrupted:`` line.

    An error that ends the block after the signal arrived is reported as the interruption too: under
    torchrun every process receives the signal (the launcher forwards it) and stops where it is, so a
    collective that then fails in another process failed because the others stopped
    (:class:`~patchword.distributed.DistributedError`), and the :class:`Interrupted` raised inside a block
    that compares the processes' outcomes, or inside code that turns any exception into its own error,
    comes out as another error."""

    def handler(signum, frame):  # noqa: ARG001
        if "signum" in phase or _loop_stopped:  # a second signal: the first stop unwinds (and cleans up)
            return
        phase["signum"] = signum
        raise Interrupted(signum, stopped())

    def stopped() -> str:
        return f"{signal.Signals(phase['signum']).name} received {phase['then']}"

    _loop_stopped.clear()
    try:
        with on_stop_signals(handler):
            try:
                yield
            except Exception as err:  # Interrupted, a BaseException, passes as it is
                if "signum" not in phase:
                    raise
                raise Interrupted(phase["signum"], stopped()) from err
    finally:
        _loop_stopped.clear()  # once the handlers before the block are back


@contextlib.contextmanager
def record_stop_signals(flag: dict[str, int]) -> Iterator[None]:
    """Record SIGTERM / SIGINT in ``flag["signum"]`` instead of dying mid-step (cluster pre-emption). The
    first one is kept: torchrun forwards a Ctrl-C as SIGINT, then SIGTERM to the processes still running,
    and the stop says what the user sent.

    The block acts on the flag by raising (a training loop's stop). One it did not act on when the block
    ends (the signal came after the loop's last look) is raised again once the previous handlers are back,
    and handled as it would have been without the block: it was dropped, and the final evaluation ran on."""
    with on_stop_signals(lambda signum, frame: flag.setdefault("signum", signum)):
        try:
            yield
        except BaseException:
            if "signum" in flag:  # the stop (or an error after the signal) unwinds: see _loop_stopped
                _loop_stopped.setdefault("signum", flag["signum"])
            raise
    if "signum" in flag:
        signal.raise_signal(flag["signum"])


class TrainingInterrupted(Interrupted):
    """SIGTERM / SIGINT arrived; ``last.pt`` was written at ``step`` and the run can be resumed (raised by
    :class:`~patchword.train.trainer.Trainer`). The message says so and how to go on: ``resume``
    (:class:`~patchword.errors.ResumeHint`), by default ``patchword train --resume``; ``where``, in
    parentheses after the step: which process received the signal, when not this one."""

    def __init__(
        self, signum: int, step: int, checkpoint: Path, resume: ResumeHint | None = None, where: str = ""
    ) -> None:
        self.step, self.checkpoint = step, checkpoint
        hint = resume or ResumeHint.resume("patchword train", checkpoint.parent)
        super().__init__(signum, hint.stopped(signum, step, checkpoint, where))


class StopNow(BaseException):
    """A stop signal ended work that a resume redoes (:func:`stop_signals_raise`). A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on the way turns it into an error."""


@contextlib.contextmanager
def stop_signals_raise(flag: dict[str, int]) -> Iterator[None]:
    """Inside the block SIGTERM / SIGINT are recorded in ``flag`` (as :func:`record_stop_signals` does) and
    raise :class:`StopNow` at once, as does one recorded before the block: for work that a resume redoes
    (a validation), which pre-emption's few seconds must not wait for."""
    if "signum" in flag:
        raise StopNow

    def handler(signum, frame):  # noqa: ARG001
        first = "signum" not in flag  # a second one while the first unwinds changes nothing
        flag.setdefault("signum", signum)
        if first:
            raise StopNow

    with on_stop_signals(handler):
        yield
