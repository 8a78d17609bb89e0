"""The one evaluation protocol: how a model is scored on a split, for validation, test, ``patchword eval``
and ensembles alike.

* Every image, caption and dense caption is encoded once (the official code re-encodes each image once
  per caption).
* A matcher is ranked on its full (N_img, N_txt) matrix, exactly, in bounded memory
  (:func:`~patchword.eval.score_matrix`), unless it declares a two-stage plan
  (:meth:`Matcher.two_stage_plan`: TGDT's hybrid search), in which case it is searched that way (global
  shortlist, fine re-ranking, a ground truth outside the shortlist is a miss) in validation and test alike.
* ``eval.coco_1k`` adds the COCO 1K protocol: five 1000-image folds of the 5K test, averaged; each fold of
  a two-stage search runs its own search, as the official fold-wise evaluation does, for one model and
  for an ensemble alike (a two-stage member's fold scores come from its own search of the fold, never
  from cutting its 5K shortlists). A split of any other size than 5 x 1000 images is refused before
  anything is scored: folds of 200 images (a 1K split) would report recall against five times fewer
  distractors under the same ``coco1k_*`` label.
* Under ``torchrun`` (a :class:`~patchword.distributed.Distributed` with several processes) the processes
  share the work: each encodes a contiguous block of the images and of the captions (the caption tokens
  are then all-gathered: every process scores its images against every caption), scores its block of
  image rows within ``eval.max_memory_mb``, and rank 0 gathers the rows, computes the metrics and
  broadcasts them. A two-stage search shards its queries the same way. The metrics equal a one-process
  evaluation's.

Over 400 lines: the one protocol every caller shares (matrix, two-stage search, COCO 1K folds, ensembles,
cost record) stays in one module, so no path can drift from the others.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from patchword.data.pipeline import EncodedSplit, SelectedImages
from patchword.device import describe_device, peak_host_rss_mb, reset_peak_host_rss
from patchword.distributed import Distributed
from patchword.eval.config import EvalConfig
from patchword.eval.engine import score_matrix
from patchword.eval.engine.memory import configured_budget_mb
from patchword.eval.metrics import (
    COCO_1K_FOLD_IMAGES,
    COCO_1K_FOLDS,
    check_fold_geometry,
    coco_1k_folds,
    fold_bounds,
    fold_columns,
    fold_mean,
    retrieval_metrics,
)
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens, eval_mode
from patchword.eval.two_stage import two_stage_scores

__all__ = [
    "evaluation_cost",
    "score_split",
    "evaluate",
    "ensemble_metrics",
    "average_scores",
    "score_spread",
    "spreads_disagree",
    "check_coco_1k",
    "COCO_FOLDS",
    "COCO_FOLD_IMAGES",
]

#: The COCO 1K folds: ``eval.coco_1k`` needs a split of exactly COCO_FOLDS x COCO_FOLD_IMAGES images.
COCO_FOLDS = COCO_1K_FOLDS
COCO_FOLD_IMAGES = COCO_1K_FOLD_IMAGES
#: The setting that asks for them, named by the size check.
_COCO_1K_KEY = "eval.coco_1k"

Sims = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def _encode_shard(model, split: EncodedSplit, eval_cfg: EvalConfig, dist: Distributed, *, device, progress):
    """Encode this process's share of ``split`` once (each image, caption and dense caption once; the
    official code re-encodes an image per caption): -> (img, cap, dense, dense_lens, (lo, hi)), float32
    (float64 from a float64 model) on the CPU. Dense captions are encoded only when the matcher reads them.

    ``img`` holds the images ``lo..hi`` (this process's block), ``cap`` every caption (each process encodes
    its block, then they are all-gathered), ``dense`` the dense captions of the images held, or of every
    image when dense text is tied to captions (which then index it through ``txt2img``).
    """
    lo, hi = dist.shard(split.num_images)
    t_lo, t_hi = dist.shard(split.num_captions)
    dense = dense_lens = None
    # a process that fails here (its device's memory) fails every process, with its reason, before the
    # gathers below
    with eval_mode(model), dist.fail_together("encoding its images and captions"):
        images = SelectedImages(split.images, torch.arange(lo, hi))
        img = encode_image_tokens(
            model, images, batch_size=eval_cfg.batch_size, device=device, progress=progress
        )
        cap = encode_text_tokens(
            model,
            split.cap_ids[t_lo:t_hi],
            split.cap_lens[t_lo:t_hi],
            batch_size=2 * eval_cfg.batch_size,
            device=device,
            progress=progress,
        )
        if split.dense_ids is not None and model.matcher.consumes_dense:
            dense = encode_text_tokens(
                model,
                split.dense_ids[lo:hi],
                split.dense_lens[lo:hi],
                batch_size=eval_cfg.batch_size,
                device=device,
                progress=progress,
                desc="encode dense captions",
            )
            dense_lens = split.dense_lens[lo:hi]
    cap = dist.all_gather_cpu(cap, dist.shard_sizes(split.num_captions))
    if dense is not None and model.matcher.dense_pairing == "caption":
        dense = dist.all_gather_cpu(dense, dist.shard_sizes(split.num_images))
        dense_lens = split.dense_lens
    return img, cap, dense, dense_lens, (lo, hi)


def _sharded(dist: Distributed | None, split: EncodedSplit, device) -> Distributed:
    """``dist`` when the split has work for every process, else a one-process view (each process then
    computes the whole, small, evaluation itself)."""
    if dist is None or not dist.enabled or min(split.num_images, split.num_captions) < dist.world_size:
        return Distributed(device=torch.device(device))
    return dist


def score_split(
    model,
    split: EncodedSplit,
    eval_cfg: EvalConfig,
    *,
    device="cpu",
    progress=None,
    dist=None,
    timings: dict[str, float] | None = None,
) -> torch.Tensor | None:
    """The exact (N_img, N_txt) similarity matrix of ``split`` within ``eval_cfg.max_memory_mb``.

    With ``dist`` (several processes) every process scores its block of image rows and the matrix is
    returned on rank 0 only (None elsewhere). ``timings``, when given, receives this process's
    ``encode_seconds``, ``scoring_seconds`` and the ``pairs`` it scored.
    """
    dist = _sharded(dist, split, device)
    start = time.perf_counter()
    img, cap, dense, dense_lens, _ = _encode_shard(
        model, split, eval_cfg, dist, device=device, progress=progress
    )
    encoded = time.perf_counter()
    # one process's failure (non-finite tokens among its images, its device's memory) fails every
    # process with its reason, rather than leaving the others in the gather below
    with eval_mode(model), dist.fail_together("scoring its image rows"):
        rows = score_matrix(
            model.matcher,
            img,
            cap,
            split.cap_lens,
            dense,
            dense_lens,
            txt2img=split.txt2img,
            max_memory_mb=configured_budget_mb(eval_cfg.max_memory_mb, device),
            device=device,
            progress=progress,
            precision=eval_cfg.precision,
        )
    if timings is not None:  # the matrix is on the host by now: the time includes the device's work
        timings.update(encode_seconds=encoded - start, scoring_seconds=time.perf_counter() - encoded)
        timings["pairs"] = img.shape[0] * cap.shape[0]
    return dist.gather_cpu(rows)


def _two_stage(
    model, split: EncodedSplit, eval_cfg: EvalConfig, plan, *, device, progress, dist=None
) -> dict[str, Any] | None:
    """Metrics of the two-stage search ``plan`` on ``split``, plus ``"sims"`` = (sims_i2t, sims_t2i); on
    rank 0 only with several processes (None elsewhere)."""
    dist = _sharded(dist, split, device)
    img, cap, _, _, _ = _encode_shard(model, split, eval_cfg, dist, device=device, progress=progress)
    result = two_stage_scores(
        plan.fine,
        img,
        cap,
        split.cap_lens,
        k=(plan.k_i2t, plan.k_t2i),
        alpha=plan.alpha,
        max_memory_mb=configured_budget_mb(eval_cfg.max_memory_mb, device),
        device=device,
        progress=progress,
        dist=dist,
    )
    if result is None:
        return None
    metrics: dict[str, Any] = retrieval_metrics(result.sims, split.txt2img)
    # How often the ground truth never reaches stage 2: what the official evaluator counts as hits.
    own = split.txt2img[None, :] == torch.arange(split.num_images)[:, None]  # (N_img, N_txt)
    i2t_found = own.gather(1, result.i2t_candidates).any(1)
    t2i_found = (result.t2i_candidates == split.txt2img[:, None]).any(1)
    metrics.update(
        shortlist_i2t=int(result.i2t_candidates.shape[1]),
        shortlist_t2i=int(result.t2i_candidates.shape[1]),
        hybrid_alpha=plan.alpha,
        pairs_scored=result.pairs_scored,
        # counts divided in Python: a float32 mean would print 80% as 80.0000012
        shortlist_miss_i2t=100.0 * int((~i2t_found).sum()) / i2t_found.numel(),
        shortlist_miss_t2i=100.0 * int((~t2i_found).sum()) / t2i_found.numel(),
        sims=result.sims,
    )
    return metrics


def check_coco_1k(num_images: int) -> None:
    """``eval.coco_1k`` on a split of ``num_images`` images: refused (ConfigError naming the key and
    ``data.test_split=testall``) unless the split is COCO_FOLDS folds of COCO_FOLD_IMAGES images
    (:func:`~patchword.eval.metrics.check_fold_geometry`, the check the folds themselves make)."""
    check_fold_geometry(num_images, COCO_FOLDS, COCO_FOLD_IMAGES, setting=_COCO_1K_KEY)


def evaluate(
    model,
    split: EncodedSplit,
    eval_cfg: EvalConfig,
    *,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
    return_sims: bool = False,
    return_fold_sims: bool = False,
    dist: Distributed | None = None,
) -> dict[str, Any]:
    """Metrics of ``model`` on ``split`` under the protocol its matcher declares (see the module doc).

    Args:
        return_fold_sims: with ``eval_cfg.coco_1k`` and a two-stage search, also return each fold's own
            search (``"coco1k_sims"``: a list of ``(sims_i2t, sims_t2i)``, rank 0 only), which an ensemble
            averages fold by fold (:func:`ensemble_metrics`); a matrix's folds are slices of ``"sims"``.
        dist: the processes of a ``torchrun`` launch, which share the work (every one must call this);
            None or one process: all of it here.

    Returns:
        :func:`retrieval_metrics` keys (plus ``coco1k_*`` with ``eval_cfg.coco_1k``, plus shortlist
        statistics for a two-stage search), the same on every process; with ``return_sims`` the scores
        under ``"sims"``: one (N_img, N_txt) matrix, or the ``(sims_i2t, sims_t2i)`` pair of a two-stage
        search (rank 0 only; None on the other processes).

    Raises:
        ConfigError: ``eval_cfg.coco_1k`` on a split that is not COCO_FOLDS x COCO_FOLD_IMAGES images
            (before anything is encoded).
    """
    if eval_cfg.coco_1k:
        check_coco_1k(split.num_images)
    dist = dist or Distributed(device=torch.device(device))
    plan = model.matcher.two_stage_plan()
    fold_sims: list[Sims] | None = None
    metrics: dict[str, Any] | None = None
    timings: dict[str, float] = {}
    device_start = None
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        # what the process holds on the device already (in training: the optimizer state, the gradients),
        # which the evaluation's own peak leaves out, as it does the resident set on the host
        device_start = torch.cuda.memory_allocated(device) / (1 << 20)
    _release_free_heap()
    host_scope = "evaluation" if reset_peak_host_rss() else "process"
    # right after a reset the peak is the resident set now: what the process already held (a training
    # process holds far more than a fresh `patchword eval`), which the evaluation's own peak leaves out
    host_start = peak_host_rss_mb() if host_scope == "evaluation" else None
    start = time.perf_counter()
    if plan is None:
        sims = score_split(
            model, split, eval_cfg, device=device, progress=progress, dist=dist, timings=timings
        )
        if sims is not None:
            metrics = _matrix_metrics(sims, split.txt2img, eval_cfg)
    else:
        metrics = _two_stage(model, split, eval_cfg, plan, device=device, progress=progress, dist=dist)
        sims = None if metrics is None else metrics.pop("sims")
        if eval_cfg.coco_1k:
            folds, fold_sims = [], []
            for lo, hi in fold_bounds(split.num_images, COCO_FOLDS):
                part = split.select_images(torch.arange(lo, hi), name=f"{split.name}[{lo}:{hi}]")
                fold = _two_stage(model, part, eval_cfg, plan, device=device, progress=progress, dist=dist)
                if fold is not None:
                    fold_sims.append(fold.pop("sims"))
                    folds.append(fold)
            if metrics is not None:
                metrics.update({f"coco1k_{key}": value for key, value in fold_mean(folds).items()})
    metrics = dist.broadcast_object(metrics)
    if not timings:  # a two-stage search: encoding and both stages (and the COCO 1K folds) together
        timings = {"search_seconds": time.perf_counter() - start}
    metrics["cost"] = evaluation_cost(
        timings,
        device,
        eval_cfg,
        dist.world_size,
        gallery_pairs=split.num_images * split.num_captions if plan is None else None,
        host_scope=host_scope,
        host_start_mb=host_start,
        device_start_mb=device_start,
    )
    if return_sims:
        metrics["sims"] = sims
    if return_fold_sims and fold_sims is not None:
        metrics["coco1k_sims"] = fold_sims if dist.is_main else None
    return metrics


def _release_free_heap() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim``) before the resident set is
    taken as the evaluation's start: memory a training process freed but its allocator kept would take the
    evaluation's first allocations without growing the resident set, and its ``peak_host_growth_mb`` would
    read less than the same evaluation's elsewhere. Nothing where there is no glibc (macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # another C library (musl)
        return
    trim(0)


def evaluation_cost(
    timings: dict[str, float],
    device,
    eval_cfg: EvalConfig,
    world_size: int,
    *,
    gallery_pairs: int | None,
    host_scope: str,
    host_start_mb: float | None = None,
    device_start_mb: float | None = None,
) -> dict[str, Any]:
    """What an evaluation cost and where it ran (the ``"cost"`` entry of its metrics).

    ``scoring_seconds`` is the exhaustive matrix alone (inputs encoded, result on the host): the wall time
    of this process's rows, which under several processes run side by side; ``pairs`` the whole matrix's
    (``pairs_this_process`` this process's share) and ``pairs_per_s`` the whole matrix over that time (all
    ``world_size`` processes together); ``peak_device_mb`` the most CUDA memory allocated during the
    evaluation (None elsewhere); ``peak_host_rss_mb`` the process's resident high-water mark during the
    evaluation where the system can reset it (Linux), else since the process started (``host_scope``:
    "evaluation" or "process"). Each mark includes whatever the process held when the evaluation began
    (``device_start_mb``, the CUDA memory allocated then; ``host_rss_start_mb``, the resident set then):
    in training, the optimizer state, the gradients, the training data and the allocator's cache; in
    ``patchword eval``, far less, so the same checkpoint shows two marks. ``peak_device_growth_mb`` and
    ``peak_host_growth_mb`` (each mark less its start, the heap's free memory given back first on the host:
    the evaluation's own peak, whichever process ran it) are the figures that compare runs; a process's
    first evaluation also pages in library code (a fixed amount whatever the gallery: about 30 MiB on a
    CPU). The host's are None where the mark cannot be reset (``host_scope`` "process", or
    ``host_start_mb`` not given), the device's off CUDA or without ``device_start_mb``; records written
    before they were kept have only ``peak_device_mb`` / ``peak_host_rss_mb``.
    ``timings``: :func:`score_split`'s (``pairs`` this process's), or a two-stage search's
    ``search_seconds``; ``gallery_pairs``: the exhaustive matrix's size, None for a two-stage search;
    ``host_start_mb``: the resident set when the evaluation began, ``device_start_mb`` the CUDA memory
    allocated then, right after the peak was reset (None: unknown).
    """
    device = torch.device(device)
    cost: dict[str, Any] = {"exhaustive": gallery_pairs is not None}
    if gallery_pairs is None:
        cost.update(timings)
    else:
        cost.update(encode_seconds=timings["encode_seconds"], scoring_seconds=timings["scoring_seconds"])
        cost.update(pairs=gallery_pairs, pairs_this_process=int(timings["pairs"]))
        cost["pairs_per_s"] = gallery_pairs / timings["scoring_seconds"]
    device_peak = torch.cuda.max_memory_allocated(device) / (1 << 20) if device.type == "cuda" else None
    cost["peak_device_mb"] = None if device_peak is None else round(device_peak, 1)
    started = device_peak is not None and device_start_mb is not None
    cost["device_start_mb"] = round(device_start_mb, 1) if started else None
    cost["peak_device_growth_mb"] = round(max(device_peak - device_start_mb, 0.0), 1) if started else None
    peak = peak_host_rss_mb()
    cost["peak_host_rss_mb"] = None if peak is None else round(peak, 1)
    known = peak is not None and host_start_mb is not None and host_scope == "evaluation"
    cost["host_rss_start_mb"] = round(host_start_mb, 1) if known else None
    cost["peak_host_growth_mb"] = round(max(peak - host_start_mb, 0.0), 1) if known else None
    cost.update(describe_device(device))
    cost.update(world_size=world_size, precision=eval_cfg.precision, peak_host_scope=host_scope)
    cost["max_memory_mb"] = configured_budget_mb(eval_cfg.max_memory_mb, device)
    return cost


def average_scores(members: Sequence[Sims]) -> Sims:
    """The mean of several models' scores: one matrix, or an (i2t, t2i) pair when a member is two-stage."""
    pairs = [m if isinstance(m, tuple) else (m, m) for m in members]
    sims_i2t = sum(p[0] for p in pairs) / len(pairs)
    sims_t2i = sum(p[1] for p in pairs) / len(pairs)
    return sims_i2t if all(p[0] is p[1] for p in pairs) else (sims_i2t, sims_t2i)


def score_spread(sims: Sims) -> float:
    """The standard deviation of a model's scores on a split: of its (N_img, N_txt) matrix, or of the
    finite entries of a two-stage ``(i2t, t2i)`` pair (the pairs outside its shortlists are -inf). What
    :func:`average_scores` weighs a member by: a member whose scores spread 100x wider decides the
    ensemble's ranking alone."""
    stats = []  # (count, mean, variance) of each part's finite entries
    for part in sims if isinstance(sims, tuple) else (sims,):
        finite = torch.isfinite(part)
        values = part if bool(finite.all()) else part[finite]  # no copy of a full matrix
        if values.numel():
            var, mean = torch.var_mean(values.float(), correction=0)
            stats.append((values.numel(), float(mean), float(var)))
    count = sum(c for c, _, _ in stats)
    if count < 2:
        return 0.0
    mean = sum(c * m for c, m, _ in stats) / count
    return math.sqrt(sum(c * (v + (m - mean) ** 2) for c, m, v in stats) / count)


def spreads_disagree(spreads: Sequence[float], factor: float = 10.0) -> bool:
    """Whether ensemble members' :func:`score_spread` values differ by more than ``factor`` (a member with
    constant scores and one without differ by any factor): their mean is then in effect one member's
    scores. SCAN and NAAF average unnormalised scores, and so does :func:`ensemble_metrics`."""
    low, high = min(spreads), max(spreads)
    return high > 0 and (low <= 0 or high / low > factor)


def ensemble_metrics(
    members: Sequence[Sims],
    txt2img: torch.Tensor,
    eval_cfg: EvalConfig,
    *,
    fold_members: Sequence[Sequence[Sims] | None] | None = None,
) -> dict[str, Any]:
    """Metrics of the average of several models' scores on one split (SCAN / NAAF report ensembles).

    ``members`` are (N_img, N_txt) matrices or two-stage ``(sims_i2t, sims_t2i)`` pairs; a pair outside one
    member's shortlist is -inf and stays out of the ensemble's.

    With ``eval_cfg.coco_1k`` every fold averages the members' scores of that fold: a matrix member's
    slice of its 5K matrix, a two-stage member's own search of the fold (``fold_members[i]``, the
    ``"coco1k_sims"`` of :func:`evaluate`), the protocol of a single two-stage model's ``coco1k_*``.

    Raises:
        ValueError: ``eval_cfg.coco_1k`` with a two-stage member whose fold searches are not given, or a
            split that is not COCO_FOLDS x COCO_FOLD_IMAGES images.
    """
    fold_members = list(fold_members) if fold_members is not None else [None] * len(members)
    if len(fold_members) != len(members):
        raise ValueError(f"fold_members: {len(fold_members)} entries for {len(members)} members")
    sims = average_scores(members)
    if not eval_cfg.coco_1k or all(f is None for f in fold_members):
        if eval_cfg.coco_1k and any(isinstance(m, tuple) for m in members):
            raise ValueError(
                "eval.coco_1k: a two-stage member's 1K folds must come from its own search of each fold "
                "(evaluate(..., return_fold_sims=True)), not from its 5K shortlists: pass fold_members"
            )
        return _matrix_metrics(sims, txt2img, eval_cfg)
    metrics: dict[str, Any] = retrieval_metrics(sims, txt2img)
    metrics.update({f"coco1k_{k}": v for k, v in _ensemble_folds(members, fold_members, txt2img).items()})
    return metrics


def _ensemble_folds(
    members: Sequence[Sims], fold_members: Sequence[Sequence[Sims] | None], txt2img: torch.Tensor
) -> dict[str, float]:
    """The COCO 1K folds of an ensemble with two-stage members (see :func:`ensemble_metrics`)."""
    first = members[0][0] if isinstance(members[0], tuple) else members[0]
    check_coco_1k(first.shape[0])
    txt2img = torch.as_tensor(txt2img).long()
    pairs = list(zip(members, fold_members, strict=True))
    for n, (member, own) in enumerate(pairs):  # once per member; each fold's shapes below
        if own is None and isinstance(member, tuple):
            raise ValueError(f"fold_members[{n}]: a two-stage member needs its own search of each fold")
        if own is not None and len(own) != COCO_FOLDS:
            raise ValueError(f"fold_members[{n}]: {len(own)} folds, expected {COCO_FOLDS}")
    folds = []
    for f, (lo, hi) in enumerate(fold_bounds(first.shape[0], COCO_FOLDS)):
        cols = fold_columns(txt2img, lo, hi)
        parts = []
        for n, (member, own) in enumerate(pairs):
            part = own[f] if own is not None else member[lo:hi, cols]
            shape = tuple((part[0] if isinstance(part, tuple) else part).shape)
            if shape != (hi - lo, len(cols)):
                raise ValueError(f"fold_members[{n}][{f}] has shape {shape}, expected {(hi - lo, len(cols))}")
            parts.append(part)
        folds.append(retrieval_metrics(average_scores(parts), txt2img[cols] - lo))
    return fold_mean(folds)


def _matrix_metrics(sims: Sims, txt2img: torch.Tensor, eval_cfg: EvalConfig) -> dict[str, Any]:
    """Recall of a score matrix, plus the COCO 1K folds (``coco1k_*``) with ``eval.coco_1k``."""
    metrics: dict[str, Any] = retrieval_metrics(sims, txt2img)
    if eval_cfg.coco_1k:
        folds = coco_1k_folds(sims, txt2img, COCO_FOLDS, fold_size=COCO_FOLD_IMAGES, setting=_COCO_1K_KEY)
        metrics.update({f"coco1k_{k}": v for k, v in folds.items() if k != "folds"})
    return metrics
