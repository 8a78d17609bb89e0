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
is never rewritten under the same shard id.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO

import numpy as np

from patchword.fileio import atomic_write, write_all
from patchword.search.codecs import TokenCodec
from patchword.search.manifest import Manifest

__all__ = ["SHARDS_DIR", "ARRAYS", "shard_files", "shard_arrays", "save_npy_atomic", "write_npy"]

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
