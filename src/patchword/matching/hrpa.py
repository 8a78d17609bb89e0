"""HRPA (SEPS) / SPA (LAPS): bidirectional patch-word alignment score."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from patchword.matching.ops import floor_eps

__all__ = ["HRPA", "pair_cosines"]


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

    def forward(self, align: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Score every (image, caption) pair from its patch-word cosine matrix.

        Args:
            align: (B_v, T, M, L) cosines between the M image tokens and L words of each pair.
            valid: bool mask of real words, broadcastable to (B_v, T, 1, L).

        Returns:
            (B_v, T) similarities.
        """
        if self.leaky_slope is not None:
            align = F.leaky_relu(align, self.leaky_slope)
        n_words = valid.sum(dim=-1).to(align.dtype)  # (.., .., 1)
        # word -> patch: each word's best token, averaged over the caption's words
        word_best = align.amax(dim=2, keepdim=True)  # (B_v, T, 1, L)
        word_mean = ((word_best * valid).sum(dim=-1) / n_words).squeeze(-1)
        # patch -> word: each token's best word among the valid ones, averaged over tokens
        patch_best = align.masked_fill(~valid, float("-inf")).amax(dim=-1)  # (B_v, T, M)
        sims = word_mean + patch_best.mean(dim=-1)
        if self.word_topk is not None:
            sims = sims + self.word_topk(
                word_best.squeeze(2), valid.squeeze(2).expand_as(word_best.squeeze(2))
            )
            sims = sims + self.patch_topk(patch_best)
        return sims


def pair_cosines(
    cls: torch.Tensor | None,
    aggregated: torch.Tensor,
    extra: torch.Tensor,
    words: torch.Tensor,
    *,
    diagonal: bool = False,
) -> torch.Tensor:
    """Cosines between each pair's image tokens [CLS?, aggregated..., extra] and its words.

    Equal to L2-normalising the concatenated tokens and multiplying by the words, but the dot products
    are taken on the raw tokens and divided by their norms afterwards: the (B_v, T, M, C) normalised and
    concatenated token tensor is never built (it dominated training time on CPU).

    Args:
        cls: (B_v, C) raw CLS tokens, or None.
        aggregated: (B_v, T, K, C) raw aggregated tokens (T = captions, or 1 with ``diagonal``).
        extra: (B_v, T, C) raw fusion tokens.
        words: (T, L, C) L2-normalised words; with ``diagonal`` (B_v, L, C), image v's own text.
        diagonal: pair image v only with text v (image-tied dense captions).

    Returns:
        (B_v, T, M, L) cosine matrix, M = K + 1 + (cls is not None); T = 1 with ``diagonal``.
    """

    def inv_norm(x: torch.Tensor) -> torch.Tensor:
        # floor_eps: 1e-12 is 0 in float16, and a zero token's 1 / 0 would be inf (inf * 0 = NaN cosines)
        return 1.0 / torch.linalg.vector_norm(x, dim=-1).clamp_min(floor_eps(1e-12, x.dtype))

    if diagonal:
        agg = torch.einsum("vkc,vlc->vkl", aggregated[:, 0], words)[:, None]
        ext = torch.einsum("vc,vlc->vl", extra[:, 0], words)[:, None, None]
        cls_part = None if cls is None else torch.einsum("vc,vlc->vl", cls, words)[:, None, None]
    else:
        agg = torch.einsum("vtkc,tlc->vtkl", aggregated, words)
        ext = torch.einsum("vtc,tlc->vtl", extra, words)[:, :, None]
        cls_part = None if cls is None else torch.einsum("vc,tlc->vtl", cls, words)[:, :, None]
    parts = [agg * inv_norm(aggregated)[..., None], ext * inv_norm(extra)[:, :, None, None]]
    if cls_part is not None:
        parts.insert(0, (cls_part * inv_norm(cls)[:, None, None, None]).expand(-1, agg.shape[1], -1, -1))
    return torch.cat(parts, dim=2)
