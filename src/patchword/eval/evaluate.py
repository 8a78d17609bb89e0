"""Evaluate a retrieval model on an encoded split: encode once, score all pairs, compute recalls."""

from __future__ import annotations

from typing import Any

import torch

from patchword.eval.engine import DEFAULT_MAX_MEMORY_MB, score_matrix
from patchword.eval.metrics import coco_1k_folds, retrieval_metrics
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens

__all__ = ["evaluate_encoded", "score_split"]


def score_split(model, split, eval_cfg, *, device: torch.device | str = "cpu", progress: bool | None = None):
    """(N_img, N_txt) similarities of ``split`` (an ``EncodedSplit``).

    Each image is encoded once (the official code encodes it once per caption), each caption once, and
    each dense caption once per image. All pairs are scored by :func:`~patchword.eval.score_matrix`
    (the matcher's fast exact engine) within ``eval_cfg.max_memory_mb`` (default
    ``DEFAULT_MAX_MEMORY_MB``) of working memory.
    """
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
        if split.dense_ids is not None and getattr(model.matcher, "consumes_dense", True):
            dense = encode_text_tokens(
                model,
                split.dense_ids,
                split.dense_lens,
                batch_size=eval_cfg.batch_size,
                device=device,
                progress=progress,
                desc="encode dense captions",
            )
        return score_matrix(
            model.matcher,
            img,
            cap,
            split.cap_lens,
            dense,
            split.dense_lens,
            txt2img=split.txt2img,
            max_memory_mb=getattr(eval_cfg, "max_memory_mb", DEFAULT_MAX_MEMORY_MB),
            device=device,
            progress=progress,
        )
    finally:
        model.train(was_training)


def evaluate_encoded(
    model,
    split,
    eval_cfg,
    *,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
    return_sims: bool = False,
) -> dict[str, Any]:
    """Recall metrics of ``model`` on ``split``; with ``eval_cfg.coco_1k`` also the COCO 1K folds
    (keys prefixed ``coco1k_``)."""
    sims = score_split(model, split, eval_cfg, device=device, progress=progress)
    metrics: dict[str, Any] = retrieval_metrics(sims, split.txt2img)
    if eval_cfg.coco_1k:
        folds = coco_1k_folds(sims, split.txt2img)
        metrics.update({f"coco1k_{k}": v for k, v in folds.items() if k != "folds"})
    if return_sims:
        metrics["sims"] = sims
    return metrics
