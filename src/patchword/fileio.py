"""Writing files a user keeps: through a temporary file beside the target, flushed to disk, then renamed
into place, so a reader (or a crash at any moment) sees the old content or the new, never a mix."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text"]


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it: done once, at import, before any thread
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes into an open binary file."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates the file private (0600); a file the user keeps gets the usual permissions.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))
