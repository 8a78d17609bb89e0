"""One build or update of an index at a time (:data:`~patchword.search.manifest.LOCK_FILE`), and the stamps
that tell a build whether another one wrote the index since it was read (used by
:func:`patchword.search.index.write_build`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from patchword.errors import RunExistsError
from patchword.locks import removable_lock
from patchword.search.manifest import LOCK_FILE, MANIFEST_FILE, PENDING_FILE

__all__ = ["build_lock", "manifest_stamps"]


def manifest_stamps(index_dir: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """(inode, size, mtime) of the manifest and the pending manifest (None: absent): what changes when a
    build writes either (atomically: a new inode)."""
    stamps = []
    for name in (MANIFEST_FILE, PENDING_FILE):
        try:
            st = os.stat(index_dir / name)
        except FileNotFoundError:
            stamps.append(None)
        else:
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


@contextlib.contextmanager
def build_lock(index_dir: Path, seen: tuple[tuple[int, int, int] | None, ...]) -> Iterator[None]:
    """Hold the index's lock (:data:`LOCK_FILE`) for the block: one build or update of an index at a time.
    ``seen`` is :func:`manifest_stamps` when this command read the index: a build that wrote it since then
    (and ended) refuses this one, whose checks read what is no longer there. The lock file is removed at the
    end (:func:`~patchword.locks.removable_lock`), so an index holds no file of it between builds.

    Raises:
        RunExistsError: another build or update holds the lock, or wrote the index since ``seen``.
    """
    path = index_dir / LOCK_FILE
    busy = (
        f"{index_dir} is being built or updated by another `patchword index build` (lock {path} is held): "
        "wait for it to end, or stop it first (searching the index meanwhile is fine)"
    )
    with removable_lock(path, busy):
        if manifest_stamps(index_dir) != seen:
            raise RunExistsError(
                f"{index_dir} was written by another `patchword index build` while this command checked it: "
                "run this command again"
            )
        yield
