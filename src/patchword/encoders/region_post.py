"""Processing of region features before their projection: box encoding and a region transformer.

TERAN's bottom-up branch, which TGDT's released checkpoints use (reference/tgdt_ucmfh.md A.3,
``TransformerPostProcessing``), works at the width of the detector features (2048) before anything is
projected into the joint space:

1. **box encoding** of each region's normalised box ``[x1, y1, x2, y2]`` and its area
   ``(x2 - x1) * (y2 - y1)`` (five numbers ``s``):

   * ``concat-and-process``: ``x <- Linear(D, D)(ReLU(Linear(D + 5, D)([x, s])))`` (the released configs);
   * ``project-and-sum``: ``x <- x + Linear(5, D)(s)``;

2. ``layers`` post-norm transformer layers of width D (4 heads, FFN 2048, ReLU, as the official ones), with
   the padding masked.

The region encoder prepends the official "CLS" slot (a zero feature with a zero box) *before* this stage
when its context transformer reads a global token, so the slot's output depends on the regions as it does
officially. Region features carry their boxes as four trailing channels (``data.region_boxes``: the precomp
loader appends ``{split}_boxes.npy``), so images stay one tensor through training, evaluation and search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from patchword.encoders.context import post_norm_layers

__all__ = ["BOX_CHANNELS", "RegionPostConfig", "RegionPostProcessor", "box_features"]

#: Channels a box adds to a region feature: normalised ``x1, y1, x2, y2``.
BOX_CHANNELS = 4
_BOX_ENCODINGS = ("none", "concat-and-process", "project-and-sum")


@dataclass
class RegionPostConfig:
    """Hyper-parameters of :class:`RegionPostProcessor`; the defaults (no layers, no boxes) do nothing."""

    layers: int = 0  # transformer layers of region_dim width before the projection (TGDT release: 4)
    heads: int = 4  # attention heads (official 4); must divide region_dim
    ffn_dim: int = 2048  # feed-forward hidden size (official 2048)
    dropout: float = 0.1  # dropout inside every layer (official image-model.dropout 0.1)
    # none | concat-and-process (TGDT release) | project-and-sum; needs data.region_boxes=true
    box_encoding: Literal["none", "concat-and-process", "project-and-sum"] = "none"

    @property
    def active(self) -> bool:
        """Whether this stage changes anything (otherwise the region encoder skips it)."""
        return self.layers > 0 or self.box_encoding != "none"

    @property
    def reads_boxes(self) -> bool:
        return self.box_encoding != "none"


def box_features(boxes: torch.Tensor) -> torch.Tensor:
    """(..., 4) normalised ``[x1, y1, x2, y2]`` -> (..., 5) with the area ``(x2 - x1) * (y2 - y1)`` last."""
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    return torch.cat([boxes, area.unsqueeze(-1)], dim=-1)


class RegionPostProcessor(nn.Module):
    """(B, R, D) region features and (B, R, 4) boxes -> (B, R, D) processed features.

    Args:
        width: the feature width D (``model.precomp.region_dim``).
        cfg: hyper-parameters.
    """

    def __init__(self, width: int, cfg: RegionPostConfig) -> None:
        super().__init__()
        if cfg.box_encoding not in _BOX_ENCODINGS:
            raise ValueError(f"box_encoding must be one of {_BOX_ENCODINGS}, got {cfg.box_encoding!r}")
        self.cfg = cfg
        if cfg.box_encoding == "concat-and-process":
            self.box_map: nn.Module | None = nn.Sequential(
                nn.Linear(width + 5, width), nn.ReLU(), nn.Linear(width, width)
            )
        elif cfg.box_encoding == "project-and-sum":
            self.box_map = nn.Linear(5, width)
        else:
            self.box_map = None
        self.layers = post_norm_layers(width, cfg.layers, cfg.heads, cfg.ffn_dim, cfg.dropout)

    def forward(self, features: torch.Tensor, boxes: torch.Tensor | None) -> torch.Tensor:
        """Encode the boxes into the features, then run the region transformer (every region valid).

        Args:
            features: (B, R, D) region features.
            boxes: (B, R, 4) normalised boxes; required when ``box_encoding`` is not ``none``.
        """
        if self.box_map is not None:
            if boxes is None:
                raise ValueError("this region encoder encodes boxes: give region features with their boxes")
            info = box_features(boxes.to(features.dtype))
            if self.cfg.box_encoding == "concat-and-process":
                features = self.box_map(torch.cat([features, info], dim=-1))
            else:
                features = features + self.box_map(info)
        for layer in self.layers:
            features = layer(features)
        return features
