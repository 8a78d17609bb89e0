"""TokenAggregation (LAPS "SPC", SEPS "aggregation"): K selected patches -> N_c aggregated tokens."""

from __future__ import annotations

import torch
from torch import nn

from patchword.matching.ops import masked_softmax

__all__ = ["TokenAggregation"]


class TokenAggregation(nn.Module):
    """Learned convex combinations of the selected patches.

    Parameter shapes are exactly the official ones (``lib/cross_net.py``): ``LayerNorm(C) -> Linear(C,
    int(0.2 C)) -> GELU -> Linear(., N_c)`` plus a scalar ``scale`` initialised to 1, so official
    checkpoints load into it.

    Because the MLP acts on each token independently, its logits depend only on the image: they are
    computed once per image for all N patches (:meth:`logits`) and the per-caption selection enters as a
    mask in the softmax (:meth:`weights`). This equals the official gather-then-MLP computation.
    """

    def __init__(self, dim: int, num_out: int, hidden_ratio: float = 0.2) -> None:
        super().__init__()
        hidden = int(dim * hidden_ratio)
        self.num_out = num_out
        self.weight = nn.Sequential(
            nn.LayerNorm(dim),
            nn.Linear(dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, num_out),
        )
        self.scale = nn.Parameter(torch.ones(1))

    def logits(self, patches: torch.Tensor) -> torch.Tensor:
        """(B_v, N, C) raw patches -> (B_v, N, N_c) aggregation logits (scale applied)."""
        return self.weight(patches) * self.scale

    def weights(self, logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Aggregation weights restricted to the kept patches.

        Args:
            logits: (B_v, N, N_c) per-image logits from :meth:`logits`.
            keep: (B_v, T, N) bool, the selected patches of each pair (T = captions, or 1).

        Returns:
            (B_v, T, N, N_c) weights; each output token's weights sum to 1 over the kept patches.
        """
        return masked_softmax(logits[:, None], keep[..., None], dim=2)
