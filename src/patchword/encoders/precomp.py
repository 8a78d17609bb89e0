"""Image encoder for precomputed region features (SCAN / NAAF / VSE-infinity / TGDT).

The official SCAN and NAAF image encoder is one ``Linear(2048 -> 1024)`` with Xavier-uniform weights and
zero bias, applied to every region (``EncoderImagePrecomp``); VSE-infinity adds a two-layer MLP with
BatchNorm and ReLU to it (``fc(x) + MLP(x)``, MLP 2048 -> 512 -> 1024). TGDT then runs a transformer over
the regions with a global slot first (:mod:`patchword.encoders.context`); its released checkpoints also
encode the regions' boxes and run a transformer at the feature width *before* the projection
(:mod:`patchword.encoders.region_post`, ``model.precomp.post``).

Outputs are projected but not L2-normalised: the official encoders normalise here, patchword's matchers
normalise their inputs themselves (the same operation, done once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain

import torch
from torch import nn

from patchword._validation import check_tensor
from patchword.encoders.base import EncoderBase
from patchword.encoders.context import ContextConfig, ContextTransformer
from patchword.encoders.region_post import BOX_CHANNELS, RegionPostConfig, RegionPostProcessor

__all__ = ["PrecompConfig", "PrecompRegionEncoder"]


@dataclass
class PrecompConfig:
    """Hyper-parameters of :class:`PrecompRegionEncoder`."""

    region_dim: int = 2048  # width of the precomputed features (BUTD pool5: 2048)
    num_regions: int = 36  # regions per image (BUTD: 36 fixed boxes)
    embed_dim: int = 1024  # output width (set from the model's embed_dim by build_model)
    mlp: bool = False  # VSE-infinity: add a 2-layer MLP (BatchNorm + ReLU, hidden embed_dim // 2) to fc
    context: ContextConfig = field(default_factory=ContextConfig)  # transformer over the regions (TGDT)
    post: RegionPostConfig = field(default_factory=RegionPostConfig)  # box encoding + region_dim transformer
    # before the projection (TGDT's released checkpoints: 4 layers, concat-and-process)

    @property
    def input_dim(self) -> int:
        """Channels of one region row: the feature, then its box when the boxes are encoded."""
        return self.region_dim + (BOX_CHANNELS if self.post.reads_boxes else 0)


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

    With ``post`` active and a global token, the global slot is the official zero feature (zero box)
    prepended before the post-processing (its output depends on the regions); without ``post`` it is a
    learned token prepended after the projection (what a zero feature becomes there: ``proj.bias``).

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
        self.post = RegionPostProcessor(cfg.region_dim, cfg.post) if cfg.post.active else None
        self.zero_slot = self.post is not None and cfg.context.global_token
        self.proj = nn.Linear(cfg.region_dim, cfg.embed_dim)
        self.mlp = _RegionMLP(cfg.region_dim, cfg.embed_dim // 2, cfg.embed_dim) if cfg.mlp else None
        context = dataclasses.replace(cfg.context, global_token=False) if self.zero_slot else cfg.context
        self.context = ContextTransformer(cfg.embed_dim, context)
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
            images: (B, R, region_dim) float features (R = ``num_regions``), or (B, R, region_dim + 4) with
                each region's normalised box ``[x1, y1, x2, y2]`` last when ``post`` encodes boxes.

        Returns:
            (B, R, embed_dim) tokens, or (B, 1 + R, embed_dim) with the global slot first; not normalised.
        """
        cfg = self.cfg
        try:
            check_tensor(images, "images", shape=(None, cfg.num_regions, cfg.input_dim))
        except ValueError as err:
            boxes = " + 4 box coordinates" if cfg.post.reads_boxes else ""
            raise ValueError(
                f"{err}; the precomp encoder expects (B, num_regions={cfg.num_regions}, "
                f"region_dim={cfg.region_dim}{boxes}) region features (model.precomp.*)"
            ) from err
        feats = images[..., : cfg.region_dim]
        boxes = images[..., cfg.region_dim :] if cfg.post.reads_boxes else None
        if self.zero_slot:  # the official collate function's CLS slot: a zero feature with a zero box
            feats = torch.cat([feats.new_zeros(feats.shape[0], 1, feats.shape[2]), feats], dim=1)
            if boxes is not None:
                boxes = torch.cat([boxes.new_zeros(boxes.shape[0], 1, boxes.shape[2]), boxes], dim=1)
        if self.post is not None:
            feats = self.post(feats, boxes)
        x = self.proj(feats)
        if self.mlp is not None:
            x = x + self.mlp(feats)
        return self.context(x) if (cfg.context.layers or cfg.context.global_token) else x
