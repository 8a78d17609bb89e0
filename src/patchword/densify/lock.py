"""One writer per output file: an advisory lock on ``<out>.lock`` held while a densify command writes ``out``
(a run, or a merge of shards into it); and a refused command takes back what it created.

Two processes appending to one output would each generate every image and leave a file with every line
twice, which no rerun can continue; a merge into an output another command writes would interleave with it.
The lock is an OS lock (``flock``, the lock :func:`patchword.locks.exclusive_lock` takes), so it is released
when the process ends however it ends (a kill included) and a stale lock file is harmless.

A command that fails before it wrote a line leaves nothing behind: the output and sidecar it created, its
lock file and the folders it made for them are removed (never a file or folder that was there before it
started), so a mistyped command does not litter the disk and its empty output does not make the corrected
command refuse to start ("started with other settings"). Removing a lock file is safe only because taking
the lock checks, once the lock is held, that the file locked is still the one at the path: a command that
locked a file which its holder removed meanwhile lets it go and locks the one at the path now. (Without
that check it could run beside a third command that created and locked a new file.) After a command that
wrote something, the lock file is left in place, as the other locks of patchword are.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from patchword.densify.store import sidecar_path
from patchword.locks import lock_removable_file

__all__ = ["LOCK_SUFFIX", "lock_path", "output_lock"]

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"


def lock_path(out: str | os.PathLike[str]) -> Path:
    """``dense.jsonl`` -> ``dense.jsonl.lock``."""
    out = Path(out)
    return out.with_name(out.name + LOCK_SUFFIX)


def _make_dirs(folder: Path, made: list[Path]) -> None:
    """Create ``folder`` and its missing parents, appending to ``made`` (outermost first) those created here:
    a folder another process creates at the same moment is not ours to remove."""
    missing = []
    while not folder.is_dir() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            if not path.is_dir():
                raise
        else:
            made.append(path)


def _created(path: Path) -> bool:
    return not os.path.lexists(path)


@contextlib.contextmanager
def output_lock(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the lock of the densify output ``out`` (its folder created if missing) for the block.

    If the block raises, what this command created and did not fill is removed before the lock is let go:
    ``out`` if it is still empty, its sidecar if ``out`` is gone, the lock file, the folders made for them
    (only when empty: another rank's shard file, or a file the block did fill, keeps its folder).

    Raises:
        RunExistsError: another process writes ``out``.
    """
    out = Path(out)
    path = lock_path(out)
    busy = (
        f"{out} (a densify output) is being written by another process (lock {path} is held): wait for it "
        "to end, or stop it first"
    )
    made_dirs: list[Path] = []
    try:
        fd, made_lock = lock_removable_file(path, busy, lambda: _make_dirs(path.parent, made_dirs))
    except BaseException:
        _remove_empty_dirs(made_dirs)
        raise
    try:
        new_out, new_sidecar = _created(out), _created(sidecar_path(out))
        try:
            yield
        except BaseException:
            _take_back(out, new_out, new_sidecar, path if made_lock else None, made_dirs)
            raise
    finally:
        os.close(fd)


def _take_back(out: Path, new_out: bool, new_sidecar: bool, lock: Path | None, made_dirs: list[Path]) -> None:
    """Remove what a failed command created and left empty (the lock still held: nobody else writes)."""
    if new_out and _empty_file(out):
        _remove(out)
    if new_sidecar and not out.exists():
        _remove(sidecar_path(out))
    if lock is not None:
        _remove(lock)
    _remove_empty_dirs(made_dirs)


def _empty_file(path: Path) -> bool:
    try:
        return path.stat().st_size == 0 and path.is_file()
    except OSError:
        return False


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as err:  # cleaning up must never hide the error that stopped the command
        logger.warning("could not remove %s (created by this command): %s", path, err)


def _remove_empty_dirs(made_dirs: list[Path]) -> None:
    for folder in reversed(made_dirs):
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): it and the folders around it stay
            return
        logger.debug("removed %s, created by this command", folder)
