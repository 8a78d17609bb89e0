"""One writer per output file: an advisory lock on ``<out>.lock`` held while a densify command runs.

Two processes appending to one output would each generate every image and leave a file with every line
twice, which no rerun can continue. The lock is an OS lock (``flock``), so it is released when the process
ends however it ends (a kill included) and a stale lock file is harmless. The lock file is left in place:
removing it would let a third process lock a new file while the second still holds the old one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from patchword.fileio import exclusive_lock

__all__ = ["LOCK_SUFFIX", "lock_path", "output_lock"]

LOCK_SUFFIX = ".lock"


def lock_path(out: str | os.PathLike[str]) -> Path:
    """``dense.jsonl`` -> ``dense.jsonl.lock``."""
    out = Path(out)
    return out.with_name(out.name + LOCK_SUFFIX)


def output_lock(out: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """The lock of the densify output ``out`` (its folder created if missing), held for the block.

    Raises:
        RunExistsError: another process writes ``out``.
    """
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    return exclusive_lock(
        path,
        f"{out} (a densify output) is being written by another process (lock {path} is held): wait for it "
        "to end, or stop it first",
    )
