"""Text-aware patch selection (LAPS "LPS", SEPS "SDTPS"): scores, top-K decisions, fusion weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from patchword.matching.ops import l2norm, masked_softmax, minmax_normalise

__all__ = [
    "PatchScorer",
    "fusion_weights",
    "image_prior",
    "image_saliency",
    "scores_from_prior",
    "text_relevance",
    "topk_decisions",
]


class PatchScorer(nn.Module):
    """Paper Eq. (1): learned patch importance s_p = sigmoid(MLP(v)), MLP = C -> C/4 -> 1."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, dim // 4), nn.GELU(), nn.Linear(dim // 4, 1))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """(B_v, N, C) raw patches -> (B_v, N) scores in (0, 1), computed in the dtype of ``patches``.

        SEPS passes float32 patches with autocast off (the score ranks patches for the top-K). Under
        ``precision=bf16`` the weights are bfloat16: they are cast to the patches' dtype for this product
        (C x C/4 weights, little next to the encoders) instead of casting the patches down.
        """
        first, act, last = self.mlp
        if first.weight.dtype == patches.dtype:
            return torch.sigmoid(self.mlp(patches).squeeze(-1))
        dtype = patches.dtype
        hidden = act(F.linear(patches, first.weight.to(dtype), first.bias.to(dtype)))
        return torch.sigmoid(F.linear(hidden, last.weight.to(dtype), last.bias.to(dtype)).squeeze(-1))


def saliency_centre(img_tokens: torch.Tensor, saliency: str, detach: bool) -> torch.Tensor | None:
    """The CLS token s_im is measured against (``saliency == "cls"``; detached like the patches when
    selection carries no gradient to the encoder), or None for the official mean patch.

    Args:
        img_tokens: (B_v, 1 + N, C) tokens with the CLS token first.
    """
    if saliency != "cls":
        return None
    return img_tokens[:, 0].detach() if detach else img_tokens[:, 0]


def image_saliency(
    patches: torch.Tensor, patches_unit: torch.Tensor, cls: torch.Tensor | None = None
) -> torch.Tensor:
    """s_im: cosine between each patch and the image's mean patch (official), or its CLS token.

    The mean is over the raw (un-normalised) patches, as in the official code. On images dominated by a
    uniform background the mean patch *is* background, so the official saliency ranks background patches
    first; the CLS token (the global embedding contrastive pretraining aligned with the text) need not.

    Args:
        patches: (B_v, N, C) raw patches.
        patches_unit: (B_v, N, C) the same, L2-normalised.
        cls: (B_v, C) raw CLS tokens to measure saliency against instead of the mean patch, or None.

    Returns:
        (B_v, N) saliency.
    """
    centre = l2norm(patches.mean(dim=1) if cls is None else cls)
    return torch.einsum("vnc,vc->vn", patches_unit, centre)


def text_relevance(patches_unit: torch.Tensor, guide: torch.Tensor, per_image: bool) -> torch.Tensor:
    """s_t: cosine between each patch and a text's global vector.

    Args:
        patches_unit: (B_v, N, C) L2-normalised patches.
        guide: L2-normalised global text vectors, (T, C) one per caption, or (B_v, C) one per image when
            ``per_image`` (dense text tied to the candidate image).

    Returns:
        (B_v, T, N), or (B_v, 1, N) when ``per_image``.
    """
    if per_image:
        return torch.einsum("vnc,vc->vn", patches_unit, guide)[:, None]
    return torch.einsum("vnc,tc->vtn", patches_unit, guide)


def combine_paper_scores(
    s_pred: torch.Tensor, s_im: torch.Tensor, s_texts: list[torch.Tensor], beta: float
) -> torch.Tensor:
    """Paper Eq. (3) with min-max normalised attention terms (Eq. 2).

    score = (1 - 2 beta) s_p + beta (sum of normalised text terms + 2 s_im) / (#text terms / 2):
    the text terms always carry a total weight of 2 beta, so one guiding text (a single branch) gets
    2 beta and Eq. (3)'s joint sparse + dense score gets beta each.

    Args:
        s_pred: (B_v, N) learned scores.
        s_im: (B_v, N) image saliency.
        s_texts: text relevance terms, each (B_v, T, N) or (B_v, 1, N).
        beta: the attention weight beta.

    Returns:
        (B_v, T', N) combined score, T' the broadcast of the text terms.
    """
    text = sum(minmax_normalise(s) for s in s_texts) * (2.0 / len(s_texts))
    return (1 - 2 * beta) * s_pred[:, None] + beta * (text + 2 * minmax_normalise(s_im)[:, None])


def image_prior(
    s_im: torch.Tensor, s_pred: torch.Tensor | None, score_mode: str, beta: float
) -> torch.Tensor:
    """The part of the selection score that depends on the image alone: (B_v, N).

    ``"sum"`` (official code): s_im; ``"predictor"`` (paper Eq. 3, see :func:`combine_paper_scores`):
    (1 - 2 beta) s_p + 2 beta minmax(s_im). An index pruned at build time keeps it for its kept patches
    (:func:`scores_from_prior`).
    """
    if score_mode == "sum":
        return s_im
    return (1 - 2 * beta) * s_pred + 2 * beta * minmax_normalise(s_im)


def scores_from_prior(
    prior: torch.Tensor, s_texts: list[torch.Tensor], score_mode: str, beta: float
) -> torch.Tensor:
    """Selection scores from a precomputed :func:`image_prior` (B_v, N) and the text terms, each
    (B_v, T, N) or (B_v, 1, N): ``prior + sum(s_texts)`` (``"sum"``) or ``prior + beta * text`` with the
    text terms min-max normalised over the N patches given (``"predictor"``). On every patch of an image it
    equals the direct scores; on the patches an index kept, the min-max runs over the kept ones only."""
    if score_mode == "sum":
        return prior[:, None] + sum(s_texts)
    text = sum(minmax_normalise(s) for s in s_texts) * (2.0 / len(s_texts))
    return prior[:, None] + beta * text


def topk_decisions(
    score: torch.Tensor,
    k: int,
    *,
    gumbel: bool = False,
    tau: float = 1.0,
    sample: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keep the K highest-scoring patches.

    With ``gumbel`` the decision is a straight-through estimator: its forward value is the hard top-K
    mask, its gradient that of a relaxed keep probability
    ``sigmoid((score - threshold + noise) / tau)``, where the threshold lies halfway between the K-th
    and (K+1)-th scores (so the relaxation agrees with the hard mask) and ``noise`` is the difference of
    two Gumbel samples (logistic noise) when ``sample`` is set (training).

    Args:
        score: (B_v, T, N) selection scores.
        k: number of patches to keep, 1 <= k <= N.

    Returns:
        keep: (B_v, T, N) bool hard mask.
        decision: (B_v, T, N) float mask (hard forward values; differentiable iff ``gumbel``).
        soft: (B_v, T, N) relaxed keep probabilities, or None without ``gumbel``.
    """
    n = score.shape[-1]
    top = score.topk(min(k + 1, n), dim=-1)
    keep = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, top.indices[..., :k], True)
    hard = keep.to(score.dtype)
    if not gumbel:
        return keep, hard, None
    # Halfway between the last kept and the first dropped score; keeping everything puts it below all.
    kth = top.values[..., k - 1]
    threshold = 0.5 * (kth + top.values[..., k]) if k < n else kth - 1.0
    logits = score - threshold.detach()[..., None]
    if sample:
        u = torch.rand(score.shape + (2,), generator=generator, device=score.device, dtype=score.dtype)
        exponential = -torch.log(u.clamp_min(1e-9))
        gumbel_noise = -torch.log(exponential.clamp_min(1e-9))
        logits = logits + (gumbel_noise[..., 0] - gumbel_noise[..., 1])
    soft = torch.sigmoid(logits / tau)
    # (soft - soft.detach()) is exactly zero, so the forward value is exactly the hard mask.
    return keep, hard + (soft - soft.detach()), soft


def fusion_weights(score: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Weights of the fusion ("extra") token: softmax of the raw scores over the dropped patches.

    Args:
        score: (B_v, T, N) selection scores (no temperature, as in the official code).
        keep: (B_v, T, N) bool hard mask.

    Returns:
        (B_v, T, N) weights, zero on kept patches, summing to 1 over dropped ones (all zero if none are
        dropped).
    """
    weights = masked_softmax(score, ~keep, dim=-1)
    return torch.nan_to_num(weights, nan=0.0)
