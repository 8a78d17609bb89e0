"""HRPA (SEPS) / SPA (LAPS): bidirectional patch-word alignment score."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from patchword.matching.ops import length_mask

__all__ = ["HRPA"]


class TopKRelevance(nn.Module):
    """Paper Eq. (5) "MLP(TOPK(.))" term: a small MLP over the k largest alignment values."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.mlp = nn.Sequential(nn.Linear(k, 2 * k), nn.GELU(), nn.Linear(2 * k, 1))

    def forward(self, values: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """(..., L) alignment values (invalid positions marked False in ``valid``) -> (...) scores.

        Rows with fewer than k valid entries are padded with zeros, so a three-word caption still gets a
        score (the paper does not say what happens there).
        """
        if valid is not None:
            values = values.masked_fill(~valid, float("-inf"))
        k = min(self.k, values.shape[-1])
        top = values.topk(k, dim=-1).values
        top = top.masked_fill(torch.isinf(top), 0.0)
        if k < self.k:
            top = F.pad(top, (0, self.k - k))
        return self.mlp(top).squeeze(-1)


class HRPA(nn.Module):
    """Highly-relevant patch-word alignment over many (image, caption) pairs at once.

    Code variant (``lib/xttn.py:mask_xattn_one_text``): A = LeakyReLU(words . patches, 0.1);
    S = mean_words(max_patches A) + mean_patches(max_words A), a plain sum of both directions.
    Paper variant (Eq. 5): plain cosine and each direction adds ``MLP(TopK(.))`` of its max-values.

    Args:
        leaky_slope: negative slope applied to the cosine matrix, or None for plain cosine.
        topk: k of the paper's TopK-MLP terms, or 0 to disable them (code variant).
    """

    def __init__(self, leaky_slope: float | None = 0.1, topk: int = 0) -> None:
        super().__init__()
        self.leaky_slope = leaky_slope
        self.word_topk = TopKRelevance(topk) if topk > 0 else None
        self.patch_topk = TopKRelevance(topk) if topk > 0 else None

    def forward(self, tokens: torch.Tensor, words: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Score every image row against every caption column.

        Args:
            tokens: (B_v, T, M, C) L2-normalised image tokens per pair (T = number of captions; the image
                tokens may differ per caption because selection is text-aware).
            words: (T, L, C) L2-normalised word tokens.
            lens: (T,) valid word counts.

        Returns:
            (B_v, T) similarities.
        """
        align = torch.einsum("vtmc,tlc->vtlm", tokens, words)
        if self.leaky_slope is not None:
            align = F.leaky_relu(align, self.leaky_slope)
        valid = length_mask(lens, words.shape[1])  # (T, L)
        # word -> patch: each word's best patch, averaged over the caption's words
        word_best = align.amax(dim=3)  # (B_v, T, L)
        word_mean = (word_best * valid).sum(dim=2) / lens.to(align.dtype)
        # patch -> word: each patch's best word among the valid ones, averaged over patches
        patch_best = align.masked_fill(~valid[None, :, :, None], float("-inf")).amax(dim=2)  # (B_v, T, M)
        sims = word_mean + patch_best.mean(dim=2)
        if self.word_topk is not None:
            sims = sims + self.word_topk(word_best, valid.expand_as(word_best))
            sims = sims + self.patch_topk(patch_best)
        return sims
