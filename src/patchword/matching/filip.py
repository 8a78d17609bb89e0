"""Token-wise late interaction for contrastive pretraining (FILIP, Yao et al., ICLR 2022), plus the global
cosine.

FILIP trains CLIP's two towers with a token-wise similarity instead of (here: next to) the global one: each
patch finds its most similar word and each word its most similar patch,

    s_i2t(v, t) = mean_p max_w cos(patch_p, word_w)      s_t2i(v, t) = mean_w max_p cos(patch_p, word_w)

so the contrastive loss can only be lowered by patch tokens that say what is under them in the words' terms,
the property patch selection relies on (a word's best patch is the patch showing it). The score this matcher
returns is ``global_weight * cos(global image, global text) + (1 - global_weight) * (s_i2t + s_t2i) / 2``:
the global term keeps the pooled embeddings (the first stage of a two-stage search, the demo's baseline)
discriminative. Trained with the symmetric InfoNCE and CLIP's learned temperature (``train.loss=infonce``);
the hinge trains it too, reading no temperature (a run then refuses ``init_temperature`` /
``max_logit_scale`` set to another value than their defaults).

Patches only (not CLS) take part in the token-wise term; caption tokens are the valid positions (the start
and end tokens included, as FILIP keeps them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from patchword.matching.base import Matcher, MatcherOutput, caption_blocks
from patchword.matching.ops import full_precision, l2norm, length_mask
from patchword.matching.registry import register_matcher

__all__ = ["FILIPConfig", "FILIPMatcher"]


@dataclass
class FILIPConfig:
    """Arguments of :class:`FILIPMatcher`."""

    embed_dim: int = 512  # C, width of the projected tokens
    has_cls: bool = True  # token 0 of img_tokens is CLS (left out of the token-wise term)
    global_weight: float = 0.5  # weight of the global cosine in the score (0: token-wise only)
    init_temperature: float = 0.07  # CLIP's initial temperature
    max_logit_scale: float = 100.0
    max_pair_elements: int = 2**26  # patch x word products per block of caption columns (bounds memory)


@register_matcher("filip", FILIPConfig, losses=("hinge", "infonce"))
class FILIPMatcher(Matcher):
    """FILIP's token-wise similarity averaged with the global cosine; a learned temperature for InfoNCE."""

    consumes_dense = False

    def __init__(self, config: FILIPConfig) -> None:
        super().__init__()
        if not 0.0 <= config.global_weight <= 1.0:
            raise ValueError(f"global_weight must lie in [0, 1], got {config.global_weight}")
        if config.init_temperature <= 0:
            raise ValueError(f"init_temperature must be > 0, got {config.init_temperature}")
        self.config = config
        self.embed_dim = config.embed_dim
        self.has_cls = config.has_cls
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / config.init_temperature)))

    def temperature_scale(self) -> torch.Tensor:
        """exp(logit_scale), clamped as CLIP does."""
        return self.logit_scale.exp().clamp(max=self.config.max_logit_scale)

    def token_similarity(
        self, img_tokens: torch.Tensor, cap_tokens: torch.Tensor, cap_lens: torch.Tensor
    ) -> torch.Tensor:
        """(B_v, 1+N or N, C), (B_t, L, C), (B_t,) -> (B_v, B_t) ``(s_i2t + s_t2i) / 2``."""
        patches = l2norm(full_precision(img_tokens[:, int(self.has_cls) :]))  # (B_v, N, C)
        words = l2norm(full_precision(cap_tokens))  # (B_t, L, C)
        valid = length_mask(cap_lens, words.shape[1])  # (B_t, L)
        n_img, n_patch = patches.shape[:2]
        per_col = max(1, self.config.max_pair_elements // max(1, n_img * n_patch * words.shape[1]))
        out = []
        for part in caption_blocks(words.shape[0], per_col):
            w, v = words[part], valid[part]
            cos = torch.einsum("inc,tlc->itnl", patches, w)  # (B_v, T, N, L)
            i2t = cos.masked_fill(~v[None, :, None, :], -math.inf).amax(-1).mean(-1)  # words per patch
            t2i = (cos.amax(2) * v[None]).sum(-1) / v.sum(-1)[None]  # patches per word
            out.append((i2t + t2i) / 2)
        return torch.cat(out, dim=1)

    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """(B_v, B_t) scores, float32 (float64 for float64 tokens) whatever the token dtype or autocast:
        under autocast the products run in the run's precision (a training step's choice) and the score
        is cast up. Caption tokens of another float dtype are taken in the image tokens' dtype (as SCAN,
        NAAF and TGDT take them)."""
        self.validate_image_tokens(img_tokens)
        lens = self.validate_text(cap_tokens, cap_lens)
        cap_tokens = cap_tokens.to(img_tokens.dtype)
        sims = self.token_similarity(img_tokens, cap_tokens, lens)
        weight = self.config.global_weight
        if weight > 0:
            img, txt = self.global_embed(img_tokens, cap_tokens, lens)
            sims = weight * (img @ txt.T) + (1 - weight) * sims
        return MatcherOutput(sims=full_precision(sims), extras={"logit_scale": self.temperature_scale()})
