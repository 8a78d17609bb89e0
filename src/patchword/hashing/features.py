"""Checks of the arrays of a hashing split: finite float32 feature matrices and multi-hot labels (class-id
vectors read as one label per pair), each failure a :class:`~patchword.errors.DataError` naming the source
(file) and the field."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from patchword.errors import DataError

__all__ = ["feature_matrix", "float32_problem", "class_ids", "multi_hot_labels"]

_logger = logging.getLogger(__name__)

#: The largest finite float32: features are stored as float32, a float64 beyond it would overflow to inf.
_F32_MAX = float(np.finfo(np.float32).max)


def feature_matrix(value: Any, source: str, key: str) -> np.ndarray:
    """A finite 2-D float32 feature matrix, or DataError naming ``source`` and ``key``."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise DataError(f"{source}: field {key!r} is not an array: {err}") from err
    if arr.dtype.kind == "c":  # the cast would drop the imaginary part with only a ComplexWarning
        raise DataError(f"{source}: field {key!r} holds complex numbers ({arr.dtype}); give real features")
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise DataError(f"{source}: field {key!r} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 2:
        hint = " (raw images? extract features first)" if arr.ndim == 4 else ""
        raise DataError(f"{source}: field {key!r} must be a 2-D (N, d) matrix, got shape {arr.shape}{hint}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise DataError(f"{source}: field {key!r} is empty, shape {arr.shape}")
    problem = float32_problem(arr)
    if problem:
        raise DataError(f"{source}: field {key!r} {problem}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def float32_problem(arr: np.ndarray) -> str | None:
    """Why the (N, ...) real array ``arr`` cannot become finite float32 features (NaN/inf, or a value beyond
    float32's range that the cast would turn into inf), with the first bad row; None when it can. Checked
    before the cast, so a float64 file is not reported as holding the infs the cast made."""
    if arr.dtype.kind != "f":  # bool and integers: finite, and within float32's range (|int64| < 1e19)
        return None
    bad = ~np.isfinite(arr)
    if bad.any():
        row = int(np.argwhere(bad)[0, 0])
        return f"has {int(bad.sum())} NaN/inf value(s), first in row {row}"
    if arr.dtype.itemsize > 4:
        big = np.abs(arr) > _F32_MAX
        if big.any():
            return f"values exceed float32's range (first in row {int(np.argwhere(big)[0, 0])})"
    return None


def _class_vector(arr: np.ndarray, n: int) -> np.ndarray | None:
    """``arr`` as the 1-D vector of class ids it is read as, or None for a (N, L) multi-hot matrix: a 1-D
    vector, a MATLAB (1, N) row vector, or an (N, 1) column holding values other than 0/1 (an (N, 1) of 0/1
    stays one multi-hot label column)."""
    if arr.ndim == 1:
        return arr
    if arr.ndim == 2 and 1 in arr.shape and arr.size == n:
        if arr.shape[0] != n:
            return arr.reshape(-1)  # MATLAB row vector of class ids
        if arr.shape == (n, 1) and n > 0 and not np.isin(arr, (0, 1)).all():
            return arr.reshape(-1)  # MATLAB column vector of class ids
    return None


def class_ids(values: list[Any], ns: list[int]) -> np.ndarray | None:
    """The sorted class ids of several label fields read as class-id vectors (``values[i]`` with
    ``ns[i]`` rows), for :func:`multi_hot_labels`'s ``classes``, so that the splits of one set give a class
    the same column; None when any of them is not such a vector (then each is checked on its own)."""
    vectors = []
    for value, n in zip(values, ns, strict=True):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            return None
        vec = _class_vector(arr, n)
        if vec is None or not np.isfinite(vec).all():
            return None
        vectors.append(vec)
    return np.unique(np.concatenate(vectors)) if vectors else None


def multi_hot_labels(
    value: Any, source: str, key: str, n: int, *, classes: np.ndarray | None = None
) -> np.ndarray:
    """(N, L) uint8 multi-hot labels.

    A 1-D integer vector (also a MATLAB (1, N) row or (N, 1) column of ids other than 0/1) is read as
    single-label class ids: column j is the j-th smallest class id of ``classes`` (default: the ids found),
    so ids 0..C-1 keep column c = class c, and a large id (1e9) costs one column, not 1e9. Labels without
    any 1 are refused (every metric would be 0); rows without a label and labels every row shares (mAP 1.0
    would mean nothing) are logged as warnings.
    """
    arr = np.asarray(value)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise DataError(f"{source}: field {key!r} must be numeric, got dtype {arr.dtype}")
    vec = _class_vector(arr, n)
    if vec is not None:
        if arr.dtype.kind == "c" or (
            not np.issubdtype(vec.dtype, np.integer) and not np.all(vec == np.round(vec))
        ):
            raise DataError(f"{source}: 1-D field {key!r} must hold integer class indices")
        if vec.size and vec.min() < 0:
            raise DataError(f"{source}: field {key!r} has negative class indices")
        found = vec.astype(np.int64)
        columns = np.unique(found) if classes is None else np.asarray(classes, dtype=np.int64)
        arr = np.zeros((found.size, columns.size), dtype=np.uint8)
        arr[np.arange(found.size), np.searchsorted(columns, found)] = 1
    if arr.ndim != 2:
        raise DataError(f"{source}: field {key!r} must be (N, L) multi-hot labels, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise DataError(
            f"{source}: field {key!r} has {arr.shape[0]} rows but the features have {n} "
            "(one label row per pair)"
        )
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise DataError(f"{source}: field {key!r} has NaN/inf values")
    if not np.isin(arr, (0, 1)).all():
        raise DataError(f"{source}: field {key!r} must be 0/1 multi-hot, found other values")
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    _check_label_content(arr, source, key)
    return arr


def _check_label_content(labels: np.ndarray, source: str, key: str) -> None:
    """Refuse (N, L) labels without a single 1; warn of rows without a label and of a label on every row."""
    if labels.size and not labels.any():
        raise DataError(
            f"{source}: field {key!r} has no 1 at all (no pair has a label, so nothing is relevant and every "
            "metric would be 0); give multi-hot labels or leave the field out for pair relevance"
        )
    unlabelled = int((labels.sum(axis=1) == 0).sum())
    if unlabelled:
        _logger.warning(
            "%s: %d of %d rows of field %r have no label (never relevant to anything)",
            source,
            unlabelled,
            labels.shape[0],
            key,
        )
    shared = np.flatnonzero(labels.all(axis=0))
    if labels.shape[0] > 1 and shared.size:
        _logger.warning(
            "%s: every row of field %r has label column %d, so every pair shares a label (one class: "
            "mAP 1.0 would mean nothing)",
            source,
            key,
            int(shared[0]),
        )
