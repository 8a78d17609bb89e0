"""The one evaluation protocol: how a model is scored on a split, for validation, test, ``patchword eval``
and ensembles alike.

* Every image, caption and dense caption is encoded once (the official code re-encodes each image once
  per caption).
* A matcher is ranked on its full (N_img, N_txt) matrix, exactly, in bounded memory
  (:func:`~patchword.eval.score_matrix`), unless it declares a two-stage plan
  (:meth:`Matcher.two_stage_plan`: TGDT's hybrid search), in which case it is searched that way (global
  shortlist, fine re-ranking, a ground truth outside the shortlist is a miss) in validation and test alike.
* ``eval.coco_1k`` adds the COCO 1K protocol: five 1000-image folds of the 5K test, averaged; each fold of
  a two-stage search runs its own search, as the official fold-wise evaluation does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from patchword.data.pipeline import EncodedSplit
from patchword.eval.config import EvalConfig
from patchword.eval.engine import score_matrix
from patchword.eval.metrics import coco_1k_folds, retrieval_metrics
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens

__all__ = ["encode_for_scoring", "score_split", "evaluate", "ensemble_metrics", "COCO_FOLDS"]

COCO_FOLDS = 5

Sims = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def encode_for_scoring(model, split: EncodedSplit, eval_cfg: EvalConfig, *, device, progress=None):
    """Encode ``split`` once: -> (img (N_img, L_v, C), cap (N_txt, L, C), dense (N_img, L_d, C) or None),
    float32 on the CPU. Dense captions are encoded only when the matcher reads them."""
    was_training = model.training
    model.eval()
    try:
        img = encode_image_tokens(
            model, split.images, batch_size=eval_cfg.batch_size, device=device, progress=progress
        )
        cap = encode_text_tokens(
            model,
            split.cap_ids,
            split.cap_lens,
            batch_size=2 * eval_cfg.batch_size,
            device=device,
            progress=progress,
        )
        dense = None
        if split.dense_ids is not None and model.matcher.consumes_dense:
            dense = encode_text_tokens(
                model,
                split.dense_ids,
                split.dense_lens,
                batch_size=eval_cfg.batch_size,
                device=device,
                progress=progress,
                desc="encode dense captions",
            )
    finally:
        model.train(was_training)
    return img, cap, dense


def score_split(
    model, split: EncodedSplit, eval_cfg: EvalConfig, *, device="cpu", progress=None
) -> torch.Tensor:
    """The exact (N_img, N_txt) similarity matrix of ``split`` within ``eval_cfg.max_memory_mb``."""
    img, cap, dense = encode_for_scoring(model, split, eval_cfg, device=device, progress=progress)
    was_training = model.training
    model.eval()
    try:
        return score_matrix(
            model.matcher,
            img,
            cap,
            split.cap_lens,
            dense,
            split.dense_lens,
            txt2img=split.txt2img,
            max_memory_mb=eval_cfg.max_memory_mb,
            device=device,
            progress=progress,
        )
    finally:
        model.train(was_training)


def _two_stage(model, split: EncodedSplit, eval_cfg: EvalConfig, plan, *, device, progress) -> dict[str, Any]:
    """Metrics of the two-stage search ``plan`` on ``split``, plus ``"sims"`` = (sims_i2t, sims_t2i)."""
    from patchword.eval.two_stage import two_stage_scores

    img, cap, _ = encode_for_scoring(model, split, eval_cfg, device=device, progress=progress)
    result = two_stage_scores(
        plan.fine,
        img,
        cap,
        split.cap_lens,
        k=(plan.k_i2t, plan.k_t2i),
        alpha=plan.alpha,
        device=device,
        progress=progress,
    )
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
        shortlist_miss_i2t=100.0 * float((~i2t_found).float().mean()),
        shortlist_miss_t2i=100.0 * float((~t2i_found).float().mean()),
        sims=result.sims,
    )
    return metrics


def _fold_bounds(num_images: int) -> list[tuple[int, int]]:
    return [(f * num_images // COCO_FOLDS, (f + 1) * num_images // COCO_FOLDS) for f in range(COCO_FOLDS)]


def evaluate(
    model,
    split: EncodedSplit,
    eval_cfg: EvalConfig,
    *,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
    return_sims: bool = False,
) -> dict[str, Any]:
    """Metrics of ``model`` on ``split`` under the protocol its matcher declares (see the module doc).

    Returns:
        :func:`retrieval_metrics` keys (plus ``coco1k_*`` with ``eval_cfg.coco_1k``, plus shortlist
        statistics for a two-stage search); with ``return_sims`` the scores under ``"sims"``: one
        (N_img, N_txt) matrix, or the ``(sims_i2t, sims_t2i)`` pair of a two-stage search.
    """
    plan = model.matcher.two_stage_plan()
    if plan is None:
        sims = score_split(model, split, eval_cfg, device=device, progress=progress)
        metrics: dict[str, Any] = retrieval_metrics(sims, split.txt2img)
        if eval_cfg.coco_1k:
            folds = coco_1k_folds(sims, split.txt2img)
            metrics.update({f"coco1k_{k}": v for k, v in folds.items() if k != "folds"})
    else:
        metrics = _two_stage(model, split, eval_cfg, plan, device=device, progress=progress)
        sims = metrics.pop("sims")
        if eval_cfg.coco_1k:
            folds = []
            for lo, hi in _fold_bounds(split.num_images):
                part = split.select_images(torch.arange(lo, hi), name=f"{split.name}[{lo}:{hi}]")
                fold = _two_stage(model, part, eval_cfg, plan, device=device, progress=progress)
                fold.pop("sims")
                folds.append(fold)
            metrics.update({f"coco1k_{key}": sum(f[key] for f in folds) / len(folds) for key in folds[0]})
    if return_sims:
        metrics["sims"] = sims
    return metrics


def ensemble_metrics(members: Sequence[Sims], txt2img: torch.Tensor, eval_cfg: EvalConfig) -> dict[str, Any]:
    """Metrics of the average of several models' scores on one split (SCAN / NAAF report ensembles).

    ``members`` are (N_img, N_txt) matrices or two-stage ``(sims_i2t, sims_t2i)`` pairs; a pair outside one
    member's shortlist is -inf and stays out of the ensemble's.
    """
    pairs = [m if isinstance(m, tuple) else (m, m) for m in members]
    sims_i2t = sum(p[0] for p in pairs) / len(pairs)
    sims_t2i = sum(p[1] for p in pairs) / len(pairs)
    sims = sims_i2t if all(p[0] is p[1] for p in pairs) else (sims_i2t, sims_t2i)
    metrics: dict[str, Any] = retrieval_metrics(sims, txt2img)
    if eval_cfg.coco_1k:
        folds = coco_1k_folds(sims, txt2img)
        metrics.update({f"coco1k_{k}": v for k, v in folds.items() if k != "folds"})
    return metrics
