"""The encoder contract every image and text encoder follows, and the pieces they share.

- image encoders map (B, 3, H, W) images (or (B, R, D) region features) to (B, L_v, embed_dim) tokens,
  token 0 being CLS when ``has_cls``; ``num_patches`` counts the spatial tokens; ``image_size``,
  ``image_mean`` and ``image_std`` say how images must be preprocessed for them;
- text encoders map (B, L) ids and (B,) lengths to (B, L, embed_dim) tokens; lengths count every valid
  position including [CLS]/[SEP], positions at or beyond the length are padding (id 0);
- outputs are projected to ``embed_dim`` but not L2-normalised (the matcher normalises).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from patchword.data.transforms import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["EncoderBase", "padding_mask", "projection"]


class EncoderBase(nn.Module):
    """Base class of every encoder: output width, pretrained flag and optimiser parameter groups.

    Subclasses assign ``self.proj`` (the final projection to ``embed_dim``); everything else is the
    backbone. The official recipe trains pretrained backbones at a tenth of the head learning rate, so
    the trainer needs the two groups separately.

    Attributes:
        embed_dim: width of the output tokens.
        pretrained: True when the backbone weights were loaded from a checkpoint (the trainer applies
            the reduced backbone learning rate only then).
        image_size, image_mean, image_std: the preprocessing an image encoder expects.
        num_patches, has_cls: an image encoder's token geometry: spatial tokens (patches or regions) and
            whether a CLS token comes first (the matcher is built for them).
        patch_size: pixels per patch side of a patch-grid encoder (None: regions, or not known).
        max_len, vocab_size: the sequences a text encoder accepts (position and token embeddings).
    """

    embed_dim: int
    pretrained: bool = False
    proj: nn.Module
    # Image encoders: the square input side in pixels (None: not an image encoder, or any size) and the
    # per-channel normalisation their inputs need (the official SEPS/LAPS code uses ImageNet statistics
    # for every backbone).
    image_size: int | None = None
    image_mean: tuple[float, float, float] = IMAGENET_MEAN
    image_std: tuple[float, float, float] = IMAGENET_STD
    num_patches: int | None = None
    has_cls: bool = False
    patch_size: int | None = None
    # Text encoders: the longest id sequence accepted (None: no limit) and the number of token ids.
    max_len: int | None = None
    vocab_size: int | None = None

    def head_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the output projection (empty when it is ``nn.Identity``)."""
        return self.proj.parameters()

    def backbone_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter that is not in :meth:`head_parameters`."""
        head = {id(p) for p in self.head_parameters()}
        return (p for p in self.parameters() if id(p) not in head)


def projection(in_dim: int, out_dim: int) -> nn.Module:
    """The linear map from backbone width to ``embed_dim``, ``nn.Identity`` when the widths match.

    This mirrors the official SEPS heads (``Linear(768 -> 512)`` after ViT and BERT).
    """
    return nn.Identity() if in_dim == out_dim else nn.Linear(in_dim, out_dim)


def padding_mask(lens: torch.Tensor, length: int) -> torch.Tensor:
    """(B,) valid lengths -> (B, length) bool mask, True at padding positions (PyTorch's convention)."""
    positions = torch.arange(length, device=lens.device)
    return positions.unsqueeze(0) >= lens.unsqueeze(1)
