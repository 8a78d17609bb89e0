"""Reading ``.npy`` files a user points at or keeps (region features, search-index shards) with errors that
name the file and say what is wrong with it.

``np.load`` alone reports a text file named ``.npy`` as "pickled (object) data" (it falls back to
unpickling whatever lacks the NumPy magic) and a file cut short as "mmap length is greater than file
size", neither naming the file. :func:`npy_problem` reads the header and the file size instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib import format as npy_format

from patchword.errors import DataError, MissingFileError

__all__ = ["npy_problem", "load_npy", "read_npy_header", "truncation"]

PathLike = str | os.PathLike[str]

#: ``.npy`` header readers by format version; 3.0 differs from 2.0 only in a UTF-8 header, which a numeric
#: array's ASCII header never needs.
_HEADER_READERS = {
    (1, 0): npy_format.read_array_header_1_0,
    (2, 0): npy_format.read_array_header_2_0,
    (3, 0): npy_format.read_array_header_2_0,
}


def _what_it_is(head: bytes) -> str:
    """A guess at what a file without the NumPy magic holds, from its first bytes."""
    if not head:
        return "it is empty"
    if head.startswith(b"PK"):
        return "it is a zip archive (an .npz?)"
    if head[:1] == b"\x80":
        return "it holds a Python pickle"
    text = head.decode("utf-8", errors="ignore")
    if text.strip() and all(c.isprintable() or c.isspace() for c in text):
        return f"it holds text ({text.strip().splitlines()[0][:40]!r}...)"
    return "it does not start with the NumPy magic bytes"


def read_npy_header(fh: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """(shape, Fortran order, dtype, data offset in bytes) from the header of the ``.npy`` file open in
    ``fh`` (at its start; left at the first data byte); None for a format version newer than 3.0.

    Raises:
        ValueError: no NumPy magic, or an unreadable header.
        EOFError: the file ends inside the header.
    """
    reader = _HEADER_READERS.get(npy_format.read_magic(fh))
    if reader is None:
        return None
    shape, fortran, dtype = reader(fh)
    return tuple(int(n) for n in shape), bool(fortran), dtype, fh.tell()


def truncation(size: int, needed: int, what: str) -> str | None:
    """``truncated: SIZE bytes, WHAT needs NEEDED`` when a file of ``size`` bytes ends before byte ``needed``,
    where ``what`` (its header's shape, a row) ends; else None."""
    return f"truncated: {size} bytes, {what} needs {needed}" if size < needed else None


def npy_problem(path: PathLike) -> str | None:
    """What is wrong with ``path`` as a ``.npy`` array file, from its header and size; None when nothing is.

    Problems: not a ``.npy`` file (text, a pickle, a zip...), an unreadable header, Python objects
    instead of numbers, or fewer bytes than the header's shape and dtype need (a truncated file).

    Raises:
        MissingFileError: no such file.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
            if not head.startswith(npy_format.MAGIC_PREFIX):
                return f"not a .npy array file: {_what_it_is(head)}"
            fh.seek(0)
            header = read_npy_header(fh)
            if header is None:
                return None  # a newer header format: np.load knows it
            shape, _, dtype, offset = header
    except FileNotFoundError as err:
        raise MissingFileError(f"file not found: {path}") from err
    except (ValueError, EOFError) as err:
        return f"unreadable .npy header ({err})"
    if dtype.hasobject:
        return "holds Python objects (pickled data), not a numeric array"
    needed = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return truncation(path.stat().st_size, needed, f"its header ({shape} {dtype})")


def load_npy(path: PathLike, *, mmap: bool = False, fix: str = "") -> np.ndarray:
    """``np.load(path)`` (read-only memory map with ``mmap``) of a plain numeric array, never a pickle.

    Args:
        path: the ``.npy`` file.
        mmap: memory-map it read-only instead of reading it.
        fix: how the user repairs the file, appended to the error (``"rebuild the index"``).

    Raises:
        MissingFileError: no such file.
        DataError: one line naming the file and its problem (:func:`npy_problem`) and ``fix``.
    """
    hint = f"; {fix}" if fix else ""
    problem = npy_problem(path)
    if problem is not None:
        raise DataError(f"{path}: {problem}{hint}")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, EOFError) as err:
        raise DataError(f"{path}: cannot read the array ({err}){hint}") from err
