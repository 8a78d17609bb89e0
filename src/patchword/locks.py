"""Advisory locks (``flock``) that let one command at a time own what it writes: a run directory, a densify
output, a ``pretrain --out``.

The operating system drops a ``flock`` when its process ends, however it ends (``kill -9`` included), so a
lock file left behind is harmless: :func:`exclusive_lock` leaves its file in place. Where a lock file beside
the user's output would litter it, :func:`lock_removable_file` lets its holder remove it, and checks on
taking it that the file locked is still the one at the path. On a file system without locks the work goes
on unguarded, with a warning.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterator

__all__ = ["exclusive_lock", "lock_removable_file", "removable_lock"]

_logger = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str], busy: str) -> Iterator[None]:
    """Hold the exclusive, non-blocking advisory lock (``flock``) of the file ``path`` (created if missing,
    never truncated, left in place) for the block: one command at a time on what it guards. The operating
    system drops the lock when the process ends, however it ends, so a lock file left behind is harmless;
    removing it would let a third process lock a new file while a second still holds the old one.

    Args:
        path: the lock file.
        busy: the error when another process holds it (names what is guarded and what to do).

    Raises:
        RunExistsError: ``busy``, another process holds the lock.
    """
    with open(path, "a") as fh:
        _lock_or_refuse(fh.fileno(), path, busy)
        yield


def _lock_or_refuse(fd: int, path: str | os.PathLike[str], busy: str) -> bool:
    """Take the exclusive, non-blocking ``flock`` of the open file ``fd`` (the file ``path``): True when
    held, False on a file system without locks (logged: work goes on unguarded).

    Raises:
        RunExistsError: ``busy``, another process holds it.
    """
    import fcntl

    from patchword.errors import RunExistsError

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunExistsError(busy) from None
    except OSError as err:  # a file system without locks: work on, unguarded, and say so
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        _logger.warning("%s cannot be locked (%s): a second command would not be refused", path, err)
        return False
    return True


def _open_lock_file(path: str, make_folder: Callable[[], None] | None) -> tuple[int, bool]:
    """An open descriptor of the lock file ``path`` (created if missing, its folder by ``make_folder`` first
    when given) and whether this call created it.

    Raises:
        FileNotFoundError: the folder is missing (no ``make_folder``), or takes no new file however often it
            is made (``/proc``): each of :data:`_LOCK_ATTEMPTS` tries found no file there.
    """
    for _ in range(_LOCK_ATTEMPTS):
        if make_folder is not None:
            make_folder()
        try:
            return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), True
        except FileExistsError:
            pass
        except FileNotFoundError:  # another command removed the folder it made for its lock: again
            if make_folder is None:
                raise
            continue
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
        except FileNotFoundError:  # removed by its holder between the two opens
            continue
    raise FileNotFoundError(errno.ENOENT, "cannot create the lock file", path)


#: Tries to lock the file at a removable lock's path while its holders keep removing it (each try needs one).
_LOCK_ATTEMPTS = 50


def lock_removable_file(
    path: str | os.PathLike[str], busy: str, make_folder: Callable[[], None] | None = None
) -> tuple[int, bool]:
    """Lock the file at ``path`` where its holders remove it when they end (a lock file left beside an
    output would litter the user's folder): ``(descriptor, created by this call)``; the caller unlinks the
    file while it still holds the lock, then closes the descriptor.

    Removing a lock file is safe only because this checks, once the lock is held, that the file locked is
    still the one at the path: a command that locked a file its holder removed meanwhile lets it go and locks
    the one at the path now (without the check it could run beside a third command that created and locked
    a new file).

    Args:
        path: the lock file.
        busy: the error when another process holds it.
        make_folder: creates the lock's folder if missing, before each try (a holder may remove a folder it
            made); None: the folder must exist.

    Raises:
        RunExistsError: ``busy``, another process holds it.
    """
    from patchword.errors import RunExistsError

    path = os.fspath(path)
    for _ in range(_LOCK_ATTEMPTS):
        fd, created = _open_lock_file(path, make_folder)
        try:
            held = _lock_or_refuse(fd, path, busy)
        except BaseException:
            os.close(fd)  # a file this call created and another process locked first is that one's now
            raise
        if not held or _same_file(fd, path):
            return fd, created
        os.close(fd)  # its holder removed it after this call opened it: lock the file at the path now
    raise RunExistsError(busy)


@contextlib.contextmanager
def removable_lock(path: str | os.PathLike[str], busy: str) -> Iterator[None]:
    """Hold the lock of :func:`lock_removable_file` for the block, then remove its file (while still
    holding it) and let it go: nothing of the lock stays beside what it guards.

    Raises:
        RunExistsError: ``busy``, another process holds it.
    """
    from patchword.errors import stop_signals_held

    with contextlib.ExitStack() as release:
        # A stop signal waits while the lock is taken: one landing between the file's creation and the
        # release's registration left the file behind (it raises at the inner block's end, released).
        with stop_signals_held():
            fd, _ = lock_removable_file(path, busy)
            release.callback(_remove_and_close, fd, path)
        yield


def _remove_and_close(fd: int, path: str | os.PathLike[str]) -> None:
    """Remove a removable lock's file while still holding it, then let it go: a command that opened it
    meanwhile sees it gone once it locks it, and retries. A failure to remove it must not hide the error
    that ended the command."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether the open file ``fd`` is the file at ``path`` now."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
