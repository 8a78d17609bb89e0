"""Retrieval metrics: Recall@K, median and mean rank for image->text and text->image search.

The conventions follow the SCAN / VSE++ evaluators that SEPS, LAPS, NAAF and TGDT all copy, with three
deliberate differences (SPEC decision 7):

* any number of captions per image, given by an explicit caption -> image map ``txt2img`` instead of
  "captions ``5k..5k+4`` belong to image ``k``";
* score ties are broken deterministically and pessimistically: a ground truth tied with a negative ranks
  *behind* it (``np.argsort`` in the official code leaves tie order arbitrary);
* an entry of ``-inf`` means "not in the shortlist" of a two-stage search, and a ground truth that is not
  in the shortlist is a miss. The official TGDT hybrid evaluator records rank 0 (a hit at R@1) instead.

Ranks are 0-based internally and reported 1-based (``medr = floor(median) + 1``, ``meanr = mean + 1``), as
the official evaluators do. Everything is vectorised and processed in blocks of queries, so a COCO 5K
matrix (5000 x 25000) is ranked without materialising a second full-size tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from patchword._validation import check_positive_int, check_tensor
from patchword.errors import ConfigError

__all__ = [
    "COCO_1K_FOLDS",
    "COCO_1K_FOLD_IMAGES",
    "RANK_KEYS",
    "RECALL_KEYS",
    "RECALL_KS",
    "retrieval_ranks",
    "retrieval_metrics",
    "coco_1k_folds",
]

#: The cut-offs reported by every retrieval paper this library reproduces.
RECALL_KS: tuple[int, ...] = (1, 5, 10)
#: The recall figures of :func:`retrieval_metrics` (percent) and their sum, in the order tables show them.
RECALL_KEYS: tuple[str, ...] = (*(f"{d}_r{k}" for d in ("i2t", "t2i") for k in RECALL_KS), "rsum")
#: Its rank statistics (median and mean rank of the ground truth, 1-based).
RANK_KEYS: tuple[str, ...] = ("i2t_medr", "t2i_medr", "i2t_meanr", "t2i_meanr")

# Elements of one query block, a (queries, candidates) comparison. 2**24 keeps the per-block temporaries
# to a few hundred MB whatever the matrix size (measured: ~0.3 GB above the 0.5 GB input for COCO 5K).
_BLOCK_ELEMENTS = 1 << 24

SimsLike = torch.Tensor | np.ndarray | Sequence[torch.Tensor | np.ndarray]


def _as_score_matrix(x: object, name: str) -> torch.Tensor:
    """Validate one (N_img, N_txt) score matrix; ``-inf`` is allowed, NaN and ``+inf`` are not."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    x = check_tensor(x, name, ndim=2, finite=False)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one image and one caption, got shape {tuple(x.shape)}")
    refuse_nan_and_posinf(x, name)
    return x


def refuse_nan_and_posinf(x: torch.Tensor, name: str) -> None:
    """Raise ValueError when score matrix ``x`` holds NaN or ``+inf`` (``-inf``: not shortlisted, allowed).

    One reduction without a full-size temporary: ``max()`` propagates NaN and is ``+inf`` if any entry is;
    the entries are counted only for the message."""
    top = x.max()
    if bool(torch.isnan(top)):
        raise ValueError(f"{name} contains {int(torch.isnan(x).sum())} NaN value(s)")
    if bool(torch.isposinf(top)):
        raise ValueError(
            f"{name} contains {int(torch.isposinf(x).sum())} +inf value(s); only -inf (not shortlisted) "
            "is allowed"
        )


def _as_sims_pair(sims: SimsLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(sims_i2t, sims_t2i)``: the same matrix twice for the single-matrix form."""
    if isinstance(sims, (torch.Tensor, np.ndarray)):
        single = _as_score_matrix(sims, "sims")
        return single, single
    if not isinstance(sims, Sequence) or isinstance(sims, str) or len(sims) != 2:
        raise ValueError(
            "sims must be an (N_img, N_txt) matrix or a pair (sims_i2t, sims_t2i) of such matrices, "
            f"got {type(sims).__name__}"
        )
    i2t = _as_score_matrix(sims[0], "sims[0] (i2t)")
    t2i = _as_score_matrix(sims[1], "sims[1] (t2i)")
    if i2t.shape != t2i.shape:
        raise ValueError(
            f"sims: the i2t and t2i matrices must have the same shape, got {tuple(i2t.shape)} "
            f"and {tuple(t2i.shape)}"
        )
    if i2t.device != t2i.device:
        raise ValueError(f"sims: the two matrices are on different devices ({i2t.device}, {t2i.device})")
    return i2t, t2i


def check_txt2img(
    txt2img: object,
    n_txt: int,
    n_rows: int | None,
    *,
    rows: str = "images",
    name: str = "txt2img",
    device: torch.device | None = None,
) -> torch.Tensor:
    """Validate an (n_txt,) caption -> row map (a tensor, array or sequence) and return it as int64, on
    ``device`` (None: where it is).

    Integer dtype (a float map would be truncated, 0.9 -> row 0, and a bool mask read as rows 0 and 1),
    one entry per caption, ids in ``[0, n_rows)`` (``n_rows`` None: any id >= 0; ``rows`` names them in
    the message). Reads the values once: one wait for the device when the map is on one.

    Raises:
        ValueError: naming ``name``.
    """
    if isinstance(txt2img, np.ndarray):
        try:
            txt2img = torch.from_numpy(txt2img)
        except TypeError as err:  # an object or string array
            raise ValueError(f"{name} must be a 1-D integer tensor: {err}") from err
    elif not isinstance(txt2img, torch.Tensor):
        try:
            txt2img = torch.as_tensor(txt2img)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{name} must be a 1-D integer tensor: {err}") from err
    check_tensor(txt2img, name, shape=(n_txt,), floating=False, finite=False)
    if txt2img.is_floating_point() or txt2img.is_complex() or txt2img.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer indices, got dtype {txt2img.dtype}")
    txt2img = txt2img.to(device=txt2img.device if device is None else device, dtype=torch.long)
    if not n_txt:
        return txt2img
    lo, hi = torch.stack(torch.aminmax(txt2img)).tolist()  # one read of the values
    if lo < 0 or (n_rows is not None and hi >= n_rows):
        bound = "negative" if n_rows is None else f"outside the {n_rows} {rows}"
        raise ValueError(f"{name} has values in [{lo}, {hi}], {bound}")
    return txt2img


def _as_txt2img(txt2img: object, n_img: int, n_txt: int, device: torch.device) -> torch.Tensor:
    """Validate the (N_txt,) caption -> image map; every image needs at least one caption."""
    txt2img = check_txt2img(txt2img, n_txt, n_img, rows="images of sims", device=device)
    counts = torch.bincount(txt2img, minlength=n_img)
    n_orphans = int((counts == 0).sum())
    if n_orphans:
        first = int((counts == 0).nonzero()[0])
        raise ValueError(
            f"txt2img gives {n_orphans} image(s) no caption (first: image {first}); every image needs at "
            "least one ground-truth caption"
        )
    return txt2img


def _block_size(chunk_size: int | None, n_candidates: int) -> int:
    """Queries per block: the caller's choice, or as many as fit the element budget."""
    if chunk_size is None:
        return max(1, _BLOCK_ELEMENTS // n_candidates)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return chunk_size


def _t2i_ranks(sims: torch.Tensor, txt2img: torch.Tensor, block: int) -> torch.Tensor:
    """(N_txt,) 0-based rank of each caption's image among all N_img images; a miss ranks N_img."""
    n_img, n_txt = sims.shape
    ranks = torch.empty(n_txt, dtype=torch.long, device=sims.device)
    for start in range(0, n_txt, block):
        cols = slice(start, min(start + block, n_txt))
        scores = sims[:, cols]  # (N_img, c)
        gt = scores.gather(0, txt2img[cols].unsqueeze(0))  # (1, c)
        # ">=" counts every image tied with the ground truth (pessimistic ties) and the ground truth
        # itself exactly once, hence the "- 1".
        rank = (scores >= gt).sum(0) - 1
        ranks[cols] = torch.where(torch.isneginf(gt[0]), n_img, rank)
    return ranks


def _i2t_ranks(sims: torch.Tensor, txt2img: torch.Tensor, block: int) -> torch.Tensor:
    """(N_img,) 0-based rank of each image's best caption among the negatives; a miss ranks N_txt."""
    n_img, n_txt = sims.shape
    ranks = torch.empty(n_img, dtype=torch.long, device=sims.device)
    for start in range(0, n_img, block):
        rows = torch.arange(start, min(start + block, n_img), device=sims.device)
        scores = sims[start : start + len(rows)]  # (r, N_txt)
        is_gt = txt2img.unsqueeze(0) == rows.unsqueeze(1)  # (r, N_txt)
        best = scores.masked_fill(~is_gt, -math.inf).amax(1, keepdim=True)  # (r, 1)
        # Only negatives compete with the best ground truth: tied ground-truth captions do not push each
        # other down, a tied negative does.
        rank = ((scores >= best) & ~is_gt).sum(1)
        ranks[start : start + len(rows)] = torch.where(torch.isneginf(best[:, 0]), n_txt, rank)
    return ranks


def retrieval_ranks(
    sims: SimsLike, txt2img: object, *, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """0-based ranks of the ground truth for every query, in both directions.

    Args:
        sims: an (N_img, N_txt) score matrix (higher is better), or a pair ``(sims_i2t, sims_t2i)`` of
            such matrices (two-stage search: image queries are ranked with the first, caption queries
            with the second). ``-inf`` marks a candidate outside the query's shortlist. Tensor or ndarray,
            any floating dtype; ranking happens on the matrix's device and dtype.
        txt2img: (N_txt,) integer index of the image each caption describes. Any number of captions per
            image, at least one.
        chunk_size: queries per block (default: as many as keep a block near 2**24 elements).

    Returns:
        ``(i2t_ranks, t2i_ranks)``, int64 tensors of shape (N_img,) and (N_txt,).
        ``i2t_ranks[v]`` = number of non-ground-truth captions scoring >= the best ground-truth caption of
        image ``v``; ``t2i_ranks[c]`` = number of other images scoring >= the ground-truth image of
        caption ``c``. A query whose ground truth is ``-inf`` everywhere gets rank = number of candidates
        (N_txt resp. N_img), one past the last position, so it is never a hit.
    """
    sims_i2t, sims_t2i = _as_sims_pair(sims)
    n_img, n_txt = sims_i2t.shape
    txt2img = _as_txt2img(txt2img, n_img, n_txt, sims_i2t.device)
    i2t = _i2t_ranks(sims_i2t, txt2img, _block_size(chunk_size, n_txt))
    t2i = _t2i_ranks(sims_t2i, txt2img, _block_size(chunk_size, n_img))
    return i2t, t2i


def _median(ranks: torch.Tensor) -> float:
    """Median as ``np.median`` computes it: an even count averages the two middle values.

    ``torch.median`` returns the lower middle value instead, which would change ``medr``.
    """
    ordered = ranks.sort().values
    n = ordered.numel()
    return (float(ordered[(n - 1) // 2]) + float(ordered[n // 2])) / 2


def _summarise(ranks: torch.Tensor, n_candidates: int, prefix: str) -> dict[str, float]:
    """R@K (percent), medr and meanr (1-based) of one direction's 0-based ranks."""
    # A miss (rank == n_candidates) stays a miss even when K exceeds the number of candidates.
    found = ranks < n_candidates
    n = ranks.numel()
    # Integer counts divided in Python: exact percentages whatever the device or dtype.
    out = {f"{prefix}_r{k}": 100.0 * int(((ranks < k) & found).sum()) / n for k in RECALL_KS}
    out[f"{prefix}_medr"] = math.floor(_median(ranks)) + 1.0
    out[f"{prefix}_meanr"] = int(ranks.sum()) / n + 1.0
    return out


def retrieval_metrics(sims: SimsLike, txt2img: object, *, chunk_size: int | None = None) -> dict[str, float]:
    """Recall@{1,5,10}, rSum, median and mean rank for image->text (i2t) and text->image (t2i) search.

    Args:
        sims: an (N_img, N_txt) score matrix or a pair ``(sims_i2t, sims_t2i)``; see
            :func:`retrieval_ranks`, which also defines ranks, ties and ``-inf`` shortlist misses.
        txt2img: (N_txt,) integer image index of each caption.
        chunk_size: queries per block; only memory and speed depend on it, never the result.

    Returns:
        Python floats, recalls in percent: ``i2t_r1 i2t_r5 i2t_r10 t2i_r1 t2i_r5 t2i_r10 rsum`` (the sum
        of the six recalls) and ``i2t_medr t2i_medr i2t_meanr t2i_meanr`` (1-based ranks).

    Raises:
        ValueError: for a non-2-D ``sims``, NaN or ``+inf`` scores, mismatched pair shapes, a
            ``txt2img`` of the wrong shape or with out-of-range values, or an image without captions.
    """
    i2t, t2i = retrieval_ranks(sims, txt2img, chunk_size=chunk_size)
    stats = {
        **_summarise(i2t, n_candidates=t2i.numel(), prefix="i2t"),
        **_summarise(t2i, n_candidates=i2t.numel(), prefix="t2i"),
    }
    recall_keys = [f"{d}_r{k}" for d in ("i2t", "t2i") for k in RECALL_KS]
    rank_keys = ["i2t_medr", "t2i_medr", "i2t_meanr", "t2i_meanr"]
    return {
        **{key: stats[key] for key in recall_keys},
        "rsum": sum(stats[key] for key in recall_keys),
        **{key: stats[key] for key in rank_keys},
    }


def fold_bounds(n_img: int, n_folds: int) -> list[tuple[int, int]]:
    """Contiguous image ranges ``[f*N//n_folds, (f+1)*N//n_folds)``."""
    if isinstance(n_folds, bool) or not isinstance(n_folds, int) or not 1 <= n_folds <= n_img:
        raise ValueError(f"n_folds must be an int in [1, {n_img}] (the number of images), got {n_folds!r}")
    return [(f * n_img // n_folds, (f + 1) * n_img // n_folds) for f in range(n_folds)]


#: The COCO 1K protocol: the 5K test split (``testall``) cut into five folds of 1000 images.
COCO_1K_FOLDS = 5
COCO_1K_FOLD_IMAGES = 1000


def check_fold_geometry(n_img: int, n_folds: int, fold_size: int, *, setting: str | None = None) -> None:
    """Raise unless ``n_img`` images make exactly ``n_folds`` folds of ``fold_size`` images: the one check of
    the COCO 1K split size (:func:`coco_1k_folds`, and :func:`patchword.eval.protocol.check_coco_1k` before
    anything is scored).

    ``coco1k_*`` promises folds of 1000 images: on a 1000-image split :func:`fold_bounds` would make folds
    of 200 (five times fewer distractors, inflated recall), on 7 images folds of 1, 1, 1, 2 and 2.

    Args:
        setting: the config key that asked for the folds (``eval.coco_1k``): the error is then a
            :class:`ConfigError` naming it, about the evaluated split; None: a ValueError about the matrix.
    """
    n_folds, fold_size = check_positive_int("n_folds", n_folds), check_positive_int("fold_size", fold_size)
    want = n_folds * fold_size
    if n_img == want:
        return
    if setting is not None:
        raise ConfigError(
            setting,
            f"the COCO 1K protocol averages {n_folds} folds of {fold_size} images of the COCO 5K test split "
            f"({want} images), but the evaluated split has {n_img} images: set data.test_split=testall "
            f"(COCO 5K), or {setting}=false",
        )
    coco = (n_folds, fold_size) == (COCO_1K_FOLDS, COCO_1K_FOLD_IMAGES)
    raise ValueError(
        f"the COCO 1K protocol needs {n_folds} folds of {fold_size} images = {want} "
        f"images{' (the COCO 5K test split: data.test_split=testall)' if coco else ''}, got a matrix "
        f"of {n_img} images"
    )


def coco_1k_folds(
    sims: SimsLike,
    txt2img: object,
    n_folds: int = COCO_1K_FOLDS,
    *,
    fold_size: int = COCO_1K_FOLD_IMAGES,
    chunk_size: int | None = None,
    setting: str | None = None,
) -> dict[str, Any]:
    """The COCO 1K protocol computed from the full (5K) matrix: metrics averaged over image folds.

    Fold ``f`` holds images ``[f*fold_size, (f+1)*fold_size)`` and exactly the captions whose ``txt2img``
    falls in that range, wherever they sit in the caption axis and however many there are per image.
    Each fold is scored on its own sub-matrix with :func:`retrieval_metrics`; unlike the official
    evaluators the folds are sliced from one matrix instead of being re-scored from scratch, which is the
    same for a matrix scored pair by pair. It is not for a two-stage search: each fold's shortlists must be
    drawn from the fold (:func:`patchword.eval.evaluate` re-runs the search per fold), not cut from the 5K
    search's.

    Args:
        sims: an (N_img, N_txt) matrix or a pair ``(sims_i2t, sims_t2i)``, as in :func:`retrieval_metrics`.
        txt2img: (N_txt,) integer image index of each caption.
        n_folds: number of contiguous image folds (5 for COCO 5K -> 5 x 1K).
        fold_size: images per fold (1000 for COCO 1K); ``N_img`` must be exactly ``n_folds * fold_size``.
        chunk_size: forwarded to :func:`retrieval_metrics`.
        setting: the config key that asked for the folds, named by a size error (:func:`check_fold_geometry`).

    Returns:
        Every key of :func:`retrieval_metrics` averaged over folds (``rsum`` is therefore the mean of the
        per-fold rSums, as in the official code), plus ``"folds"``: the list of per-fold metric dicts.

    Raises:
        ValueError: ``sims`` does not hold ``n_folds * fold_size`` images (by default: not COCO 5K; a
            ConfigError naming ``setting`` where given), or any error of :func:`retrieval_metrics`.
    """
    sims_i2t, sims_t2i = _as_sims_pair(sims)
    n_img, n_txt = sims_i2t.shape
    check_fold_geometry(n_img, n_folds, fold_size, setting=setting)
    txt2img = _as_txt2img(txt2img, n_img, n_txt, sims_i2t.device)
    folds = []
    for lo, hi in fold_bounds(n_img, n_folds):
        cols = fold_columns(txt2img, lo, hi)
        fold_i2t = sims_i2t[lo:hi, cols]  # advanced indexing copies: slice once in the single-matrix form
        fold_t2i = fold_i2t if sims_t2i is sims_i2t else sims_t2i[lo:hi, cols]
        folds.append(retrieval_metrics((fold_i2t, fold_t2i), txt2img[cols] - lo, chunk_size=chunk_size))
    return {**fold_mean(folds), "folds": folds}


def fold_columns(txt2img: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The caption columns of images ``lo..hi-1``, in caption order (``EncodedSplit.select_images``'s)."""
    return ((txt2img >= lo) & (txt2img < hi)).nonzero().squeeze(1)


def fold_mean(folds: Sequence[dict[str, float]]) -> dict[str, float]:
    """Every key averaged over the folds (``rsum`` is the mean of the per-fold rSums, as officially)."""
    return {key: sum(fold[key] for fold in folds) / len(folds) for key in folds[0]}
