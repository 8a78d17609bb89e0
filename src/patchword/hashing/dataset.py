"""Paired image / text feature sets for cross-modal hashing: containers, validation, protocol split.

Relevance. A :class:`HashSplit` carries ``labels`` (N, L) or, for pair-only data, ``ids`` (N,): item i of
a query split is relevant to item j of a database split when they share a label, or when
``ids[i] == ids[j]``. For pair-only data the query and database splits must therefore hold the *same*
pairs (query image i retrieves text i); :func:`split_dataset` builds that protocol.

Every check raises :class:`~patchword.errors.DataError` naming the source (file) and the field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import DataError
from patchword.fileio import atomic_write

__all__ = [
    "SPLITS",
    "HashSplit",
    "HashDataset",
    "make_split",
    "feature_matrix",
    "multi_hot_labels",
    "class_ids",
    "check_compatible_splits",
    "split_dataset",
]

_logger = logging.getLogger(__name__)

#: The largest finite float32: features are stored as float32, a float64 beyond it would overflow to inf.
_F32_MAX = float(np.finfo(np.float32).max)

#: The UCMFH protocol's splits: train on ``train``, query with ``query``, search ``retrieval``.
SPLITS = ("train", "query", "retrieval")


# ------------------------------------------------------------------------------------------ containers


@dataclass(frozen=True, eq=False)
class HashSplit:
    """One set of N image-text pairs.

    Attributes:
        image: (N, d_img) float32 image features.
        text: (N, d_txt) float32 text features; row i pairs with ``image[i]``.
        labels: (N, L) uint8 multi-hot labels, or None for pair-only data.
        ids: (N,) int64 pair ids (relevance when there are no labels); positions in the source by default.
        source: where the data came from (file name), used in error messages.
    """

    image: np.ndarray
    text: np.ndarray
    labels: np.ndarray | None
    ids: np.ndarray
    source: str = "<memory>"

    def __len__(self) -> int:
        return int(self.image.shape[0])

    @property
    def relevance(self) -> np.ndarray:
        """What :func:`~patchword.hashing.map_at_k` compares: labels (N, L) if present, else ids (N,)."""
        return self.labels if self.labels is not None else self.ids

    def subset(self, index: np.ndarray | list[int]) -> HashSplit:
        """The pairs at ``index`` (ids travel with them, so pair relevance survives the subset)."""
        index = np.asarray(index, dtype=np.int64)
        labels = None if self.labels is None else self.labels[index]
        return HashSplit(self.image[index], self.text[index], labels, self.ids[index], self.source)

    def save_npz(self, path: str | Path) -> None:
        """Write the UCMFH fields (``image``, ``text``, ``label`` when present, ``ids``) to ``.npz``,
        atomically; ``.npz`` is appended to a name without it, as ``np.savez`` does."""
        arrays = {"image": self.image, "text": self.text, "ids": self.ids}
        if self.labels is not None:
            arrays["label"] = self.labels
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")  # what np.savez does with a path
        # a file object: np.savez adds no suffix to the temporary name
        atomic_write(path, lambda fh: np.savez(fh, **arrays))


@dataclass(frozen=True, eq=False)
class HashDataset:
    """The UCMFH protocol: train on ``train``, query with ``query``, search ``retrieval``."""

    train: HashSplit
    query: HashSplit
    retrieval: HashSplit
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def image_dim(self) -> int:
        return int(self.train.image.shape[1])

    @property
    def text_dim(self) -> int:
        return int(self.train.text.shape[1])

    @property
    def has_labels(self) -> bool:
        return self.train.labels is not None

    def summary(self) -> dict[str, Any]:
        """Sizes and dimensions, for logs and run directories."""
        return {
            "train": len(self.train),
            "query": len(self.query),
            "retrieval": len(self.retrieval),
            "image_dim": self.image_dim,
            "text_dim": self.text_dim,
            "num_labels": None if self.train.labels is None else int(self.train.labels.shape[1]),
            "relevance": "labels" if self.has_labels else "pair",
            **self.info,
        }


# ------------------------------------------------------------------------------------------ validation


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


def make_split(
    image: Any,
    text: Any,
    labels: Any = None,
    ids: Any = None,
    *,
    source: str = "<memory>",
    keys: tuple[str, str, str] = ("image", "text", "label"),
    classes: np.ndarray | None = None,
) -> HashSplit:
    """Validate arrays into a :class:`HashSplit` (errors name ``source`` and the field ``keys``);
    ``classes``: the class ids of 1-D class-id labels (:func:`multi_hot_labels`)."""
    img = feature_matrix(image, source, keys[0])
    txt = feature_matrix(text, source, keys[1])
    if img.shape[0] != txt.shape[0]:
        raise DataError(
            f"{source}: field {keys[1]!r} has {txt.shape[0]} rows but field {keys[0]!r} has {img.shape[0]} "
            "(row i of each must be the same pair)"
        )
    lab = None if labels is None else multi_hot_labels(labels, source, keys[2], img.shape[0], classes=classes)
    if ids is None:
        ids_arr = np.arange(img.shape[0], dtype=np.int64)
    else:
        ids_arr = np.asarray(ids)
        if ids_arr.shape != (img.shape[0],) or not np.issubdtype(ids_arr.dtype, np.integer):
            raise DataError(
                f"{source}: ids must be ({img.shape[0]},) integers, got {ids_arr.dtype} {ids_arr.shape}"
            )
        ids_arr = ids_arr.astype(np.int64)
    return HashSplit(img, txt, lab, ids_arr, source)


def check_compatible_splits(splits: dict[str, HashSplit], where: str, *, ids_given: bool = False) -> None:
    """The three splits of one set agree on feature dimensions and labels; ``where`` names the set in errors.

    Pair-only data (no labels) is relevant by pair id, so every query id must occur in the retrieval set,
    and unless both query and retrieval gave their ``ids`` (``ids_given``), the ids are row positions, which
    only say "the same pair" when each query row *is* the retrieval row of its id (same image and text
    features): files of unrelated pairs would otherwise be scored as if query i were retrieval i.
    """
    ref = splits["train"]
    for name, split in splits.items():
        for attr in ("image", "text"):
            if getattr(split, attr).shape[1] != getattr(ref, attr).shape[1]:
                raise DataError(
                    f"{where}: {name} {attr} features have dimension {getattr(split, attr).shape[1]} but "
                    f"train has {getattr(ref, attr).shape[1]}"
                )
        if (split.labels is None) != (ref.labels is None):
            raise DataError(f"{where}: {name} and train disagree on having labels")
        if split.labels is not None and split.labels.shape[1] != ref.labels.shape[1]:
            raise DataError(
                f"{where}: {name} has {split.labels.shape[1]} label classes but train has "
                f"{ref.labels.shape[1]}"
            )
    if ref.labels is None:
        _check_pair_relevance(splits["query"], splits["retrieval"], where, ids_given)


def _check_pair_relevance(query: HashSplit, retrieval: HashSplit, where: str, ids_given: bool) -> None:
    """Every query id occurs in ``retrieval``; without given ids, each query row equals its retrieval row."""
    fix = "give `ids` in query/retrieval, or make the query rows the retrieval pairs with the same ids"
    order = np.argsort(retrieval.ids, kind="stable")
    pos = np.minimum(np.searchsorted(retrieval.ids, query.ids, sorter=order), len(order) - 1)
    match = order[pos]  # the first retrieval row of each query id (when there is one)
    missing = np.flatnonzero(retrieval.ids[match] != query.ids)
    if missing.size:
        row = int(missing[0])
        raise DataError(
            f"{where}: no labels, and {missing.size} query pair id(s) occur in no retrieval pair (first: "
            f"query row {row}, id {int(query.ids[row])}), so those queries have nothing relevant; {fix}"
        )
    if ids_given:
        if len(retrieval.ids) > 1 and (retrieval.ids == retrieval.ids[0]).all():
            raise DataError(
                f"{where}: no labels, and every retrieval pair has id {int(retrieval.ids[0])}, so every "
                "retrieval item is relevant to every query (every metric would be 1.0); give each pair its "
                "own id (pairs of one image may share one)"
            )
        return
    same = (query.image == retrieval.image[match]).all(axis=1) & (query.text == retrieval.text[match]).all(
        axis=1
    )
    differ = np.flatnonzero(~same)
    if differ.size:
        row = int(differ[0])
        raise DataError(
            f"{where}: no labels and no `ids`, so query row i is taken for the pair of retrieval row i, but "
            f"{differ.size} query row(s) hold other features than that retrieval row (first: query row "
            f"{row} vs retrieval row {int(match[row])}); {fix}"
        )


# ------------------------------------------------------------------------------------------ protocol


def split_dataset(full: HashSplit, *, num_query: int, num_train: int, seed: int = 0) -> HashDataset:
    """Split one set of pairs into the UCMFH protocol (seeded random permutation).

    * With labels (DJSRH/DCMH convention): ``query`` = ``num_query`` random pairs, ``retrieval`` = all
      the others, ``train`` = ``num_train`` random pairs of the retrieval set.
    * Without labels (pair relevance): ``query`` and ``retrieval`` are the *same* ``num_query`` held-out
      pairs (query image i must find text i) and ``train`` = up to ``num_train`` of the remaining pairs,
      disjoint from them.
    """
    n = len(full)
    if not 0 < num_query < n:
        raise ValueError(f"num_query must be in [1, {n - 1}] for {n} pairs, got {num_query}")
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    perm = np.random.default_rng(seed).permutation(n)
    query_idx, rest = perm[:num_query], perm[num_query:]
    info = {"source": full.source, "split_seed": seed}
    if full.labels is not None:
        if num_train > len(rest):
            raise ValueError(f"num_train={num_train} exceeds the {len(rest)} retrieval pairs")
        return HashDataset(
            full.subset(rest[:num_train]),
            full.subset(query_idx),
            full.subset(rest),
            info={**info, "protocol": "labels"},
        )
    test = full.subset(query_idx)
    return HashDataset(full.subset(rest[:num_train]), test, test, info={**info, "protocol": "pair"})
