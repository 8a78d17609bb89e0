"""From-scratch encoders small enough to train on a CPU, and the pieces every encoder shares.

:class:`TinyViT` and :class:`TinyTextTransformer` follow the encoder contract of the pretrained
adapters in :mod:`patchword.encoders.hf`, so a demo trained in minutes exercises exactly the code
paths of a full SEPS run:

- image encoders map (B, 3, H, W) images to (B, L_v, embed_dim) tokens, token 0 being CLS when
  ``has_cls``; ``num_patches`` counts the spatial tokens;
- text encoders map (B, L) ids and (B,) lengths to (B, L, embed_dim) tokens; lengths count every valid
  position including [CLS]/[SEP], positions at or beyond the length are padding (id 0);
- outputs are projected to ``embed_dim`` but not L2-normalised (the matcher normalises).

The pieces every encoder shares (:class:`~patchword.encoders.base.EncoderBase`, the projection, the
padding mask) live in :mod:`patchword.encoders.base`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from patchword._validation import check_lengths
from patchword.encoders.base import EncoderBase, padding_mask, projection

__all__ = ["TinyTextConfig", "TinyTextTransformer", "TinyViT", "TinyViTConfig"]


# --------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------


class _TransformerStack(nn.Module):
    """Pre-norm transformer blocks followed by a final LayerNorm.

    The blocks are kept in a ``ModuleList`` rather than an ``nn.TransformerEncoder``: the latter turns
    padded batches into nested tensors in eval mode and warns that ``norm_first`` disables that path.
    A single ``TransformerEncoderLayer`` may still take PyTorch's fused inference path; with a key
    padding mask it gives the same valid-position outputs as the training path (tested).
    """

    def __init__(self, width: int, depth: int, heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model=width,
                nhead=heads,
                dim_feedforward=int(width * mlp_ratio),
                dropout=dropout,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L, width) -> (B, L, width); ``key_padding_mask`` (B, L) is True at padding."""
        for block in self.blocks:
            x = block(x, src_key_padding_mask=key_padding_mask)
        return self.norm(x)


def _init_weights(module: nn.Module) -> None:
    """timm-style init: truncated normal (std 0.02) for linear maps and embeddings, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.MultiheadAttention):
        # The packed q/k/v projection is a bare Parameter, not an nn.Linear.
        nn.init.trunc_normal_(module.in_proj_weight, std=0.02)
        nn.init.zeros_(module.in_proj_bias)
    elif isinstance(module, nn.Embedding):
        nn.init.trunc_normal_(module.weight, std=0.02)


# --------------------------------------------------------------------------------------------------
# Image
# --------------------------------------------------------------------------------------------------


@dataclass
class TinyViTConfig:
    """Hyper-parameters of :class:`TinyViT`."""

    image_size: int = 64  # input height and width in pixels (square images)
    patch_size: int = 8  # side of a square patch; image_size must be a multiple of it
    width: int = 128  # transformer hidden size
    depth: int = 4  # number of transformer blocks
    heads: int = 4  # attention heads per block; must divide width
    mlp_ratio: float = 4.0  # feed-forward hidden size as a multiple of width
    embed_dim: int = 256  # output token width after the projection
    dropout: float = 0.0  # dropout after the position embedding and inside every block
    # patch: one patch_size x patch_size conv (ViT); conv: log2(patch_size) 3x3 stride-2 conv + BatchNorm +
    # ReLU stages, then a 1x1 conv (Xiao et al. 2021, "Early convolutions help transformers see better"):
    # same tokens, much faster learning from scratch on small data
    stem: Literal["patch", "conv"] = "patch"


def _conv_stem(width: int, patch_size: int) -> nn.Sequential:
    """(B, 3, H, W) -> (B, width, H / patch_size, W / patch_size) through stride-2 3x3 convolutions."""
    stages = patch_size.bit_length() - 1
    if patch_size < 2 or 1 << stages != patch_size:
        raise ValueError(f"stem='conv' needs a power-of-two patch_size >= 2, got {patch_size}")
    layers: list[nn.Module] = []
    channels = 3
    for i in range(stages):
        out = max(8, width >> (stages - 1 - i))
        layers += [
            nn.Conv2d(channels, out, kernel_size=3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(out),
            nn.ReLU(inplace=True),
        ]
        channels = out
    layers.append(nn.Conv2d(channels, width, kernel_size=1))
    return nn.Sequential(*layers)


class TinyViT(EncoderBase):
    """A small Vision Transformer: CLS token plus one token per patch.

    Args:
        cfg: hyper-parameters; defaults to ``TinyViTConfig()``.

    Attributes:
        num_patches: spatial tokens, ``(image_size // patch_size) ** 2``.
        has_cls: always True; token 0 of the output is CLS.
    """

    has_cls = True

    def __init__(self, cfg: TinyViTConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or TinyViTConfig()
        if cfg.image_size % cfg.patch_size:
            raise ValueError(
                f"image_size ({cfg.image_size}) must be a multiple of patch_size ({cfg.patch_size})"
            )
        self.cfg = cfg
        self.embed_dim = cfg.embed_dim
        self.num_patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_size = cfg.patch_size
        self.image_size = cfg.image_size
        if cfg.stem == "patch":
            self.patch_embed = nn.Conv2d(3, cfg.width, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        elif cfg.stem == "conv":
            self.patch_embed = _conv_stem(cfg.width, cfg.patch_size)
        else:
            raise ValueError(f"stem must be 'patch' or 'conv', got {cfg.stem!r}")
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.num_patches, cfg.width))
        self.pos_drop = nn.Dropout(cfg.dropout)
        self.encoder = _TransformerStack(cfg.width, cfg.depth, cfg.heads, cfg.mlp_ratio, cfg.dropout)
        self.proj = projection(cfg.width, cfg.embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every weight (patch embedding keeps PyTorch's default conv init, as timm)."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.apply(_init_weights)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Encode images.

        Args:
            images: (B, 3, image_size, image_size) float tensor.

        Returns:
            (B, 1 + num_patches, embed_dim) tokens, CLS first, not normalised.
        """
        size = self.cfg.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, size, size):
            raise ValueError(f"images must have shape (B, 3, {size}, {size}), got {tuple(images.shape)}")
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, width)
        # expand from (1, width) adds the batch dimension, so backward sums over it into a new (1, 1, width)
        # gradient laid out as cls_token is. Expanding the (1, 1, width) parameter itself passes back, for
        # a batch of one image, the CLS slice of the concatenation's gradient, strided like its (1 + N)
        # rows: DDP then warns "Grad strides do not match bucket view strides" (a stand-in row is such a
        # batch) and copies it every step.
        cls = self.cls_token.view(1, -1).expand(x.shape[0], 1, -1)
        x = self.pos_drop(torch.cat([cls, x], dim=1) + self.pos_embed)
        return self.proj(self.encoder(x))


# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------


@dataclass
class TinyTextConfig:
    """Hyper-parameters of :class:`TinyTextTransformer`."""

    vocab_size: int  # number of token ids; id 0 is padding
    max_len: int = 64  # longest accepted sequence, [CLS] and [SEP] included
    width: int = 128  # transformer hidden size
    depth: int = 2  # number of transformer blocks
    heads: int = 4  # attention heads per block; must divide width
    mlp_ratio: float = 4.0  # feed-forward hidden size as a multiple of width
    embed_dim: int = 256  # output token width after the projection
    dropout: float = 0.0  # dropout after the embeddings and inside every block


class TinyTextTransformer(EncoderBase):
    """A small bidirectional text transformer with learned position embeddings.

    Padding positions are excluded from attention, so the outputs at valid positions do not depend on
    how much padding follows them.

    Args:
        cfg: hyper-parameters.
    """

    def __init__(self, cfg: TinyTextConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_dim = cfg.embed_dim
        self.max_len, self.vocab_size = cfg.max_len, cfg.vocab_size
        self.token_embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.max_len, cfg.width))
        self.embed_drop = nn.Dropout(cfg.dropout)
        self.encoder = _TransformerStack(cfg.width, cfg.depth, cfg.heads, cfg.mlp_ratio, cfg.dropout)
        self.proj = projection(cfg.width, cfg.embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise every weight."""
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.apply(_init_weights)

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Encode token ids.

        Args:
            ids: (B, L) long token ids, L <= max_len.
            lens: (B,) valid lengths, 1 <= lens <= L.

        Returns:
            (B, L, embed_dim) tokens, not normalised; values at padding positions are finite but
            meaningless.
        """
        if ids.dim() != 2 or ids.shape[1] > self.cfg.max_len:
            raise ValueError(
                f"ids must have shape (B, L) with L <= {self.cfg.max_len}, got {tuple(ids.shape)}"
            )
        length = ids.shape[1]
        # min_len=1 keeps at least one key per row: a fully masked row would make attention NaN.
        # values are checked when reading them is free (host lengths) or outside training: a training step
        # on an accelerator must not wait for the device
        lens = check_lengths(
            lens,
            "lens",
            size=ids.shape[0],
            max_len=length,
            values=not self.training or lens.device.type == "cpu",
        ).to(ids.device, non_blocking=True)  # host lengths: no wait
        x = self.embed_drop(self.token_embed(ids) + self.pos_embed[:, :length])
        return self.proj(self.encoder(x, key_padding_mask=padding_mask(lens, length)))
