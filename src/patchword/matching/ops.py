"""Small tensor helpers shared by the matchers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["full_precision", "l2norm", "length_mask", "masked_mean", "minmax_normalise", "masked_softmax"]


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when autocast made it half precision; float32 and float64 (``precision=fp64``)
    tensors are returned as they are. Scores and losses are computed at full precision."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def l2norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """L2-normalise along ``dim`` with the same epsilon as ``F.normalize`` (the official code)."""
    return F.normalize(x, p=2, dim=dim, eps=1e-12)


def length_mask(lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B,) lengths -> (B, max_len) bool mask, True at valid positions."""
    return torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]


def masked_mean(tokens: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Mean over the first ``lens[b]`` positions: (B, L, C), (B,) -> (B, C)."""
    mask = length_mask(lens, tokens.shape[1]).to(tokens.dtype)
    return (tokens * mask[..., None]).sum(dim=1) / lens.to(tokens.dtype)[:, None]


def minmax_normalise(scores: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Map the last axis to [0, 1] (paper Eq. 2): (s - min) / (max - min + eps)."""
    lo = scores.amin(dim=-1, keepdim=True)
    hi = scores.amax(dim=-1, keepdim=True)
    return (scores - lo) / (hi - lo + eps)


def masked_softmax(logits: torch.Tensor, keep: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax over ``dim`` restricted to positions where ``keep`` is True (others get weight 0).

    Equal to a softmax over the gathered kept entries, which is what the official code computes after
    ``torch.gather``; masking instead of gathering lets all pairs share per-image tensors.
    """
    return torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=dim)
