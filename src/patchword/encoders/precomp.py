"""Image encoder for precomputed region features (SCAN / NAAF / VSE-infinity / TGDT).

The official SCAN and NAAF image encoder is one ``Linear(2048 -> 1024)`` with Xavier-uniform weights and
zero bias, applied to every region (``EncoderImagePrecomp``); VSE-infinity adds a two-layer MLP with
BatchNorm and ReLU to it (``fc(x) + MLP(x)``, MLP 2048 -> 512 -> 1024). TGDT then runs a transformer over
the regions with a global slot first (:mod:`patchword.encoders.context`).

Outputs are projected but not L2-normalised: the official encoders normalise here, patchword's matchers
normalise their inputs themselves (the same operation, done once).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain

import torch
from torch import nn

from patchword._validation import check_tensor
from patchword.encoders.base import EncoderBase
from patchword.encoders.context import ContextConfig, ContextTransformer

__all__ = ["PrecompConfig", "PrecompRegionEncoder"]


@dataclass
class PrecompConfig:
    """Hyper-parameters of :class:`PrecompRegionEncoder`."""

    region_dim: int = 2048  # width of the precomputed features (BUTD pool5: 2048)
    num_regions: int = 36  # regions per image (BUTD: 36 fixed boxes)
    embed_dim: int = 1024  # output width (set from the model's embed_dim by build_model)
    mlp: bool = False  # VSE-infinity: add a 2-layer MLP (BatchNorm + ReLU, hidden embed_dim // 2) to fc
    context: ContextConfig = field(default_factory=ContextConfig)  # transformer over the regions (TGDT)


class _RegionMLP(nn.Module):
    """VSE-infinity's ``MLP(in, embed // 2, embed, 2)``: Linear -> BatchNorm1d -> ReLU -> Linear."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        # BatchNorm over every region of the batch, as the official code (reshape to (B*N, C)).
        h = self.bn(self.fc1(x).reshape(b * n, -1)).reshape(b, n, -1)
        return self.fc2(torch.relu(h))


class PrecompRegionEncoder(EncoderBase):
    """(B, R, region_dim) region features -> (B, R (+1 global slot), embed_dim) tokens.

    Attributes:
        has_cls: True when a global token is prepended (TGDT), so token 0 is the global slot.
        num_patches: R, the number of region tokens (the global slot excluded).
    """

    def __init__(self, cfg: PrecompConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or PrecompConfig()
        if cfg.region_dim < 1 or cfg.num_regions < 1 or cfg.embed_dim < 1:
            raise ValueError("region_dim, num_regions and embed_dim must be >= 1")
        self.cfg = cfg
        self.embed_dim = cfg.embed_dim
        self.num_patches = cfg.num_regions
        self.has_cls = cfg.context.global_token
        self.proj = nn.Linear(cfg.region_dim, cfg.embed_dim)
        self.mlp = _RegionMLP(cfg.region_dim, cfg.embed_dim // 2, cfg.embed_dim) if cfg.mlp else None
        self.context = ContextTransformer(cfg.embed_dim, cfg.context)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init of ``fc``: Xavier uniform, ``r = sqrt(6 / (in + out))``, zero bias."""
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def head_parameters(self) -> Iterator[nn.Parameter]:
        # Nothing here is pretrained: every parameter is "head" (trained at the full learning rate).
        return chain(self.parameters())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Encode region features.

        Args:
            images: (B, R, region_dim) float features (R = ``num_regions``).

        Returns:
            (B, R, embed_dim) tokens, or (B, 1 + R, embed_dim) with the global slot first; not normalised.
        """
        cfg = self.cfg
        try:
            check_tensor(images, "images", shape=(None, cfg.num_regions, cfg.region_dim))
        except ValueError as err:
            raise ValueError(
                f"{err}; the precomp encoder expects (B, num_regions={cfg.num_regions}, "
                f"region_dim={cfg.region_dim}) region features (model.precomp.*)"
            ) from err
        x = self.proj(images)
        if self.mlp is not None:
            x = x + self.mlp(images)
        return self.context(x) if (cfg.context.layers or cfg.context.global_token) else x
