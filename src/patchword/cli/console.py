"""The ``patchword`` executable (``pyproject.toml``'s console script, ``python -m patchword``): the process
around :func:`patchword.cli.main`, which tests and scripts call in-process. What belongs to the process
and not to a command is here: what SIGINT / SIGTERM do while it starts, runs and ends.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.util
import os
import signal
import sys

from patchword.errors import sigterm_interrupts, stop_signals_held

__all__ = ["console_main"]

#: What a command stops on (exit code 128 + the signal's number).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def console_main() -> int:
    """Run :func:`patchword.cli.main` as the ``patchword`` process: SIGTERM stops the command as a Ctrl-C
    does (:func:`~patchword.errors.sigterm_interrupts`), a signal during ``import torch`` waits for the
    import to end (:class:`_TorchImportHoldsSignals`), and the end of the process says what the exit
    code says:

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
    atexit.register(_last_exit_handler, ending)  # before torch registers its own: runs after them
    if "torch" not in sys.modules:
        sys.meta_path.insert(0, _TorchImportHoldsSignals())
    with sigterm_interrupts():
        code = main()
    ending["code"] = code
    for stop in _STOP_SIGNALS:
        signal.signal(stop, lambda signum, frame: _end_now(code))
    return code


class _TorchImportHoldsSignals(importlib.abc.MetaPathFinder):
    """Finds ``torch`` for its first import, whose module code then runs with SIGINT / SIGTERM held back
    (:func:`~patchword.errors.stop_signals_held`): one that arrived meanwhile is raised as the import ends.
    torch's C++ start-up imports Python modules (numpy among them) and swallows the KeyboardInterrupt a
    signal raises there: the command went on with a numpy half imported and failed later with a
    traceback (``module 'numpy' has no attribute 'matrix'``), or ran to its end as if no signal had come;
    once a C++ ``terminate`` aborted the process. Here only where ``import torch`` happens, not up front:
    ``patchword --help`` imports no torch.
    """

    def find_spec(self, name, path=None, target=None):  # noqa: ARG002 - the MetaPathFinder signature
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once: the spec below comes from the finders after this one
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module_code = spec.loader.exec_module

        def exec_module(module) -> None:
            with stop_signals_held():
                run_module_code(module)

        spec.loader.exec_module = exec_module  # this module's loader alone (one loader per module)
        return spec


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
