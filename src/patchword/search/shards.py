"""The shard files of a search index (:mod:`patchword.search.manifest` gives the whole layout): their
names, the arrays each shard holds, and how an array is written.

``INDEX_DIR/shards/``
    ``NNNNN.global.npy``      (rows, C) float32 L2-normalised global image embeddings;
    ``NNNNN.tokens.npy``      (rows, L_v, C) projected image tokens, what the fine matcher reads, in
    the index's token store (:mod:`patchword.search.codecs`: float32, float16, int8 with
    ``NNNNN.tokens.scale.npy``, or product-quantised codes with the index's ``codec.npz``);
    ``NNNNN.dense.npy`` and ``NNNNN.dense_lens.npy``  (rows, L_d, C) dense-caption tokens (same store)
    and their (rows,) lengths, only for an index built with dense captions; or, with ``--dense-store
    scores``, ``NNNNN.dense_score.npy`` (rows,) float32: the part of every score the image's dense caption
    decides alone (SEPS as released: the dense branch), computed at build time in place of the tokens;
    ``NNNNN.patch_ids.npy`` (rows, M) int16 and ``NNNNN.patch_prior.npy`` (rows, M) float32, only for
    an index pruned to M patches per image (``--keep-patches``, :mod:`patchword.search.pruning`): the grid
    positions of the patches kept in ``tokens`` and the image part of their selection scores.

Each array is written to a temporary name and renamed into place (:func:`save_npy_atomic`); a shard file
is never rewritten under the same shard id. A reader opens each array once (:class:`ShardArray`) and reads
the rows it needs with ``os.pread``, never through a memory map: a mapped page of a file cut short in place
(``truncate``, ``cp`` over it) ends the process with SIGBUS, a read of it is a short read
(:class:`ShortRead`) the reader turns into an error.
"""

from __future__ import annotations

import io
import os
import weakref
from pathlib import Path
from typing import IO

import numpy as np

from patchword.fileio import atomic_write, write_all
from patchword.search.codecs import TokenCodec
from patchword.search.manifest import Manifest

__all__ = [
    "SHARDS_DIR",
    "ARRAYS",
    "ShardArray",
    "ShortRead",
    "shard_files",
    "shard_arrays",
    "save_npy_atomic",
    "write_npy",
]

SHARDS_DIR = "shards"

#: Every array a shard may hold (``.scale``: the int8 store's per-token scales).
ARRAYS = (
    "global",
    "tokens",
    "tokens.scale",
    "dense",
    "dense.scale",
    "dense_lens",
    "dense_score",
    "patch_ids",
    "patch_prior",
)


def shard_files(index_dir: Path, shard_id: int) -> dict[str, Path]:
    """Paths of one shard's arrays by name (:data:`ARRAYS`)."""
    base = Path(index_dir) / SHARDS_DIR
    return {name: base / f"{shard_id:05d}.{name}.npy" for name in ARRAYS}


def shard_arrays(manifest: Manifest) -> tuple[str, ...]:
    """The arrays each shard of ``manifest`` holds."""
    codec = TokenCodec(manifest.dtype)
    names = ["global", *(f"tokens{s}" for s in codec.suffixes())]
    if manifest.dense_store == "scores":
        names.append("dense_score")
    elif manifest.dense_store == "tokens":
        names += [*(f"dense{s}" for s in codec.suffixes()), "dense_lens"]
    if manifest.pruning is not None:
        names += ["patch_ids", "patch_prior"]
    return tuple(names)


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    """``np.save`` to ``path`` atomically (temporary file, fsync, rename).

    The bytes are those ``np.save`` writes, written with :func:`write_npy`: a full disk is
    ``OSError(ENOSPC)`` naming ``path``, not numpy's "266240 requested and 244704 written"."""
    atomic_write(path, lambda fh: write_npy(fh, array, path))


def write_npy(fh: IO[bytes], array: np.ndarray, path: str | os.PathLike[str]) -> None:
    """Write ``array`` in ``.npy`` format (``np.save``'s bytes, no pickles) to the open file ``fh``.

    ``np.save`` writes a real file with ``ndarray.tofile`` (C ``fwrite``), which reports a write cut
    short by a full disk as "N requested and M written", without the errno or the file. Here every byte
    goes through ``os.write`` until all are written: the operating system's error comes out as an
    ``OSError`` naming ``path`` (``path: No space left on device (ENOSPC)``), and a write that takes
    nothing without an error is a full disk too."""
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise ValueError(f"{path}: object arrays are not stored in an index")
    header = io.BytesIO()
    fields = np.lib.format.header_data_from_array_1_0(array)
    try:
        np.lib.format.write_array_header_1_0(header, fields)
    except ValueError:  # a header over 64 KiB: np.save writes format 2.0 then
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    fh.flush()  # nothing may be buffered ahead of the bytes written to the descriptor
    fd = fh.fileno()
    for data in (header.getbuffer(), memoryview(array.reshape(-1).view(np.uint8))):
        write_all(fd, data, path)


class ShortRead(Exception):
    """Fewer bytes of a shard file than ``row`` needs could be read: it holds ``size`` bytes now, the row
    ends at byte ``needed`` (the file was cut short, or is being overwritten, since it was opened)."""

    def __init__(self, file: Path, row: int, size: int, needed: int) -> None:
        super().__init__(f"{file}: {size} bytes, row {row} ends at byte {needed}")
        self.file, self.row, self.size, self.needed = file, row, size, needed


#: ``.npy`` header readers by format version; 3.0 differs from 2.0 only in a UTF-8 header, which a numeric
#: array's ASCII header never needs.
_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
    (3, 0): np.lib.format.read_array_header_2_0,
}


class ShardArray:
    """One ``.npy`` array of a shard opened for reading rows: ``shape`` and ``dtype`` from its header, and a
    descriptor opened once (closed with :meth:`close`, or when the object is collected).

    Rows are read with ``os.pread`` (thread-safe: no shared file position), so a file cut short since it was
    opened is a :class:`ShortRead`, where a memory map would end the process with SIGBUS. A file replaced by
    a rename (as ``index build`` writes) is still read as it was opened: the descriptor holds the old one.

    Raises (on opening):
        OSError: the file cannot be opened.
        ValueError: an unreadable header, or column-major (Fortran-order) data, whose rows are not
            contiguous (an index writes C order).
    """

    def __init__(self, file: Path) -> None:
        self.file = Path(file)
        fd = os.open(self.file, os.O_RDONLY)
        try:
            with os.fdopen(os.dup(fd), "rb") as fh:  # the header of the very file the descriptor reads
                version = np.lib.format.read_magic(fh)
                if version not in _HEADERS:
                    raise ValueError(f"unsupported .npy format version {version}")
                shape, fortran, dtype = _HEADERS[version](fh)
                self.offset = fh.tell()
        except BaseException:
            os.close(fd)
            raise
        if fortran and len(shape) > 1:
            os.close(fd)
            raise ValueError(
                "its data is stored column-major (Fortran order); an index writes rows in C order"
            )
        self.shape: tuple[int, ...] = tuple(int(n) for n in shape)
        self.dtype: np.dtype = dtype
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * dtype.itemsize
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        self._close()

    def size_problem(self) -> str | None:
        """``truncated: ...`` when the open file holds fewer bytes than its header's shape and dtype need,
        else None."""
        needed = self.offset + self.shape[0] * self.row_bytes
        size = os.fstat(self._fd).st_size
        if size < needed:
            return f"truncated: {size} bytes, its header ({self.shape} {self.dtype}) needs {needed}"
        return None

    def read_all(self) -> np.ndarray:
        """The whole array, read now (an ndarray of ``shape``).

        Raises:
            ShortRead: the file was cut short since it was opened.
        """
        return self.read_rows(np.arange(self.shape[0]))

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """(k,) row numbers (each in ``0 .. shape[0] - 1``, checked by the caller) -> (k, *shape[1:]) their
        values in the order given; each run of consecutive rows is one read.

        Raises:
            ShortRead: the file was cut short since it was opened.
        """
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        order = np.argsort(rows, kind="stable")
        ranked = rows[order]
        data = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        if self.row_bytes and len(rows):
            raw = memoryview(data.view(np.uint8).reshape(-1))
            starts = np.flatnonzero(np.diff(ranked, prepend=-2) != 1)  # the first row of each run
            ends = np.append(starts[1:], len(ranked))
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                first = int(ranked[start])
                self._read_into(raw[start * self.row_bytes : end * self.row_bytes], first)
        out = np.empty_like(data)
        out[order] = data
        return out

    def _read_into(self, buffer: memoryview, row: int) -> None:
        """Fill ``buffer`` from the rows starting at ``row``; a read that returns nothing before it is full
        is the end of the file.

        Raises:
            ShortRead: fewer bytes are there.
        """
        at = self.offset + row * self.row_bytes
        done = 0
        while done < len(buffer):
            got = _read_at(self._fd, buffer[done:], at + done)
            if got == 0:
                end_row = row + (done // self.row_bytes if self.row_bytes else 0)
                raise ShortRead(
                    self.file,
                    end_row,
                    os.fstat(self._fd).st_size,
                    self.offset + (end_row + 1) * self.row_bytes,
                )
            done += got

    def advise(self, rows: np.ndarray) -> None:
        """Ask the kernel to read the rows ``rows`` into the page cache now (``posix_fadvise(WILLNEED)``;
        nothing where it is unavailable): reading a shortlist row by row waits for each cold row in turn,
        advising all of them first lets the disk serve them together."""
        advice = getattr(os, "POSIX_FADV_WILLNEED", None)
        if advice is None or not self.row_bytes:
            return
        for row in np.asarray(rows, dtype=np.int64).reshape(-1).tolist():
            try:
                os.posix_fadvise(self._fd, self.offset + row * self.row_bytes, self.row_bytes, advice)
            except OSError:  # advice only: reading still works without it
                return


def _read_at(fd: int, buffer: memoryview, offset: int) -> int:
    """Read into ``buffer`` from ``offset`` of ``fd`` (``os.preadv``, or ``os.pread`` where the platform lacks
    it); the bytes read, 0 at the end of the file."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buffer], offset)
    data = os.pread(fd, len(buffer), offset)
    buffer[: len(data)] = data
    return len(data)
