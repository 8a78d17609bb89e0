"""SCAN (Lee et al., ECCV 2018): stacked cross attention between image regions and words.

``direction="t2i"`` (Text->Image): every word attends over the regions, ``R_l = cos(u_l, a_l)`` with
``a_l = sum_r softmax_r(lambda_softmax * norm_l(s)_lr) v_r``, aggregated over the words.
``direction="i2t"`` (Image->Text): every region attends over the words and the relevances are aggregated
over the regions. ``norm`` is ``raw_feature_norm`` along the *query* axis (``clipped_l2norm`` by default,
LeakyReLU(0.1) then ``x / (||x|| + 1e-8)``), the aggregation is ``agg_func`` (LogSumExp with
``lambda_lse``, Mean, Max or Sum).

The scores equal the official per-caption loops (``xattn_score_t2i`` / ``xattn_score_i2t``,
reference/naaf_scan_vse.md 3.1-3.3) to float rounding, but all pairs of a block are computed at once (see
:mod:`patchword.matching.attention`). Like the official encoders, which L2-normalise regions and words
(``x / (||x|| + 1e-8)``), the matcher normalises its inputs first (``normalize_inputs``); inputs that are
already normalised pass through unchanged up to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from patchword.matching.attention import (
    AGGREGATIONS,
    FEATURE_NORMS,
    aggregate,
    attended_cosine,
    caption_chunks,
    feature_norm,
    gram,
    official_l2norm,
    word_region_scores,
)
from patchword.matching.base import Matcher, MatcherOutput, caption_blocks, chunk_widths
from patchword.matching.ops import length_mask
from patchword.matching.registry import register_matcher

__all__ = ["SCANConfig", "SCANMatcher"]


@dataclass
class SCANConfig:
    """Arguments of :class:`SCANMatcher`; defaults are SCAN t-i LSE on Flickr30K (README flags)."""

    embed_dim: int = 1024  # D, width of region and word vectors
    # "t2i" (words attend to regions) or "i2t" (regions attend to words)
    direction: Literal["t2i", "i2t"] = "t2i"
    # aggregation over words (t2i) / regions (i2t): logsumexp | mean | max | sum
    agg: Literal["logsumexp", "mean", "max", "sum"] = "logsumexp"
    lambda_softmax: float = 9.0  # lambda_1, attention inverse temperature (README: 9 t2i, 4 i2t)
    lambda_lse: float = 6.0  # lambda_2 of LogSumExp (README: 6 t2i, 5 i2t F30K, 20 i2t COCO)
    feature_norm: Literal[
        "clipped_l2norm", "l2norm", "softmax", "clipped", "no_norm", "l1norm", "clipped_l1norm"
    ] = "clipped_l2norm"  # raw_feature_norm of the scores along the query axis
    normalize_inputs: bool = True  # L2-normalise regions and words first, as the official encoders do
    max_pair_elements: int = 1 << 22  # bound on B_v x captions x L x R elements per chunk (0 = no chunks)


@register_matcher("scan", SCANConfig)
class SCANMatcher(Matcher):
    """SCAN similarity head over region and word vectors.

    ``forward(img_tokens (B_v, R, D), cap_tokens (B_t, L, D), cap_lens (B_t,))`` returns
    :class:`MatcherOutput` with (B_v, B_t) sims in the inputs' dtype. Caption padding (positions at or
    beyond ``cap_lens``) never influences a score. Dense captions are accepted and ignored.
    """

    consumes_dense = False  # region / global matchers ignore dense text
    host_lengths = True  # each caption chunk is trimmed to its longest caption

    def __init__(self, config: SCANConfig) -> None:
        super().__init__()
        if config.direction not in ("t2i", "i2t"):
            raise ValueError(f"direction must be 't2i' or 'i2t', got {config.direction!r}")
        if config.agg.lower() not in AGGREGATIONS:
            raise ValueError(f"agg must be one of {AGGREGATIONS}, got {config.agg!r}")
        if config.feature_norm not in FEATURE_NORMS:
            raise ValueError(f"feature_norm must be one of {FEATURE_NORMS}, got {config.feature_norm!r}")
        if not config.lambda_softmax > 0 or not config.lambda_lse > 0:
            raise ValueError("lambda_softmax and lambda_lse must be > 0")
        self.config = config
        self.embed_dim = config.embed_dim

    def pair_memory_bytes(self, img_len: int, txt_len: int, dense_len: int, dim: int) -> int:
        """Working bytes per pair inside :meth:`forward` (about six fp32 (L, R) tensors)."""
        return 6 * 4 * img_len * txt_len

    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """Score every image against every caption.

        Args:
            img_tokens: (B_v, R, D) region vectors.
            cap_tokens: (B_t, L, D) word vectors; ``cap_lens`` (B_t,) valid counts (<start>/<end> included,
                as SCAN scores every token of its captions), on any device (read without waiting for the
                device when on the host).
            dense_tokens, dense_lens: ignored (SCAN has no dense text).

        Returns:
            :class:`MatcherOutput` with ``sims`` (B_v, B_t).
        """
        self.validate_image_tokens(img_tokens)
        lens = self.validate_text(cap_tokens, cap_lens)
        cap_tokens = cap_tokens.to(img_tokens.dtype)
        img, cap = img_tokens, cap_tokens
        if self.config.normalize_inputs:
            img, cap = official_l2norm(img), official_l2norm(cap)
        n_img, n_reg = img.shape[:2]
        n_txt, n_word = cap.shape[:2]
        step = caption_chunks(n_img, n_txt, n_word * n_reg, self.config.max_pair_elements)
        score = self._t2i if self.config.direction == "t2i" else self._i2t
        img_gram = gram(img) if self.config.direction == "t2i" else None
        blocks = zip(caption_blocks(n_txt, step), chunk_widths(cap_lens, lens, step, n_word), strict=True)
        sims = [score(img, cap[part, :width], lens[part], img_gram) for part, width in blocks]
        return MatcherOutput(sims=torch.cat(sims, dim=1))

    def _t2i(
        self, img: torch.Tensor, cap: torch.Tensor, lens: torch.Tensor, img_gram: torch.Tensor | None
    ) -> torch.Tensor:
        """Words attend over regions: (B_v, R, D), (T, L, D) trimmed to the longest caption -> (B_v, T)."""
        cfg = self.config
        valid = length_mask(lens, cap.shape[1])  # (T, L)
        s = word_region_scores(img, cap)  # (B_v, T, L, R)
        normed = feature_norm(s, cfg.feature_norm, dim=2, valid=valid[None, :, :, None])
        attn = torch.softmax(normed * cfg.lambda_softmax, dim=-1)  # over regions
        word_norm = cap.norm(dim=-1)[None]  # (1, T, L)
        relevance = attended_cosine(attn, s, img_gram[:, None], word_norm)  # (B_v, T, L)
        return aggregate(relevance, valid[None], cfg.agg, cfg.lambda_lse)

    def _i2t(
        self, img: torch.Tensor, cap: torch.Tensor, lens: torch.Tensor, _: torch.Tensor | None
    ) -> torch.Tensor:
        """Regions attend over words: (B_v, R, D), (T, L, D) trimmed to the longest caption -> (B_v, T)."""
        cfg = self.config
        valid = length_mask(lens, cap.shape[1])  # (T, L)
        s = word_region_scores(img, cap).transpose(-1, -2)  # (B_v, T, R, L): query = regions
        # Every region is a valid query; the norm runs over regions, the softmax over the valid words.
        normed = feature_norm(s, cfg.feature_norm, dim=2)
        logits = (normed * cfg.lambda_softmax).masked_fill(~valid[None, :, None, :], float("-inf"))
        attn = torch.softmax(logits, dim=-1)
        # Padded words get weight 0, so their (finite) rows of the word Gram matrix never contribute.
        region_norm = img.norm(dim=-1)[:, None]  # (B_v, 1, R)
        relevance = attended_cosine(attn, s, gram(cap)[None], region_norm)  # (B_v, T, R)
        return aggregate(relevance, None, cfg.agg, cfg.lambda_lse)
