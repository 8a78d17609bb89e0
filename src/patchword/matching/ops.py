"""Small tensor helpers shared by the matchers."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from patchword.precision import autocast_enabled

__all__ = [
    "autocast_off",
    "floor_eps",
    "full_precision",
    "l2norm",
    "length_mask",
    "masked_mean",
    "minmax_normalise",
    "masked_softmax",
]


def full_precision(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when autocast made it half precision; float32 and float64 (``precision=fp64``)
    tensors are returned as they are. Scores and losses are computed at full precision."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def autocast_off(x: torch.Tensor) -> AbstractContextManager:
    """A context in which autocast is disabled on ``x``'s device (a null context where it is off already,
    or where autocast does not know the device type: the simulated device's ``meta``).

    For the computations reduced precision must not touch (the specification: nothing that feeds a top-K
    selection silently): inside, a product of float32 tensors is a float32 product. Pass the tensors in
    float32 (:func:`full_precision`); autocast no longer casts them down.
    """
    if not autocast_enabled(x.device.type):
        return nullcontext()
    return torch.autocast(device_type=x.device.type, enabled=False)


def floor_eps(eps: float, dtype: torch.dtype) -> float:
    """``eps``, or the smallest normal number of ``dtype`` where that is larger.

    The official epsilons (1e-8, 1e-12, 1e-16) are below float16's smallest subnormal (6e-8) or normal
    (6.1e-5) number: added to (or a floor of) a float16 zero they round to 0, and the 0 / 0 they were meant
    to prevent comes back as NaN. In float32, float64 and bfloat16 (float32's exponent range) the value is
    ``eps`` itself, so results there do not change by a bit.
    """
    return max(eps, torch.finfo(dtype).tiny)


def l2norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """L2-normalise along ``dim`` with the same epsilon as ``F.normalize`` (the official code), floored
    for float16 (:func:`floor_eps`: a zero vector stays zero instead of NaN)."""
    return F.normalize(x, p=2, dim=dim, eps=floor_eps(1e-12, x.dtype))


def length_mask(lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B,) lengths -> (B, max_len) bool mask, True at valid positions."""
    return torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]


def masked_mean(tokens: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Mean over the first ``lens[b]`` positions: (B, L, C), (B,) -> (B, C)."""
    mask = length_mask(lens, tokens.shape[1]).to(tokens.dtype)
    return (tokens * mask[..., None]).sum(dim=1) / lens.to(tokens.dtype)[:, None]


def minmax_normalise(scores: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Map the last axis to [0, 1] (paper Eq. 2): (s - min) / (max - min + eps), any shape (..., N).

    A constant row (an image whose patches are all the same token) gives 0 / eps = 0. ``eps`` is floored
    at the dtype's smallest normal number (:func:`floor_eps`): in float16 1e-8 rounds to 0 and the row
    would be 0 / 0 = NaN.
    """
    lo = scores.amin(dim=-1, keepdim=True)
    hi = scores.amax(dim=-1, keepdim=True)
    return (scores - lo) / (hi - lo + floor_eps(eps, scores.dtype))


def masked_softmax(logits: torch.Tensor, keep: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax over ``dim`` restricted to positions where ``keep`` is True (others get weight 0).

    Equal to a softmax over the gathered kept entries, which is what the official code computes after
    ``torch.gather``; masking instead of gathering lets all pairs share per-image tensors.
    """
    return torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=dim)
