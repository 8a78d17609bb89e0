"""Paired image / text feature sets for cross-modal hashing: containers, validation (the arrays':
:mod:`~patchword.hashing.features`; the splits' together here), protocol split.

Relevance. A :class:`HashSplit` carries ``labels`` (N, L) or, for pair-only data, ``ids`` (N,): item i of
a query split is relevant to item j of a database split when they share a label, or when
``ids[i] == ids[j]``. For pair-only data the query and database splits must therefore hold the *same*
pairs (query image i retrieves text i); :func:`split_dataset` builds that protocol.

Every check raises :class:`~patchword.errors.DataError` naming the source (file) and the field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import DataError
from patchword.fileio import atomic_write
from patchword.hashing.features import class_ids, feature_matrix, multi_hot_labels
from patchword.hashing.rows import row_groups, shared_rows

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

    No query image (feature row) is a training image, nor, with labels, a retrieval image: a query split
    built as a subset of the retrieval split, or an image whose captions (one row each) straddle the splits,
    inflated mAP without a word.
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
    # labelled data: the query pairs are held out of both (training pairs are retrieval pairs by the
    # DJSRH / DCMH convention); pair-only data search the query pairs themselves, so only training is checked
    for other in ("retrieval", "train") if ref.labels is not None else ("train",):
        _refuse_shared_images(splits["query"], splits[other], other)


def _refuse_shared_images(query: HashSplit, other: HashSplit, name: str) -> None:
    """No image feature row of ``query`` is one of ``other`` (the ``name`` split): a query whose image is in
    the database finds its own pair (or the image's other captions), one the model trained on was seen."""
    rows, found = shared_rows(query.image, other.image)
    if not rows.size:
        return
    files = query.source if query.source == other.source else f"{query.source} and {other.source}"
    why = (
        "so queries find their own pairs in the database, which inflates mAP"
        if name == "retrieval"
        else "so the model trains on query images"
    )
    raise DataError(
        f"{files}: {rows.size} of the {len(query)} query image rows are also {name} image rows (identical "
        f"features; first: query row {int(rows[0])} = {name} row {int(found[0])}), {why}; remove them from "
        f"the query or the {name} split (each image, with all its captions, belongs to one split)"
    )


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


def split_dataset(
    full: HashSplit,
    *,
    num_query: int,
    num_train: int,
    seed: int = 0,
    groups: tuple[np.ndarray, int] | None = None,
) -> HashDataset:
    """Split one set of pairs into the UCMFH protocol (seeded random permutation).

    * With labels (DJSRH/DCMH convention): ``query`` = ``num_query`` random pairs, ``retrieval`` = all
      the others, ``train`` = ``num_train`` random pairs of the retrieval set.
    * Without labels (pair relevance): ``query`` and ``retrieval`` are the *same* ``num_query`` held-out
      pairs (query image i must find text i) and ``train`` = up to ``num_train`` of the remaining pairs,
      disjoint from them.

    Rows that repeat an image (MS-COCO style, one row per caption) are split by image: ``num_query`` and
    ``num_train`` count images, each split takes every row of its images (an image's captions never
    straddle query / retrieval / train), and pair-only data get the image's number as pair id (a query
    image's captions are all relevant to it). Data without repeated image rows split exactly as before.

    Args:
        groups: :func:`~patchword.hashing.rows.row_groups` of ``full.image`` when the caller has them.
    """
    group, n_images = row_groups(full.image) if groups is None else groups
    grouped = n_images < len(full)
    unit = "images" if grouped else "pairs"
    if not 0 < num_query < n_images:
        raise ValueError(f"num_query must be in [1, {n_images - 1}] for {n_images} {unit}, got {num_query}")
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    if full.labels is not None and num_train > n_images - num_query:
        raise ValueError(f"num_train={num_train} exceeds the {n_images - num_query} retrieval {unit}")
    info: dict[str, Any] = {"source": full.source, "split_seed": seed}
    if grouped:
        _logger.info(
            "%s: %d rows hold %d distinct images (rows repeat an image: one per caption): split by image, "
            "data.num_query=%d and data.num_train=%d count images",
            full.source,
            len(full),
            n_images,
            num_query,
            num_train,
        )
        info.update(split_by="image", images=n_images)
    rank = np.empty(n_images, dtype=np.int64)
    rank[np.random.default_rng(seed).permutation(n_images)] = np.arange(n_images)
    image_rank = rank[group]  # where each row's image falls in the permutation
    # rows image by image, in permutation order (every row its own image: the permutation itself)
    order = np.argsort(image_rank, kind="stable")
    ranked = image_rank[order]
    query_idx, rest = order[ranked < num_query], order[ranked >= num_query]
    train_idx = order[(ranked >= num_query) & (ranked < num_query + num_train)]
    if full.labels is not None:
        return HashDataset(
            full.subset(train_idx),
            full.subset(query_idx),
            full.subset(rest),
            info={**info, "protocol": "labels"},
        )
    # pair relevance by image: each of a query image's rows finds every caption of it
    pairs = replace(full, ids=group) if grouped else full
    test = pairs.subset(query_idx)
    return HashDataset(pairs.subset(train_idx), test, test, info={**info, "protocol": "pair"})
