"""The ``patchword`` executable (``pyproject.toml``'s console script, ``python -m patchword``): the process
around :func:`patchword.cli.main`, which tests and scripts call in-process. What belongs to the process
and not to a command is here: what SIGINT / SIGTERM do while it runs and ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

from patchword.errors import sigterm_interrupts

__all__ = ["console_main"]

#: What a command stops on (exit code 128 + the signal's number).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def console_main() -> int:
    """Run :func:`patchword.cli.main` as the ``patchword`` process: SIGTERM stops the command as a Ctrl-C
    does (:func:`~patchword.errors.sigterm_interrupts`), and the end of the process says what the exit code
    says:

    * a command stopped by SIGINT / SIGTERM (130 / 143) ends by that signal once the exit handlers have
      run, as Python ends on an uncaught Ctrl-C: a shell loop (``for s in 1 2 3; do patchword train
      seed=$s; done``) stops on a Ctrl-C instead of going on with the next command, and a service manager
      takes a server that SIGTERM stopped for one stopped cleanly (an exit code of 143 is a failure to
      systemd);
    * a signal while the interpreter shuts down, when everything is written, no longer kills the process
      with no message, as if the command had failed: during the exit handlers it ends the process at once
      with the command's exit code; after them (module teardown, torch's takes most of a second, where
      Python runs no handler of its own) it is ignored.
    """
    from patchword.cli import main

    ending: dict[str, int] = {}
    # Registered before torch (and everything but logging, imported with patchword) registers its exit
    # handlers: runs after them. A stopped command's end skips logging's (its handlers flush every record).
    atexit.register(_last_exit_handler, ending)
    with sigterm_interrupts():
        code = main()
        ending["code"] = code
        for stop in _STOP_SIGNALS:  # inside the block: no moment with SIGTERM's default action back
            signal.signal(stop, lambda signum, frame: _end_now(code))
    return code


def _end_now(code: int) -> None:
    """End the process now as ``code`` says: by the signal for a stopped command, else with the code."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, missing, or in the middle of a write: no matter
            stream.flush()
    if code - 128 in _STOP_SIGNALS:
        signal.signal(code - 128, signal.SIG_DFL)
        signal.raise_signal(code - 128)  # delivered to this thread before it returns
    os._exit(code)


def _last_exit_handler(ending: dict[str, int]) -> None:
    """The last exit handler of :func:`console_main` (``ending["code"]``: the exit code, absent when
    :func:`~patchword.cli.main` did not return one: argparse's ``--help``, a usage error)."""
    code = ending.get("code", 0)
    if code - 128 in _STOP_SIGNALS:
        _end_now(code)
    for stop in _STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
