"""One writer per output file: an advisory lock on ``<out>.lock`` held while a densify command runs.

Two processes appending to one output would each generate every image and leave a file with every line
twice, which no rerun can continue. The lock is an OS lock (``flock``), so it is released when the process
ends however it ends (a kill included) and a stale lock file is harmless. The lock file is left in place:
removing it would let a third process lock a new file while the second still holds the old one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from patchword.errors import RunExistsError

__all__ = ["LOCK_SUFFIX", "lock_path", "exclusive_lock"]

logger = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"


def lock_path(out: str | os.PathLike[str]) -> Path:
    """``dense.jsonl`` -> ``dense.jsonl.lock``."""
    out = Path(out)
    return out.with_name(out.name + LOCK_SUFFIX)


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Hold the exclusive, non-blocking lock of the file ``path`` (created if needed) for the block.

    Args:
        path: the lock file.
        what: the thing the lock guards, for the error (e.g. ``"dense.jsonl (a densify output)"``).

    Raises:
        RunExistsError: another process holds the lock.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:  # "a": create it, never truncate another holder's file
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunExistsError(
                f"{what} is being written by another process (lock {path} is held): wait for it to end, "
                "or stop it first"
            ) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            logger.warning("%s cannot be locked (%s): a second command on it would not be refused", path, err)
        yield
