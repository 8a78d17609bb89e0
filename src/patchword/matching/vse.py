"""Global cosine baseline: one embedding per image and per caption."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from patchword.matching.base import Matcher, MatcherOutput
from patchword.matching.ops import l2norm
from patchword.matching.registry import register_matcher

__all__ = ["VSEConfig", "VSEMatcher"]


@dataclass
class VSEConfig:
    """Arguments of :class:`VSEMatcher`."""

    embed_dim: int = 512  # C, width of the projected tokens
    has_cls: bool = True  # token 0 of img_tokens is CLS
    # image pooling: "cls" (needs has_cls) or "mean" over all image tokens
    pool: Literal["cls", "mean"] = "cls"


@register_matcher("vse", VSEConfig)
class VSEMatcher(Matcher):
    """sims = cos(pooled image, mean of valid caption tokens); dense text is ignored."""

    consumes_dense = False  # region / global matchers ignore dense text

    def __init__(self, config: VSEConfig) -> None:
        super().__init__()
        if config.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {config.pool!r}")
        if config.pool == "cls" and not config.has_cls:
            raise ValueError("pool='cls' needs has_cls=True (Swin-like tokens have no CLS)")
        self.config = config
        self.embed_dim = config.embed_dim
        self.has_cls = config.has_cls

    def global_image(self, img_tokens: torch.Tensor) -> torch.Tensor:
        self.validate_image_tokens(img_tokens)
        pooled = img_tokens[:, 0] if self.config.pool == "cls" else img_tokens.mean(dim=1)
        return l2norm(pooled.float())

    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        img, txt = self.global_embed(img_tokens, cap_tokens, cap_lens)
        return MatcherOutput(sims=img @ txt.T)
