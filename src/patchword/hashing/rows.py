"""Identical feature rows: the rows of one matrix that recur in another (a query image that is also in
the database or the training set), and the rows of one matrix that are one image (MS-COCO-style data
give each caption its own row, the image's row repeated).

Rows are compared by their bytes: an 8-byte digest per row finds the candidates in O(N log N) (no
N x M comparison), and each candidate is confirmed by comparing the rows themselves, so a digest collision
never counts as a shared row.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["row_digests", "shared_rows", "row_groups"]


def row_digests(x: np.ndarray) -> np.ndarray:
    """(N,) uint64 digests (blake2b, 8 bytes) of the bytes of each row of the (N, d) matrix ``x``."""
    x = np.ascontiguousarray(x)
    width = x.shape[1] * x.itemsize
    flat = memoryview(x).cast("B")  # rows sliced without copies
    digests = b"".join(
        hashlib.blake2b(flat[i * width : (i + 1) * width], digest_size=8).digest() for i in range(len(x))
    )
    return np.frombuffer(digests, dtype="<u8").copy() if digests else np.zeros(0, dtype=np.uint64)


def shared_rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``a`` (N, d) equal to a row of ``b`` (M, d): ``(rows of a, one equal row of b each)``,
    both (K,) int64 in the order of ``a``; empty when the widths differ."""
    empty = np.zeros(0, dtype=np.int64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        return empty, empty
    da, db = row_digests(a), row_digests(b)
    order = np.argsort(db, kind="stable")
    pos = np.minimum(np.searchsorted(db, da, sorter=order), len(order) - 1)
    candidate = order[pos]
    rows = np.flatnonzero(db[candidate] == da)
    same = (a[rows] == b[candidate[rows]]).all(axis=1)  # confirmed: a digest collision is no shared row
    return rows[same].astype(np.int64), candidate[rows[same]].astype(np.int64)


def _first_row_order(first: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """(N,) group of each row, groups numbered in the order of their first row (``first``: (G,) the first
    row of each unique value, ``inverse``: each row's unique value, as :func:`numpy.unique` returns them)."""
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def row_groups(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``(group (N,) int64, G)``: rows of ``x`` (N, d) with the same bytes share a group, numbered 0..G-1
    in the order of their first row."""
    if not len(x):
        return np.zeros(0, dtype=np.int64), 0
    _, first, inverse = np.unique(row_digests(x), return_index=True, return_inverse=True)
    if len(first) == len(x):  # no digest repeats: every row is its own group, numbered in row order
        return np.arange(len(x), dtype=np.int64), len(x)
    groups = _first_row_order(first, inverse)
    firsts = np.sort(first)  # the first row of group g is firsts[g]
    later = np.setdiff1d(np.arange(len(x)), firsts, assume_unique=True)  # the rows that repeat a digest
    if not (x[later] == x[firsts[groups[later]]]).all():  # a digest collision (about never)
        _, first, inverse = np.unique(x, axis=0, return_index=True, return_inverse=True)
        groups = _first_row_order(first, inverse)  # grouped by the rows themselves
    return groups.astype(np.int64), int(groups.max()) + 1
