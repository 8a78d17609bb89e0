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
is never rewritten under the same shard id. A reader memory-maps each array once (:class:`ShardArray`) and
checks the file's size before it copies rows out of the map: a mapped page of a file cut short in place
(``truncate``, ``cp`` over it) ends the process with SIGBUS, a file found short is a :class:`CutShortError`
the reader turns into an error.
"""

from __future__ import annotations

import io
import mmap
import os
import sys
from pathlib import Path
from typing import IO

import numpy as np

from patchword.data.npy import read_npy_header, truncation
from patchword.fileio import atomic_write, write_all
from patchword.search.codecs import TokenCodec
from patchword.search.manifest import Manifest

__all__ = [
    "SHARDS_DIR",
    "ARRAYS",
    "CutShortError",
    "ShardArray",
    "shard_files",
    "shard_arrays",
    "save_npy_atomic",
    "too_many_open_files",
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


class CutShortError(Exception):
    """A shard file holds fewer bytes now than a row read from it needs: cut short in place (``truncate``,
    a ``cp`` over it) since it was mapped. ``problem``: ``truncated: N bytes, row R needs B``."""

    def __init__(self, file: Path, problem: str) -> None:
        super().__init__(f"{file}: {problem}")
        self.file, self.problem = file, problem


#: ``mmap`` keeps a duplicate of the file's descriptor for as long as the map lives, unless told not to
#: (Python 3.13+): an index of thousands of shard arrays would take as many descriptors.
_NO_FD = {"trackfd": False} if sys.version_info >= (3, 13) else {}


class ShardArray:
    """One ``.npy`` array of a shard, memory-mapped read-only (``array``: an ndarray of its header's shape
    and dtype). On Python 3.13+ the map holds no file descriptor; before, Python's ``mmap`` keeps one per
    array (:func:`too_many_open_files`).

    :meth:`read_rows` first checks the size of the file its path names now (one ``os.stat`` a call): a file
    cut short in place since it was mapped is a :class:`CutShortError` where reading its missing pages
    through the map would end the process with SIGBUS. A file cut short between that check and the copy
    still ends it: shard files are replaced by renaming a complete copy over them, which the map never sees
    (it goes on reading the file it mapped, as it does one an update deleted).

    Raises (on mapping):
        OSError: the file cannot be opened or mapped.
        ValueError: an unreadable or unsupported header, Python objects, column-major (Fortran-order) data,
            whose rows are not contiguous (an index writes C order), or fewer bytes than the header needs.
        EOFError: the file ends inside its header.
    """

    def __init__(self, file: Path) -> None:
        self.file = Path(file)
        with open(self.file, "rb") as fh:
            header = read_npy_header(fh)
            if header is None:
                raise ValueError("a .npy format version newer than 3.0")
            shape, fortran, dtype, self.offset = header
            if dtype.hasobject:
                raise ValueError("holds Python objects (pickled data), not a numeric array")
            if fortran and len(shape) > 1:
                raise ValueError(
                    "its data is stored column-major (Fortran order); an index writes rows in C order"
                )
            stat = os.fstat(fh.fileno())
            self._identity = (stat.st_dev, stat.st_ino)  # the file mapped, whatever its path names later
            self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            needed = self.offset + shape[0] * self.row_bytes
            problem = truncation(stat.st_size, needed, f"its header ({shape} {dtype})")
            if problem is not None:
                raise ValueError(problem)
            self._map = mmap.mmap(fh.fileno(), needed, access=mmap.ACCESS_READ, **_NO_FD)
        self.array = np.ndarray(shape, dtype=dtype, buffer=self._map, offset=self.offset)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def read_rows(self, rows: np.ndarray | list[int]) -> np.ndarray:
        """(k,) row numbers (each in ``0 .. shape[0] - 1``, checked by the caller) -> (k, *shape[1:]) a copy
        of their values in the order given (a fancy index of the map).

        Raises:
            CutShortError: the file its path names, still the one mapped, no longer holds the last row read.
        """
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size:
            last = int(rows.max())
            problem = self._cut_short(self.offset + (last + 1) * self.row_bytes, f"row {last}")
            if problem is not None:
                raise CutShortError(self.file, problem)
        return self.array[rows]

    def _cut_short(self, needed: int, what: str) -> str | None:
        """``truncated: ...`` when the file mapped ends before byte ``needed`` now; None when it does not, or
        when its path names another file or none (replaced by a rename, or deleted: the map still reads
        the file it mapped, which nothing can cut short by that name any more)."""
        try:
            stat = os.stat(self.file)
        except FileNotFoundError:
            return None
        if (stat.st_dev, stat.st_ino) != self._identity:
            return None
        return truncation(stat.st_size, needed, what)

    def advise(self, rows: np.ndarray) -> None:
        """Ask the kernel to read the rows ``rows`` into the page cache now (``madvise(WILLNEED)``; nothing
        where it is unavailable): reading a shortlist row by row waits for each cold row in turn, advising
        all of them first lets the disk serve them together."""
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if advice is None or not self.row_bytes:
            return
        page = mmap.PAGESIZE
        for row in np.asarray(rows, dtype=np.int64).reshape(-1).tolist():
            start = self.offset + row * self.row_bytes
            aligned = start - start % page
            try:
                self._map.madvise(advice, aligned, start + self.row_bytes - aligned)
            except (OSError, ValueError):  # advice only: reading still works without it
                return


def too_many_open_files(index_dir: Path, arrays: int) -> str:
    """The message for ``EMFILE`` met mapping the ``arrays`` shard arrays of the index ``index_dir``: the
    limit, and one that fits the maps twice over (a server reopening an index holds both for a while)."""
    want = 2 * arrays + 256
    held = " (this Python's memory maps hold a descriptor each; 3.13+ hold none)" if not _NO_FD else ""
    try:
        import resource  # Unix only

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return (
            f"{index_dir}: too many open files: the index maps {arrays} shard arrays{held}; raise the limit"
        )
    above = "" if hard == resource.RLIM_INFINITY or hard >= want else f" (past the hard limit, {hard})"
    return (
        f"{index_dir}: too many open files: the index maps {arrays} shard arrays{held} and the limit is "
        f"{soft}: raise it{above}, e.g. `ulimit -n {want}` before starting"
    )
