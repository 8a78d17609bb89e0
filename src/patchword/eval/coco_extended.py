"""COCO 5K beyond R@K: ECCV Caption and CxC extra positives (the ``eccv_caption`` metrics, natively).

COCO's test captions are written for one image each, but many of them describe other test images just as
well: R@K counts those as errors. ECCV Caption (Chun et al., ECCV 2022) and CxC (Parekh et al., EACL 2021)
add machine- and human-verified positives; ECCV Caption also reports R-Precision and mAP@R, which reward
ranking *all* positives first. :func:`coco_extended_metrics` computes every metric of
``eccv_caption.Metrics.compute_all_metrics`` (package ``eccv_caption`` 0.1.0) from a similarity matrix, with
the same names and the same nested result (``metric -> {"i2t": value, "t2i": value}``, values in [0, 1]):

================================  ================================================================
metric                            what
================================  ================================================================
``coco_5k_r1`` / ``_recalls``     R@1 / R@K for every K of ``ks`` with COCO's own positives (5K test)
``coco_1k_r1`` / ``_recalls``     the same on the five 1K folds (items restricted to the fold), averaged;
                                  one matrix only: a two-stage pair's folds need a search of their own
``cxc_r1`` / ``cxc_recalls``      R@1 / R@K with the CxC positives
``eccv_r1`` / ``eccv_recalls``    R@1 / R@K with the ECCV Caption positives
``eccv_rprecision``               R-Precision: the positive share of the top R (R = number of positives)
``eccv_map_at_r``                 mAP@R: mean over the top R of the precision at each positive
``pmrp``                          exact R-Precision (whole ranking) with the plausible-match positives
                                  (files not shipped); not the paper's "modified PMRP" on top-50 lists
================================  ================================================================

Only the queries the positives files list are evaluated (ECCV Caption: 1332 captions, 1261 images), all
of which must be rows or columns of ``sims``. Ranks follow :mod:`patchword.eval.metrics`: a positive tied
with a negative ranks behind it (ties among positives keep index order). Differences from the package,
all where it misbehaves: it returns nothing for ``eccv_rprecision`` unless ``eccv_map_at_r`` is also asked
for (a typo in its check), drops ``eccv_recalls`` when ``eccv_map_at_r`` is asked for, and merges ``pmrp``
into the top level of its result; here every requested metric is computed and named.

The positives are read from a directory with ECCV Caption's files (``{original,cxc,eccv}_{image_to_caption,
caption_to_image}.json``, ``coco_test_ids.npy``, optionally ``pm_*.json``): by default the data the
``eccv_caption`` package ships (``pip install 'patchword[coco]'``); nothing is downloaded.

Over 400 lines: ECCV Caption and CxC metrics with the loading of their ground truth.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from patchword.errors import ConfigError, DataError, MissingExtraError, MissingFileError
from patchword.eval.metrics import refuse_nan_and_posinf
from patchword.matching.ops import full_precision

__all__ = [
    "COCO_EXTENDED_METRICS",
    "DEFAULT_COCO_EXTENDED_METRICS",
    "CocoGroundTruth",
    "coco_extended_metrics",
    "coco_extended_percent",
]

#: Every metric name :func:`coco_extended_metrics` accepts (those of ``eccv_caption``).
COCO_EXTENDED_METRICS: tuple[str, ...] = (
    "coco_1k_r1",
    "coco_1k_recalls",
    "coco_5k_r1",
    "coco_5k_recalls",
    "cxc_r1",
    "cxc_recalls",
    "eccv_r1",
    "eccv_recalls",
    "eccv_rprecision",
    "eccv_map_at_r",
    "pmrp",
)
#: ``eccv_caption.Metrics.compute_all_metrics``'s default.
DEFAULT_COCO_EXTENDED_METRICS: tuple[str, ...] = (
    "coco_1k_r1",
    "coco_5k_r1",
    "cxc_r1",
    "eccv_r1",
    "eccv_map_at_r",
)

_SOURCES = ("original", "cxc", "eccv", "pm")
# Working memory of one block of ranked queries, unless the caller gives max_memory_mb.
_DEFAULT_MEMORY_MB = 256

Positives = dict[
    str, dict[int, list[int]]
]  # {"i2t": {image id: caption ids}, "t2i": {caption id: image ids}}


def _read_positives(directory: Path, source: str) -> Positives:
    out = {}
    for direction, name in (("i2t", "image_to_caption"), ("t2i", "caption_to_image")):
        path = directory / f"{source}_{name}.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            out[direction] = {int(k): [int(x) for x in v] for k, v in raw.items()}
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as err:
            raise DataError(f"{path}: not an id -> [ids] JSON object ({err})") from err
    return out


@dataclass
class CocoGroundTruth:
    """The positives of the COCO 5K test split.

    Attributes:
        coco, cxc, eccv: ``{"i2t": {image id: [caption ids]}, "t2i": {caption id: [image ids]}}`` of COCO's
            own captions, CxC and ECCV Caption.
        pm: the plausible-match positives (PMRP), or None when their files are absent.
        coco_ids: (25000,) int64 caption ids in the standard 5K order (``testall_caps.txt``: captions
            5i..5i+4 describe image i; the 1K folds are consecutive fifths).
    """

    coco: Positives
    cxc: Positives
    eccv: Positives
    pm: Positives | None
    coco_ids: np.ndarray

    @classmethod
    def load(cls, directory: str | Path | None = None) -> CocoGroundTruth:
        """Read the positives from ``directory``, by default the data of the ``eccv_caption`` package.

        Raises:
            MissingExtraError: no directory given and ``eccv_caption`` is not installed.
            MissingFileError: a required file is missing.
        """
        if directory is None:
            # The package's data directory is all we need; importing it would only warn about ujson.
            spec = importlib.util.find_spec("eccv_caption")
            if spec is None or not spec.submodule_search_locations:
                raise MissingExtraError(
                    "the COCO extended metrics read their positives from the eccv_caption package: "
                    "pip install 'patchword[coco]' (or pass the directory of ECCV Caption's files)"
                )
            directory = Path(next(iter(spec.submodule_search_locations))) / "data"
        directory = Path(directory)
        needed = [f"{s}_{n}.json" for s in _SOURCES[:3] for n in ("image_to_caption", "caption_to_image")]
        missing = [name for name in [*needed, "coco_test_ids.npy"] if not (directory / name).is_file()]
        if missing:
            raise MissingFileError(f"{directory} lacks the ECCV Caption file(s) {', '.join(missing)}")
        has_pm = all((directory / f"pm_{n}.json").is_file() for n in ("image_to_caption", "caption_to_image"))
        return cls(
            coco=_read_positives(directory, "original"),
            cxc=_read_positives(directory, "cxc"),
            eccv=_read_positives(directory, "eccv"),
            pm=_read_positives(directory, "pm") if has_pm else None,
            coco_ids=np.load(directory / "coco_test_ids.npy").astype(np.int64),
        )

    def standard_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(image ids (5000,), caption ids (25000,)) in the standard 5K order (image i: captions 5i..5i+4)."""
        images = dict.fromkeys(self.coco["t2i"][int(c)][0] for c in self.coco_ids)
        return np.fromiter(images, np.int64), self.coco_ids.copy()


# -- ranking ------------------------------------------------------------------------------------------------


@dataclass
class _Ranked:
    """Where each query's positives rank, summarised per query (O(queries) memory, whatever R is).

    best: (Q,) 0-based rank of the best-ranked positive (+inf: none within the ranked depth);
    num_positives: (Q,) R, the number of distinct positives (absent ones included); hits: (Q,) positives
    in the top R and precision_sum: (Q,) the sum of the precisions at those positives, both only when
    ranked down to each query's R (``to_r``), else None.
    """

    best: np.ndarray
    num_positives: np.ndarray
    hits: np.ndarray | None
    precision_sum: np.ndarray | None

    def recall(self, k: int) -> float:
        return float((self.best < k).mean())

    def rprecision(self) -> float:
        return float((self.hits / self.num_positives).mean())

    def map_at_r(self) -> float:
        # Precision at the j-th positive (1-based) ranked at position p is j / (p + 1); mAP@R averages it
        # over the top R, counting 0 for the non-positives there.
        return float((self.precision_sum / self.num_positives).mean())


class _Ranker:
    """Ranks positives among the candidates (columns) of one queries x candidates score matrix.

    Queries are ranked in blocks that keep the working memory near ``budget_bytes`` (at least one query
    per block): each block takes its rows' top ``depth`` scores (``topk``: much cheaper than sorting 25000
    captions per image) and places every positive among them by binary search, so nothing grows with
    (positives x depth): the plausible-match files list up to 13,380 positives per image. Ranks are exact
    down to the depth; a positive below it gets rank +inf, which no metric with a cut-off (K <= depth, or
    R <= depth) can tell from its true rank. Each metric asks for its own depth (``rank``), so one that
    looks deep (PMRP) does not make the others rank deep.

    Args:
        scores: (N_queries, N) scores (any strided view, e.g. ``sims.T`` for text-to-image).
        query_index, item_index: id -> row, id -> column.
        budget_bytes: the working memory of one block of queries.
    """

    def __init__(self, scores: torch.Tensor, query_index: dict, item_index: dict, budget_bytes: int) -> None:
        self.scores, self.query_index, self.item_index = scores, query_index, item_index
        self.budget_bytes = budget_bytes

    def rank(
        self,
        truth: dict[int, list[int]],
        queries: Sequence[int] | None = None,
        what: str = "",
        *,
        depth: int = 1,
        to_r: bool = False,
    ) -> _Ranked:
        """Ranks of the positives of ``queries`` (default: every query of ``truth``), exact down to
        ``depth`` (the largest K asked for), and with ``to_r`` down to each query's R (R-Precision,
        mAP@R)."""
        queries = list(truth) if queries is None else list(queries)
        missing = [qid for qid in queries if qid not in self.query_index]
        if missing:
            raise DataError(
                f"{len(missing)} of the {len(queries)} {what} query ids are not in the similarity matrix "
                f"(first: {missing[0]}): the COCO extended metrics need the full COCO 5K test split"
            )
        n = self.scores.shape[1]
        # each query's positives de-duplicated once: R counts the distinct ids (absent ones included), the
        # ranking reads the sorted columns of those in the matrix (int32: the PM files list millions)
        num_positives = np.empty(len(queries), np.float64)
        columns = []
        for q, qid in enumerate(queries):
            ids = set(truth[qid])
            num_positives[q] = len(ids)
            columns.append(
                np.array(sorted(self.item_index[i] for i in ids if i in self.item_index), np.int32)
            )
        present = np.array([len(c) for c in columns])
        # each query's depth: the largest K, and with to_r its own R (capped at the candidates)
        need = np.full(len(queries), depth, np.int64)
        if to_r:
            need = np.maximum(need, num_positives.astype(np.int64))
        need = need.clip(1, max(n, 1))
        best = np.full(len(queries), np.inf)
        hits = np.zeros(len(queries)) if to_r else None
        precision_sum = np.zeros(len(queries)) if to_r else None
        per_item = self.scores.element_size()
        start = 0
        while start < len(queries):
            stop, top_depth, width = start + 1, int(need[start]), int(present[start])
            while stop < len(queries):
                d, p = max(top_depth, int(need[stop])), max(width, int(present[stop]))
                # the block's rows, their top scores and indices, and ~a dozen (block, P) temporaries
                if (stop + 1 - start) * (n * per_item + 24 * d + 128 * p) > self.budget_bytes:
                    break
                stop, top_depth, width = stop + 1, d, p
            block = slice(start, stop)
            positions = self._positions(queries[block], columns[block], top_depth)
            best[block] = positions[:, 0]
            if to_r:
                r = num_positives[block, None]
                j = np.arange(1, positions.shape[1] + 1)
                hits[block] = (positions < r).sum(1)
                # a running sum: the same float64 additions in the same order whatever the block's width
                terms = np.where(positions < r, j / (positions + 1), 0.0)
                precision_sum[block] = terms.cumsum(1)[:, -1]
            start = stop
        return _Ranked(best, num_positives, hits, precision_sum)

    def _positions(self, queries: list[int], wanted: list[np.ndarray], depth: int) -> np.ndarray:
        """(B, P) float64 0-based ranks of the positives of one block of queries among the candidates,
        ascending, +inf for a positive below the top ``depth`` and for padding. ``wanted``: per query, the
        ascending columns of its distinct positives."""
        counts = np.array([len(p) for p in wanted], np.int64)
        valid = np.arange(max(1, counts.max(initial=1)))[None, :] < counts[:, None]  # (B, P)
        index = np.zeros(valid.shape, np.int64)
        index[valid] = np.concatenate([*wanted, np.empty(0, np.int32)])
        index, valid = torch.from_numpy(index), torch.from_numpy(valid)
        rows = torch.as_tensor([self.query_index[qid] for qid in queries], dtype=torch.long)
        block = self.scores[rows]  # (B, N) a copy of the block's rows
        top = block.topk(min(depth, block.shape[1]), dim=1, sorted=True).values  # (B, depth) descending
        scores = block.gather(1, index)  # (B, P) the positives' scores
        floor = top[:, -1:]  # the depth-th best score of each query
        # Candidates scoring >= a positive, itself included (a tied negative ranks ahead: pessimistic),
        # counted by binary search in the ascending top. Above the floor they are all in ``top``; a
        # positive at the floor also counts the candidates tied with it outside ``top`` (rare: looked up
        # only for those queries).
        ascending = top.flip(1).contiguous()
        at_least = top.shape[1] - torch.searchsorted(ascending, scores.contiguous(), side="left")
        at_floor = valid & (scores == floor)
        for q in at_floor.any(1).nonzero().squeeze(1).tolist():
            outside = int((block[q] == floor[q]).sum() - (top[q] == floor[q]).sum())
            at_least[q] += at_floor[q] * outside
        # Tied positives keep index order: those with a larger index (later in the row: ``wanted`` is
        # sorted) do not rank ahead. A stable sort keeps that order within each group of equal scores;
        # the padding sorts last (+inf: no valid score is +inf, _as_matrix refuses it).
        ordered, order = scores.masked_fill(~valid, float("inf")).sort(dim=1, stable=True)
        group_end = torch.searchsorted(ordered, ordered, side="right")
        after = group_end - 1 - torch.arange(ordered.shape[1])  # equal scores sorted after each one
        tied_after = torch.empty_like(after).scatter_(1, order, after)
        rank = (at_least - 1 - tied_after).double()
        reached = valid & (scores >= floor)
        positions = torch.where(reached, rank, torch.full_like(rank, float("inf"))).sort(1).values
        return positions.numpy()


# -- the metrics --------------------------------------------------------------------------------------------


def _index(ids: Sequence[int] | np.ndarray, name: str) -> dict[int, int]:
    try:
        values = [int(i) for i in ids]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be integer COCO ids (or their decimal strings): {err}") from err
    index = {v: i for i, v in enumerate(values)}
    if len(index) != len(values):
        raise ValueError(f"{name} holds duplicate ids")
    return index


def _check_alignment(gt: CocoGroundTruth, image_ids, caption_ids, txt2img) -> None:
    """Raise if caption row j is not a COCO caption of image row ``txt2img[j]``."""
    txt2img = np.asarray(txt2img, np.int64)
    if txt2img.shape != (len(caption_ids),):
        raise ValueError(f"txt2img must have shape ({len(caption_ids)},), got {txt2img.shape}")
    for j, (cid, row) in enumerate(zip(caption_ids, txt2img, strict=True)):
        owners = gt.coco["t2i"].get(int(cid))
        if owners is None or int(image_ids[row]) not in owners:
            raise DataError(
                f"caption row {j} (COCO caption id {int(cid)}) belongs to image "
                f"{owners[0] if owners else 'unknown'}, but the split pairs it with image row {row} (id "
                f"{int(image_ids[row])}): the ids are not in the split's order"
            )


def _as_matrix(x, name: str, shape: tuple[int, int]) -> torch.Tensor:
    """A (N_img, N_txt) floating-point score matrix on the host; ``-inf`` (not shortlisted) is allowed,
    NaN and ``+inf`` are not (as in :func:`patchword.eval.metrics.retrieval_metrics`)."""
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).detach().cpu()
    if x.dim() != 2 or tuple(x.shape) != shape:
        raise ValueError(
            f"{name} must have shape (len(image_ids), len(caption_ids)) = {shape}, got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point matrix, got dtype {x.dtype}")
    refuse_nan_and_posinf(x, name)
    return full_precision(x)


def coco_extended_metrics(
    sims: torch.Tensor | np.ndarray | Sequence[torch.Tensor | np.ndarray],
    image_ids: Sequence[int] | np.ndarray | None = None,
    caption_ids: Sequence[int] | np.ndarray | None = None,
    metrics: Sequence[str] = DEFAULT_COCO_EXTENDED_METRICS,
    ks: Sequence[int] = (1, 5, 10),
    *,
    ground_truth: CocoGroundTruth | str | Path | None = None,
    txt2img: Sequence[int] | np.ndarray | None = None,
    max_memory_mb: float | None = None,
) -> dict[str, dict[str, float]]:
    """ECCV Caption, CxC and COCO metrics of a COCO 5K similarity matrix (see the module docstring).

    ``pmrp`` here is the exact R-Precision with the plausible-match positives over the whole ranking: the
    share of positives among a query's top R (R = its number of positives, up to 13,380 for an image).
    The ECCV Caption paper reports a "modified PMRP" on top-K lists (K = 50 for COCO 5K), which is what
    the ``eccv_caption`` package computes from such lists: the precision of the top min(R, K), i.e. of the
    whole list when R > K. The two can differ whenever R > K: with R = 6 positives ranked 1st, 2nd, 3rd
    and below 6th, the exact value is 3/6 = 0.5, the modified one on a top-4 list 3/4 = 0.75. Do not
    compare this ``pmrp`` with the paper's PMRP column.

    Args:
        sims: (N_img, N_txt) similarities, rows = ``image_ids``, columns = ``caption_ids``; or the pair
            ``(sims_i2t, sims_t2i)`` of a two-stage search (``-inf`` = not shortlisted: ranked last).
            A pair takes no ``coco_1k_*`` metric: a two-stage search's 1K folds each run their own search
            (:func:`patchword.eval.evaluate`), which its 5K shortlists cannot stand for.
        image_ids: COCO image ids of the rows (default: the standard 5K order).
        caption_ids: COCO caption (annotation) ids of the columns (default: the standard 5K order,
            ``coco_test_ids.npy``, i.e. the line order of ``testall_caps.txt``).
        metrics: names from :data:`COCO_EXTENDED_METRICS` (default: ``eccv_caption``'s default).
        ks: the K of the ``*_recalls`` metrics (at least one when one is asked for).
        ground_truth: a :class:`CocoGroundTruth`, a directory of ECCV Caption's files, or None for the
            data of the ``eccv_caption`` package.
        txt2img: (N_txt,) the split's caption -> image row map; when given, every caption id is checked to
            be a COCO caption of its row's image id (catches a split read in another order).
        max_memory_mb: working memory of the ranking (blocks of queries; default 256 MB); only memory and
            speed depend on it, never the result.
    Returns:
        ``{name: {"i2t": value, "t2i": value}}`` with values in [0, 1]; recall metrics are named
        ``{dataset}_r{K}`` as in ``eccv_caption``.
    Raises:
        ConfigError: an unknown metric, or ``pmrp`` without its files.
        ValueError: NaN or ``+inf`` scores, an empty ``ks`` for a ``*_recalls`` metric, a ``coco_1k_*``
            metric of a two-stage pair, a wrong shape.
        DataError: a query id of a requested metric is not in ``sims``; ids that do not match ``txt2img``.
    """
    unknown = [m for m in metrics if m not in COCO_EXTENDED_METRICS]
    if unknown:
        raise ConfigError(
            "metrics", f"unknown COCO extended metric(s) {unknown}; choose from {COCO_EXTENDED_METRICS}"
        )
    if any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {list(ks)}")
    recalls = [m for m in metrics if m.endswith("_recalls")]
    if recalls and not len(ks):
        raise ValueError(f"ks is empty: {recalls[0]} reports R@K for every K of ks; give at least one K")
    if max_memory_mb is not None and not 0 < max_memory_mb < math.inf:
        raise ValueError(f"max_memory_mb must be a positive number, got {max_memory_mb!r}")
    pair = isinstance(sims, (tuple, list))
    one_k = [m for m in metrics if m.startswith("coco_1k")]
    if pair and one_k:
        raise ValueError(
            f"{one_k[0]}: the folds of a two-stage (sims_i2t, sims_t2i) pair would cut the 5K search's "
            "shortlists, while a two-stage search's COCO 1K folds each run their own search (coco1k_* of "
            "patchword.eval.evaluate with eval.coco_1k=true): leave coco_1k_* out of metrics"
        )
    gt = ground_truth if isinstance(ground_truth, CocoGroundTruth) else CocoGroundTruth.load(ground_truth)
    if "pmrp" in metrics and gt.pm is None:
        raise ConfigError(
            "metrics", "pmrp needs the plausible-match files pm_{image_to_caption,caption_to_image}.json"
        )
    default_images, default_captions = gt.standard_ids()
    image_ids = default_images if image_ids is None else np.asarray(image_ids)
    caption_ids = default_captions if caption_ids is None else np.asarray(caption_ids)
    shape = (len(image_ids), len(caption_ids))
    if pair:
        if len(sims) != 2:
            raise ValueError("sims must be one (N_img, N_txt) matrix or a pair (sims_i2t, sims_t2i)")
        sims_i2t, sims_t2i = (_as_matrix(m, f"sims[{i}]", shape) for i, m in enumerate(sims))
    else:
        sims_i2t = sims_t2i = _as_matrix(sims, "sims", shape)
    if txt2img is not None:
        _check_alignment(gt, image_ids, caption_ids, txt2img)
    rows, cols = _index(image_ids, "image_ids"), _index(caption_ids, "caption_ids")
    budget = int((_DEFAULT_MEMORY_MB if max_memory_mb is None else max_memory_mb) * (1 << 20))
    wanted = set(metrics)
    rankers = {
        "i2t": _Ranker(sims_i2t, rows, cols, budget),
        "t2i": _Ranker(sims_t2i.T, cols, rows, budget),
    }

    def ranked(truth: Positives, what: str, **how) -> dict[str, _Ranked]:
        return {d: r.rank(truth[d], what=f"{what} {d}", **how) for d, r in rankers.items()}

    out: dict[str, dict[str, float]] = {}
    for name, truth in (("coco_5k", gt.coco), ("cxc", gt.cxc), ("eccv", gt.eccv)):
        cutoffs = list(ks) if f"{name}_recalls" in wanted else [1] if f"{name}_r1" in wanted else []
        eccv_extra = name == "eccv" and bool(wanted & {"eccv_rprecision", "eccv_map_at_r"})
        if not cutoffs and not eccv_extra:
            continue
        # each metric ranks as deep as it looks: R@K down to K, R-Precision and mAP@R down to R
        by_direction = ranked(truth, name, depth=max(cutoffs, default=1), to_r=eccv_extra)
        for k in cutoffs:
            out[f"{name}_r{k}"] = {d: r.recall(k) for d, r in by_direction.items()}
        if "eccv_rprecision" in wanted and name == "eccv":
            out["eccv_rprecision"] = {d: r.rprecision() for d, r in by_direction.items()}
        if "eccv_map_at_r" in wanted and name == "eccv":
            out["eccv_map_at_r"] = {d: r.map_at_r() for d, r in by_direction.items()}
    cutoffs = list(ks) if "coco_1k_recalls" in wanted else [1] if "coco_1k_r1" in wanted else []
    if cutoffs:
        folds = _coco_1k_folds(gt, sims_i2t, rows, cols, max(cutoffs), budget)
        for k in cutoffs:
            out[f"coco_1k_r{k}"] = {
                d: float(np.mean([f[d].recall(k) for f in folds])) for d in ("i2t", "t2i")
            }
    if "pmrp" in wanted:
        out["pmrp"] = {d: r.rprecision() for d, r in ranked(gt.pm, "pmrp", to_r=True).items()}
    return out


def _coco_1k_folds(
    gt: CocoGroundTruth, sims: torch.Tensor, rows: dict, cols: dict, depth: int, budget: int
) -> list[dict[str, _Ranked]]:
    """Each 1K fold ranked on its own: its captions and images only (consecutive fifths of the 5K order)."""
    size = len(gt.coco_ids) // 5
    folds = []
    for f in range(5):
        fold_captions = [int(c) for c in gt.coco_ids[f * size : (f + 1) * size]]
        fold_images = list(dict.fromkeys(gt.coco["t2i"][c][0] for c in fold_captions))
        missing = [c for c in fold_captions if c not in cols] + [i for i in fold_images if i not in rows]
        if missing:
            raise DataError(
                f"COCO 1K fold {f} has {len(missing)} id(s) missing from the similarity matrix (first: "
                f"{missing[0]}): the COCO 1K metrics need the full COCO 5K test split"
            )
        img_rows = torch.as_tensor([rows[i] for i in fold_images])
        cap_cols = torch.as_tensor([cols[c] for c in fold_captions])
        block = sims[img_rows][:, cap_cols]
        local_img = {i: n for n, i in enumerate(fold_images)}
        local_cap = {c: n for n, c in enumerate(fold_captions)}
        i2t = _Ranker(block, local_img, local_cap, budget)
        t2i = _Ranker(block.T, local_cap, local_img, budget)
        folds.append(
            {
                "i2t": i2t.rank(gt.coco["i2t"], fold_images, "coco_1k i2t", depth=depth),
                "t2i": t2i.rank(gt.coco["t2i"], fold_captions, "coco_1k t2i", depth=depth),
            }
        )
    return folds


def coco_extended_percent(result: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flatten a :func:`coco_extended_metrics` result for ``metrics.json``: ``{metric}_{direction}`` keys
    (``eccv_map_at_r_i2t``), values in percent like the other recalls there."""
    return {f"{name}_{d}": 100.0 * value for name, values in result.items() for d, value in values.items()}
