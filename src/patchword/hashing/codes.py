"""Binary codes: sign binarisation, bit packing, popcount Hamming distances and exact Hamming search.

Codes live in two forms:

* **±1 codes** ``(N, K)`` (float or int8), what the model's ``sign`` produces and what the metrics use;
  the Hamming distance is ``(K - b_i . b_j) / 2``.
* **packed codes** ``(N, ceil(K / 8))`` uint8, one bit per dimension (``+1 -> 1``, ``np.packbits``
  order), 8x smaller than int8 and 32x smaller than float32. The Hamming distance is
  ``popcount(x XOR y)``; the bytes are read as the widest unsigned word that divides the code length
  (uint64 for 64 / 128 bits), so a 64-bit distance is one XOR and one popcount.

:class:`HammingIndex` is an exact (brute-force) k-NN index over packed codes with a numpy backend and an
optional FAISS ``IndexBinaryFlat`` backend (``pip install faiss-cpu``). The numpy backend returns
neighbours ordered by (distance, database position), the same tie rule as :func:`map_at_k`; FAISS
returns the same distances but its order among equal distances is its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.errors import MissingExtraError
from patchword.fileio import atomic_write

__all__ = [
    "binarize",
    "as_pm1_codes",
    "pack_codes",
    "unpack_codes",
    "hamming_distance",
    "hamming_distance_packed",
    "hamming_topk",
    "cosine_topk",
    "HammingIndex",
]

# Elements of one (queries x database) block of distances; bounds the temporaries of a search to a few
# tens of MB whatever the database size (e.g. 16 queries at a time against 1M codes).
_BLOCK_ELEMENTS = 1 << 24

_HAS_BITWISE_COUNT = hasattr(np, "bitwise_count")  # numpy >= 2.0
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def binarize(h: torch.Tensor) -> torch.Tensor:
    """``sign`` with ``sign(0) = +1``, so every bit is defined: (N, K) float -> (N, K) ±1 of the same dtype.

    ``torch.sign`` maps 0 to 0, which is neither bit; exact zeros are rare after tanh but do occur for
    dead units, and a 0 would silently shift the ``(K - b.b) / 2`` distance by a half.
    """
    return torch.where(h >= 0, torch.ones_like(h), -torch.ones_like(h))


def _to_numpy(x: object, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise ValueError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}")


def as_pm1_codes(codes: object, name: str = "codes") -> np.ndarray:
    """Validate (N, K) codes with every entry -1 or +1 and return them as an int8 array."""
    arr = _to_numpy(codes, name)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be a 2-D (N, K) code matrix with K >= 1, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        raise ValueError(f"{name} is boolean; pass ±1 codes (e.g. 2 * bits - 1) or use pack_codes on bools")
    if arr.size and not bool(np.isin(arr, (-1, 1)).all()):
        raise ValueError(
            f"{name} must contain only -1 and +1 (binarise continuous outputs with binarize/sign first)"
        )
    return arr.astype(np.int8, copy=False)


def pack_codes(codes: object, name: str = "codes") -> np.ndarray:
    """Pack (N, K) ±1 codes (or bool bits) into (N, ceil(K/8)) uint8, bit = 1 where the code is +1.

    Padding bits of the last byte are 0 for every code, so they never add to a distance.
    """
    arr = _to_numpy(codes, name)
    bits = arr if arr.dtype == np.bool_ else as_pm1_codes(arr, name) > 0
    if bits.ndim != 2:
        raise ValueError(f"{name} must be 2-D (N, K), got shape {bits.shape}")
    return np.packbits(bits, axis=1)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`: (N, ceil(bits/8)) uint8 -> (N, bits) int8 ±1."""
    packed = _check_packed(packed, "packed", bits)
    unpacked = np.unpackbits(packed, axis=1, count=bits)
    return (unpacked.astype(np.int8) * 2 - 1).astype(np.int8)


def _check_packed(packed: object, name: str, bits: int | None = None) -> np.ndarray:
    arr = _to_numpy(packed, name)
    if arr.dtype != np.uint8 or arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D uint8 array of packed codes, got {arr.dtype} {arr.shape}")
    if bits is not None and arr.shape[1] != (bits + 7) // 8:
        raise ValueError(
            f"{name} has {arr.shape[1]} bytes per code, expected {(bits + 7) // 8} for {bits} bits"
        )
    return np.ascontiguousarray(arr)


def _as_words(packed: np.ndarray) -> np.ndarray:
    """View (N, B) packed bytes as (N, W) of the widest unsigned word dividing B (no copy)."""
    nbytes = packed.shape[1]
    for width, dtype in ((8, np.uint64), (4, np.uint32), (2, np.uint16)):
        if nbytes % width == 0:
            return packed.view(dtype)
    return packed


def _popcount(x: np.ndarray) -> np.ndarray:
    if _HAS_BITWISE_COUNT:
        return np.bitwise_count(x)
    # numpy < 2.0: a byte lookup table (slower, same result).
    as_bytes = x.view(np.uint8).reshape(*x.shape, x.dtype.itemsize)
    return _POPCOUNT8[as_bytes].sum(axis=-1, dtype=np.uint8)


def _distance_block(q_words: np.ndarray, db_words: np.ndarray) -> np.ndarray:
    """(c, W) x (N, W) words -> (c, N) uint16 Hamming distances."""
    if q_words.shape[1] == 1:
        return _popcount(q_words[:, :1] ^ db_words[:, 0][None, :]).astype(np.uint16)
    out = np.zeros((q_words.shape[0], db_words.shape[0]), dtype=np.uint16)
    for w in range(q_words.shape[1]):  # a handful of words: loop over words, never over queries
        out += _popcount(q_words[:, w : w + 1] ^ db_words[:, w][None, :])
    return out


def hamming_distance_packed(q_packed: np.ndarray, db_packed: np.ndarray) -> np.ndarray:
    """All Hamming distances between packed codes: (Nq, B) x (Ndb, B) uint8 -> (Nq, Ndb) uint16.

    Materialises the full matrix; for large databases use :func:`hamming_topk` or :class:`HammingIndex`.
    """
    q_packed = _check_packed(q_packed, "q_packed")
    db_packed = _check_packed(db_packed, "db_packed")
    if q_packed.shape[1] != db_packed.shape[1]:
        raise ValueError(f"q_packed has {q_packed.shape[1]} bytes per code, db_packed {db_packed.shape[1]}")
    q_words, db_words = _as_words(q_packed), _as_words(db_packed)
    chunk = max(1, _BLOCK_ELEMENTS // max(1, db_packed.shape[0]))
    return np.concatenate(
        [_distance_block(q_words[s : s + chunk], db_words) for s in range(0, len(q_words), chunk)]
        or [np.zeros((0, len(db_words)), dtype=np.uint16)]
    )


def hamming_distance(q_codes: object, db_codes: object) -> torch.Tensor:
    """The float formula on ±1 codes: (Nq, K) x (Ndb, K) -> (Nq, Ndb) ``(K - q . db) / 2`` as int64."""
    q = torch.from_numpy(as_pm1_codes(q_codes, "q_codes").astype(np.float32))
    db = torch.from_numpy(as_pm1_codes(db_codes, "db_codes").astype(np.float32))
    if q.shape[1] != db.shape[1]:
        raise ValueError(f"q_codes has {q.shape[1]} bits but db_codes has {db.shape[1]}")
    # Exact: integer inner products below 2**24 are represented exactly in float32.
    return ((q.shape[1] - q @ db.T) / 2).round().long()


def _topk_block(dist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k smallest of each row of (c, N) small-int distances, ordered by (distance, column).

    The k-th smallest distance of a row (``np.partition``, linear time) is the search radius; every
    column within it is a candidate, and only the candidates (about k, more when the radius' bin is
    crowded) are sorted. No per-query Python loop.
    """
    c, n = dist.shape
    if k >= n:
        idx = np.argsort(dist, axis=1, kind="stable")
        return np.take_along_axis(dist, idx, axis=1), idx
    radius = np.partition(dist, k - 1, axis=1)[:, k - 1]
    rows, cols = np.nonzero(dist <= radius[:, None])  # row-major: columns ascend within a row
    cand = dist[rows, cols].astype(np.int64)
    # Stable sort by (row, distance) keeps ascending column order among equal distances.
    order = np.argsort(rows.astype(np.int64) * (int(dist.max(initial=0)) + 1) + cand, kind="stable")
    counts = np.bincount(rows, minlength=c)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    take = order[starts[:, None] + np.arange(k)]
    return cand[take], cols[take]


def hamming_topk(
    q_packed: np.ndarray, db_packed: np.ndarray, k: int, block_elements: int = _BLOCK_ELEMENTS
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest packed codes by Hamming distance, ties broken by database position.

    Args:
        q_packed: (Nq, B) uint8 packed queries.
        db_packed: (Ndb, B) uint8 packed database.
        k: neighbours per query (clipped to Ndb).
        block_elements: queries are processed in blocks of ``block_elements // Ndb`` to bound memory.

    Returns:
        ``(distances (Nq, k) int32, indices (Nq, k) int64)``.
    """
    q_packed = _check_packed(q_packed, "q_packed")
    db_packed = _check_packed(db_packed, "db_packed")
    if q_packed.shape[1] != db_packed.shape[1]:
        raise ValueError(f"q_packed has {q_packed.shape[1]} bytes per code, db_packed {db_packed.shape[1]}")
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(db_packed) == 0:
        raise ValueError("the database is empty")
    k = min(int(k), len(db_packed))
    q_words, db_words = _as_words(q_packed), _as_words(db_packed)
    chunk = max(1, block_elements // len(db_packed))
    dists = np.empty((len(q_packed), k), dtype=np.int32)
    idx = np.empty((len(q_packed), k), dtype=np.int64)
    for s in range(0, len(q_packed), chunk):
        d, i = _topk_block(_distance_block(q_words[s : s + chunk], db_words), k)
        dists[s : s + chunk], idx[s : s + chunk] = d, i
    return dists, idx


def cosine_topk(
    queries: torch.Tensor, database: torch.Tensor, k: int, block_elements: int = _BLOCK_ELEMENTS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float baseline: exact top-k cosine similarity (the search hashing replaces), blocked over queries.

    Args:
        queries: (Nq, d) float.
        database: (Ndb, d) float; normalise once up front for repeated searches (done here if needed).
        k: neighbours per query (clipped to Ndb).

    Returns:
        ``(scores (Nq, k), indices (Nq, k))``, scores descending.
    """
    if queries.dim() != 2 or database.dim() != 2 or queries.shape[1] != database.shape[1]:
        raise ValueError(
            f"queries (Nq, d) and database (Ndb, d) must share d, got {tuple(queries.shape)} and "
            f"{tuple(database.shape)}"
        )
    k = min(int(k), database.shape[0])
    q = torch.nn.functional.normalize(queries, dim=1)
    chunk = max(1, block_elements // max(1, database.shape[0]))
    scores, idx = [], []
    for s in range(0, q.shape[0], chunk):
        top = (q[s : s + chunk] @ database.T).topk(k, dim=1)
        scores.append(top.values)
        idx.append(top.indices)
    return torch.cat(scores), torch.cat(idx)


def _import_faiss():
    from patchword.eval.two_stage import import_faiss

    try:
        faiss = import_faiss()  # without the loader's INFO lines
    except ImportError as err:
        raise MissingExtraError(
            "backend='faiss' needs FAISS: pip install 'patchword[ann]' (faiss-cpu); the default "
            "backend='numpy' needs nothing extra"
        ) from err
    return faiss


class HammingIndex:
    """Exact Hamming k-NN over packed binary codes.

    Example::

        index = HammingIndex(bits=64)
        index.add(db_codes)                    # (N, 64) ±1 codes, or packed (N, 8) uint8
        dist, idx = index.search(q_codes, 10)  # (Nq, 10) int32 distances, int64 database positions

    Args:
        bits: code length K.
        backend: ``"numpy"`` (default, no extra dependency, ties by database position) or ``"faiss"``
            (``faiss.IndexBinaryFlat``; needs ``bits % 8 == 0``).
    """

    BACKENDS = ("numpy", "faiss")

    def __init__(self, bits: int, backend: str = "numpy") -> None:
        if int(bits) < 1:
            raise ValueError(f"bits must be >= 1, got {bits}")
        if backend not in self.BACKENDS:
            raise ValueError(f"backend must be one of {self.BACKENDS}, got {backend!r}")
        self.bits = int(bits)
        self.backend = backend
        # what the codes were made from (JSON values), saved with them: a cache compares it with what it
        # would be built from now, and rebuilds on a difference
        self.metadata: dict[str, Any] = {}
        self._packed = np.zeros((0, (self.bits + 7) // 8), dtype=np.uint8)
        self._faiss = None
        if backend == "faiss":
            if self.bits % 8:
                raise ValueError(f"the faiss backend needs a multiple of 8 bits, got {self.bits}")
            self._faiss = _import_faiss().IndexBinaryFlat(self.bits)

    @property
    def ntotal(self) -> int:
        """Number of indexed codes."""
        return len(self._packed)

    @property
    def nbytes(self) -> int:
        """Memory of the stored codes in bytes."""
        return int(self._packed.nbytes)

    def _pack(self, codes: object, name: str) -> np.ndarray:
        arr = _to_numpy(codes, name)
        if arr.dtype == np.uint8:  # ±1 codes cannot be uint8, so uint8 means already packed
            return _check_packed(arr, name, self.bits)
        if arr.ndim != 2 or arr.shape[1] != self.bits:
            raise ValueError(f"{name} must be (N, {self.bits}) codes for this index, got shape {arr.shape}")
        return pack_codes(arr, name)

    def add(self, codes: object) -> None:
        """Append (N, bits) ±1 codes or (N, ceil(bits/8)) packed uint8 codes."""
        packed = self._pack(codes, "codes")
        self._packed = np.concatenate([self._packed, packed]) if self.ntotal else packed
        if self._faiss is not None:
            self._faiss.add(packed)

    def search(self, queries: object, k: int) -> tuple[np.ndarray, np.ndarray]:
        """k nearest codes of every query: ``(distances (Nq, k) int32, indices (Nq, k) int64)``."""
        if self.ntotal == 0:
            raise ValueError("the index is empty; add() codes first")
        q = self._pack(queries, "queries")
        if self._faiss is not None:
            dist, idx = self._faiss.search(q, min(int(k), self.ntotal))
            return dist.astype(np.int32), idx.astype(np.int64)
        return hamming_topk(q, self._packed, k)

    def save(self, path: str | Path) -> None:
        """Write the packed codes, the code length and :attr:`metadata` (as JSON text) to an ``.npz`` file
        (no pickle)."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")  # what np.savez does with a path
        meta = np.array(json.dumps(self.metadata, sort_keys=True))
        atomic_write(
            path, lambda fh: np.savez(fh, packed=self._packed, bits=np.int64(self.bits), metadata=meta)
        )

    @classmethod
    def load(cls, path: str | Path, backend: str = "numpy") -> HammingIndex:
        """Read an index written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"index file {path} does not exist")
        with np.load(path, allow_pickle=False) as data:
            if "packed" not in data or "bits" not in data:
                raise ValueError(f"{path}: not a HammingIndex file (needs fields 'packed' and 'bits')")
            index = cls(int(data["bits"]), backend=backend)
            packed = _check_packed(data["packed"], f"{path}: field 'packed'", index.bits)
            if "metadata" in data:  # files of older versions hold none
                index.metadata = json.loads(str(data["metadata"]))
        if len(packed):
            index.add(packed)
        return index

    def __repr__(self) -> str:
        return f"HammingIndex(bits={self.bits}, backend={self.backend!r}, ntotal={self.ntotal})"
