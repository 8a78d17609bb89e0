"""Errors a user can fix: the CLI prints them as one ``error: ...`` line and exits with code 2.

Every class also derives from the built-in exception a Python caller would expect (``ValueError`` for a
bad value, ``FileNotFoundError`` for a missing file...), so library users can keep catching those. An
exception that is *not* a :class:`PatchwordError` (or one of the built-ins the CLI treats the same way,
see :data:`USER_ERRORS`) is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "PatchwordError",
    "ConfigError",
    "DataError",
    "MissingFileError",
    "RunExistsError",
    "ModelNotFoundError",
    "MissingExtraError",
    "Interrupted",
    "Terminated",
    "interrupt_signal",
    "sigterm_interrupts",
    "stop_signals_held",
    "ResumeHint",
    "resume_command",
    "USER_ERRORS",
    "report_user_error",
    "report_os_error",
    "output_closed",
    "stdout_reader_gone",
    "run_command",
]


class PatchwordError(Exception):
    """Base class of the errors caused by input (config, data, files, models), not by a bug."""


class ConfigError(PatchwordError, ValueError):
    """A config value that cannot work; ``key`` is its dotted path (``model.seps.variant``)."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.detail = key, message
        super().__init__(f"{key}: {message}" if key else message)


class DataError(PatchwordError, ValueError):
    """A data file that cannot be used; the message names the file and, where it applies, the row."""


class MissingFileError(PatchwordError, FileNotFoundError):
    """A file or directory the user named (or a run needs) does not exist."""


class RunExistsError(PatchwordError, FileExistsError):
    """Refusing to overwrite something the user made (a run directory, an output file)."""


class ModelNotFoundError(PatchwordError, OSError):
    """A pretrained model or tokenizer that is neither a local directory nor in the offline cache."""


class MissingExtraError(PatchwordError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""


class Interrupted(BaseException):
    """A command stopped by a signal after saving its work; the message says how to continue.

    ``signum`` gives the exit code ``128 + signum`` (the shell's convention for a signal).

    A BaseException, as KeyboardInterrupt is: a stop handler raises it wherever the signal lands, and an
    ``except Exception`` there would take the stop for a failure of its own and go on (logging's
    ``handleError``, landed in while a log line was written, printed "--- Logging error ---" and the
    command ran to its end, deaf to another SIGTERM). Code that must hear of it catches it by name (rank 0's
    claim of a run directory, which every process waits for: ``patchword.train.runner``).
    """

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        super().__init__(message)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where it lands as Python raises KeyboardInterrupt where a Ctrl-C lands
    (:func:`sigterm_interrupts`, installed by the ``patchword`` executable): a command stops on it as on a
    Ctrl-C, releasing what it holds (an index's build lock, a temporary folder) and saying so in one
    ``interrupted:`` line, exit code 143. SIGTERM's default action (a scheduler's stop, ``kill``,
    ``timeout``) killed the process on the spot and silently. Python raises it only between two of its
    own operations: a long native call (a large matrix product, FAISS training) finishes first.

    A KeyboardInterrupt, so that what stops cleanly on a Ctrl-C stops cleanly on it without naming it;
    :func:`interrupt_signal` tells the two apart."""

    signum = signal.SIGTERM


def interrupt_signal(err: KeyboardInterrupt) -> tuple[int, str]:
    """The signal behind an interrupt and how messages name it: ``(15, "SIGTERM")`` for :class:`Terminated`,
    ``(2, "SIGINT (Ctrl-C)")`` for any other KeyboardInterrupt."""
    if isinstance(err, Terminated):
        return err.signum, signal.Signals(err.signum).name
    return signal.SIGINT, "SIGINT (Ctrl-C)"


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` during the block; its default action is back after it.

    Only from the main thread (elsewhere no handler can be installed) and only where SIGTERM has its default
    action: a handler of the caller's (a test runner, a server) or an ignored SIGTERM stays as it is.
    Commands that do something else on a signal (a training loop stops at a step, last.pt written)
    install their own handler inside the block and put this one back after.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    owner = os.getpid()

    def handler(signum, frame):  # noqa: ARG001
        if os.getpid() != owner:  # a forked worker (a DataLoader's): the default action, no traceback
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is handler:  # one the block installed for good stays
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT / SIGTERM held back during the block: the first that arrives meanwhile is recorded, and raised
    again as the block ends, with the handlers before it back; a second one is raised at once (a user who
    insists). For code a stop must not cut short (a lock file between its creation and the release's
    registration), or that swallows what a handler raises (torch's C++ start-up). From the main thread only
    (elsewhere the block runs as is). Python-level handlers, not a blocked signal mask: the process's other
    threads (OpenMP's) would receive a blocked signal and have the main thread raise it all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def record(signum, frame):  # noqa: ARG001
        received.append(signum)
        if len(received) > 1:
            restore()
            signal.raise_signal(signum)

    def restore() -> None:
        try:  # both put back even when a signal lands between the two
            signal.signal(signal.SIGINT, previous[signal.SIGINT])
        finally:
            signal.signal(signal.SIGTERM, previous[signal.SIGTERM])

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        restore()
        if len(received) == 1:
            signal.raise_signal(received[0])


def resume_command(command: str, run_dir: str | os.PathLike[str]) -> str:
    """The command line that continues the run in ``run_dir`` (``command`` is what trains it, ``patchword
    train``), quoted as messages quote it: ```patchword train --resume runs/x```, backquotes included."""
    return f"`{command} --resume {run_dir}`"


@dataclass(frozen=True)
class ResumeHint:
    """How a user goes on with a training run that a signal stopped: the one wording of the interruption
    messages of every training command (``patchword train``, ``patchword hash train``, ``patchword
    pretrain``), each passing its own way to go on.

    Attributes:
        how: what continues the run, said as the subject of "... continues it": a command line
            (:meth:`resume`), or "running the same `patchword pretrain` command again".
        advice: what the message of a stop with the checkpoint written advises; "continue with {how}" when
            empty.
    """

    how: str
    advice: str = ""

    @classmethod
    def resume(cls, command: str, run_dir: str | os.PathLike[str]) -> ResumeHint:
        """Go on with ``command --resume run_dir`` (:func:`resume_command`)."""
        return cls(resume_command(command, run_dir))

    def stopped(self, signum: int, step: int, checkpoint: str | os.PathLike[str], where: str = "") -> str:
        """The message of a training loop that ``signum`` stopped at ``step`` (``where``: more precisely,
        in parentheses) once it had written ``checkpoint``."""
        name, at = signal.Signals(signum).name, f" ({where})" if where else ""
        advice = self.advice or f"continue with {self.how}"
        return f"{name} received: stopped at step {step}{at}, {checkpoint} written; {advice}"

    @staticmethod
    def before_start() -> str:
        """What a signal before a new run's training started leaves (nothing), said after "SIGTERM
        received"."""
        return "before training started: nothing was kept; run the same command again"

    def before_resumed(self) -> str:
        """What a signal before a resumed run's training went on leaves, said after "SIGTERM received"."""
        return f"before training resumed: {self.how} continues it"

    def evaluating(self, checkpoint: str | os.PathLike[str] | None = None) -> str:
        """What a signal during the final evaluation leaves (the finished training, in ``checkpoint`` when
        given), said after "SIGTERM received"."""
        kept = f" ({checkpoint})" if checkpoint is not None else ""
        return f"during the final evaluation: training is finished{kept}; {self.how} evaluates it"


#: What the CLI reports as one line: our own errors, and the built-ins that library code raises for bad
#: input by convention (a ValueError names the argument, a FileNotFoundError the path).
USER_ERRORS: tuple[type[BaseException], ...] = (
    PatchwordError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
)


def report_user_error(err: BaseException, verbose: bool = False) -> int:
    """Print a user error as one ``error: ...`` line on stderr (after its traceback when ``verbose``) and
    return the exit code, 2. Every command line entry point reports user errors through this."""
    import sys
    import traceback

    if verbose:
        traceback.print_exception(err)
    print(f"error: {err}", file=sys.stderr)
    return 2


def describe_os_error(err: OSError) -> str:
    """``path: reason (ENOSPC)`` for an error of the operating system (disk full, permission denied...)."""
    import errno as errno_names

    reason = err.strerror or str(err) or type(err).__name__
    code = f" ({errno_names.errorcode[err.errno]})" if err.errno in errno_names.errorcode else ""
    paths = [str(p) for p in (err.filename, err.filename2) if p is not None]
    return f"{' -> '.join(paths)}: {reason}{code}" if paths else f"{reason}{code}"


def report_os_error(err: OSError, verbose: bool = False, hint: str = "") -> int:
    """An operating-system failure the user can fix (a full disk, a read-only or vanished directory, a
    permission) as one ``error: ...`` line naming the path, then ``hint``; exit code 2."""
    import sys
    import traceback

    if verbose:
        traceback.print_exception(err)
    print(f"error: {describe_os_error(err)}{'; ' + hint if hint else ''}", file=sys.stderr)
    return 2


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe (or socket) nobody reads any more, so that a ``BrokenPipeError``
    is the closed output rather than another pipe breaking (a socket, a worker process): that one is an
    error to report. True where it cannot be told (a standard output without a file descriptor, a stand-in
    of tests that raised it; a system without ``poll``)."""
    import select
    import stat
    import sys

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return True
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return False  # a terminal or a file: the broken pipe was another one
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        # the write end of a pipe whose reader closed polls as an error (a socket's: hung up)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError):
        return True


def output_closed(err: BrokenPipeError, verbose: bool = False) -> int:
    """The reader of the output went away (``| head -1`` read its line and exited): nothing to report,
    exit code 141 (128 + SIGPIPE), what the shell shows for a command SIGPIPE ended. Python ignores
    SIGPIPE, so the write raised ``err`` instead. Standard output is pointed at ``/dev/null``: the text
    still buffered would fail again when the interpreter flushes it at exit (``Exception ignored ...
    BrokenPipeError``, exit code 120), the recipe of Python's ``signal`` documentation. ``verbose``: the
    traceback, on standard error (itself maybe the closed pipe: then nothing)."""
    import sys
    import traceback

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no file descriptor (a stand-in in tests, pythonw)
        fd = None
    if fd is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    if verbose:
        with contextlib.suppress(OSError):
            traceback.print_exception(err)
    return 128 + getattr(signal, "SIGPIPE", 13)  # (Windows has no SIGPIPE: the same code)


def run_command(run, verbose: bool = False, resume_hint: str = "") -> int:
    """Run a command-line verb (``run() -> exit code | None``) and turn what a user can cause into one line:

    * user errors (:data:`USER_ERRORS`): ``error: ...``, exit 2;
    * other operating-system errors (disk full, permission denied, a file vanishing): ``error: PATH:
      reason (ERRNO)`` plus ``resume_hint`` (how to continue once it is fixed), exit 2;
    * :class:`Interrupted` (work saved, e.g. a training checkpoint): ``interrupted: ...``, 128 + signal;
    * Ctrl-C (or SIGTERM, :class:`Terminated`) anywhere else: ``interrupted: ...`` plus ``resume_hint``, exit
      130 (143);
    * a closed output pipe (``patchword ... | head -1``): no message, exit 141 (128 + SIGPIPE), as a
      command killed by SIGPIPE (git) exits: :func:`output_closed`.

    ``verbose`` adds the traceback. Anything else is a bug and keeps its traceback.
    """
    import sys

    try:
        code = run()
        if sys.stdout is not None:  # what is still buffered, while a closed pipe can be reported here
            sys.stdout.flush()
    except BrokenPipeError as err:
        if stdout_reader_gone():
            return output_closed(err, verbose)
        return report_os_error(err, verbose, resume_hint)  # another pipe (a socket, a worker process)
    except USER_ERRORS as err:
        return report_user_error(err, verbose)
    except OSError as err:
        return report_os_error(err, verbose, resume_hint)
    except Interrupted as err:
        print(f"interrupted: {err}", file=sys.stderr)
        return 128 + err.signum
    except KeyboardInterrupt as err:
        signum, name = interrupt_signal(err)
        hint = f"; {resume_hint}" if resume_hint else ""
        print(f"interrupted: {name}{hint}", file=sys.stderr)
        return 128 + signum
    return 0 if code is None else int(code)
