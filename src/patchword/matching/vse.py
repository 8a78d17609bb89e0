"""Global cosine baseline: one embedding per image and per caption.

Registered twice: ``vse`` (trained with the hinge) and ``clip``, the same head with a learned temperature
(CLIP's ``logit_scale``) for the symmetric InfoNCE of contrastive pretraining. The temperature scales the
training logits only; ``sims`` stay cosines, so ranking and evaluation are the same for both. ``clip``
trains with InfoNCE only: under the hinge its temperature would never move, and it would be ``vse``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from patchword.matching.base import Matcher, MatcherOutput
from patchword.matching.ops import full_precision, l2norm
from patchword.matching.registry import register_matcher

__all__ = ["VSEConfig", "VSEMatcher"]


@dataclass
class VSEConfig:
    """Arguments of :class:`VSEMatcher`."""

    embed_dim: int = 512  # C, width of the projected tokens
    has_cls: bool = True  # token 0 of img_tokens is CLS
    # image pooling: "cls" (needs has_cls) or "mean" over all image tokens
    pool: Literal["cls", "mean"] = "cls"
    learn_temperature: bool = False  # a learned logit scale for InfoNCE training (``clip``)
    init_temperature: float = 0.07  # CLIP's initial temperature (logit scale 1 / 0.07)
    max_logit_scale: float = 100.0  # CLIP clamps exp(logit_scale) at 100


@register_matcher("vse", VSEConfig, engine="patchword.eval.engine.vse:VSEEngine")
@register_matcher(
    "clip",
    VSEConfig,
    section="vse",
    losses=("infonce",),  # with the hinge, the temperature is never read: that is vse
    engine="patchword.eval.engine.vse:VSEEngine",
    learn_temperature=True,
)
class VSEMatcher(Matcher):
    """sims = cos(pooled image, mean of valid caption tokens); dense text is ignored.

    With ``learn_temperature`` the output's ``extras["logit_scale"]`` is the learned scale by which the
    contrastive loss multiplies the cosines.
    """

    consumes_dense = False  # region / global matchers ignore dense text
    token_level = False  # pooled embeddings only

    def __init__(self, config: VSEConfig) -> None:
        super().__init__()
        if config.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {config.pool!r}")
        if config.pool == "cls" and not config.has_cls:
            raise ValueError("pool='cls' needs has_cls=True (Swin-like tokens have no CLS)")
        self.config = config
        self.embed_dim = config.embed_dim
        self.has_cls = config.has_cls
        if config.learn_temperature:
            if config.init_temperature <= 0:
                raise ValueError(f"init_temperature must be > 0, got {config.init_temperature}")
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / config.init_temperature)))
        else:
            self.logit_scale = None

    def temperature_scale(self) -> torch.Tensor | None:
        """exp(logit_scale), clamped as CLIP does; None without a learned temperature."""
        if self.logit_scale is None:
            return None
        return self.logit_scale.exp().clamp(max=self.config.max_logit_scale)

    def global_image(self, img_tokens: torch.Tensor) -> torch.Tensor:
        self.validate_image_tokens(img_tokens)
        pooled = img_tokens[:, 0] if self.config.pool == "cls" else img_tokens.mean(dim=1)
        return l2norm(full_precision(pooled))

    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """(B_v, B_t) cosines, float32 (float64 for float64 tokens) whatever the token dtype or autocast:
        the embeddings are normalised in full precision; under autocast their product runs in the run's
        precision (a training step's choice) and is cast up. Caption tokens of another float dtype are
        taken in the image tokens' dtype (as SCAN, NAAF and TGDT take them)."""
        img, txt = self.global_embed(img_tokens, cap_tokens.to(img_tokens.dtype), cap_lens)
        extras = {} if self.logit_scale is None else {"logit_scale": self.temperature_scale()}
        return MatcherOutput(sims=full_precision(img @ txt.T), extras=extras)
