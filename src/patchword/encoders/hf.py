"""Adapters around Hugging Face backbones: ViT and Swin for images, BERT for text.

They reproduce the official SEPS/LAPS feature path: ``last_hidden_state`` of the backbone followed by a
linear projection (``Linear(768 -> 512)`` for ViT-B and BERT-base, ``Linear(1024 -> 512)`` for Swin-B).
ViT outputs CLS plus patches, Swin only patches (its pooled output is not used), BERT every position
with ``attention_mask = ids != 0``. The pooling layers are not built, so every parameter receives a
gradient.

``transformers`` is an optional dependency (``pip install patchword[hf]``); it is imported only when an
adapter is built, so ``import patchword.encoders`` works without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from patchword._validation import check_lengths
from patchword.encoders.base import EncoderBase, padding_mask, projection
from patchword.encoders.fused import fuse_qkv
from patchword.errors import DataError
from patchword.hub import (
    check_weight_files,
    hub_load_errors,
    read_hf_config,
    require_transformers,
    resolve_pretrained,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = [
    "HFTextConfig",
    "HFTextEncoder",
    "HFVisionConfig",
    "HFVisionEncoder",
    "check_backbone_source",
    "require_transformers",
    "resolve_pretrained",
]

logger = logging.getLogger(__name__)

VisionKind = Literal["vit", "swin"]
# Backbone class per ``model_type`` of a transformers config.
_VISION_MODELS: Mapping[str, str] = {"vit": "ViTModel", "swin": "SwinModel"}
_TEXT_MODELS: Mapping[str, str] = {"bert": "BertModel"}


# --------------------------------------------------------------------------------------------------
# Loading helpers
# --------------------------------------------------------------------------------------------------


def _load_backbone(
    source: str | os.PathLike[str] | PretrainedConfig,
    models: Mapping[str, str],
    kind: str | None,
    local_files_only: bool,
) -> tuple[PreTrainedModel, str]:
    """Build a backbone from a transformers config (random init) or load pretrained weights.

    Args:
        source: a transformers config object, a local directory or a hub id.
        models: supported ``model_type`` -> transformers class name.
        kind: the expected ``model_type``; None accepts any in ``models``.
        local_files_only: never download (passed to ``from_pretrained``).

    Returns:
        (model without pooling layer, its ``model_type``).
    """
    transformers = require_transformers()
    if _is_config(source):
        config, name = source, None
    else:
        name, config = read_hf_config(source, local_files_only=local_files_only)
    model_type = config.model_type
    _check_model_type(model_type, models, name)
    if kind is not None and kind != model_type:
        raise ValueError(f"kind='{kind}' but the backbone config has model_type '{model_type}'")
    model_cls = getattr(transformers, models[model_type])
    if name is None:
        return model_cls(config, add_pooling_layer=False), model_type
    # The checkpoint's pooler weights (and a task head's: BertForMaskedLM, ViTForImageClassification) are
    # reported as unexpected and dropped: the pooled output is unused. Tensors of other shapes are loaded
    # as mismatched (not raised on) so that the refusal below can name them.
    with hub_load_errors(name, local_files_only):
        model, info = model_cls.from_pretrained(
            name,
            config=config,
            add_pooling_layer=False,
            local_files_only=local_files_only,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
        )
    _refuse_unloaded(name, model, info)
    # transformers 5 loads weights in the checkpoint's dtype (4.x gave float32); keep float32 master
    # weights like every other module and leave reduced precision to autocast.
    model.float()
    logger.info("loaded %s backbone from %s", model_type, name)
    return model, model_type


def _check_model_type(model_type: str, models: Mapping[str, str], name: str | None) -> None:
    if model_type not in models:
        where = "" if name is None else f" of '{name}'"
        raise ValueError(
            f"unsupported backbone model_type '{model_type}'{where}; expected one of {sorted(models)}"
        )


def check_backbone_source(
    source: str | os.PathLike[str], role: Literal["vision", "text"], *, local_files_only: bool = True
) -> None:
    """What loading the backbone ``source`` needs, checked without reading its weights (a run checks it
    before reading its data): a local directory or a hub id in the local cache (downloads off), its
    config.json of a ``model_type`` the ``role`` supports (vision: vit, swin; text: bert), a weights file that
    is no git-lfs pointer.

    Raises:
        MissingFileError, NotADirectoryError, ModelNotFoundError, DataError: as :func:`read_hf_config` and
            :func:`~patchword.hub.check_weight_files` say.
        ValueError: a ``model_type`` of another kind.
    """
    name, config = read_hf_config(source, local_files_only=local_files_only)
    _check_model_type(config.model_type, _VISION_MODELS if role == "vision" else _TEXT_MODELS, name)
    check_weight_files(name, local_files_only)


def _refuse_unloaded(name: str, model: PreTrainedModel, info: Mapping[str, object]) -> None:
    """Refuse weights that left part of the backbone as transformers initialised it (random values, with
    only a warning from transformers): tensors its config.json describes but the weights file lacks (every
    name under a prefix, another model's weights, fewer layers), or holds in other shapes.

    Args:
        info: ``from_pretrained``'s loading info (``missing_keys``, ``mismatched_keys`` as
            ``(name, shape in the file, shape of the config)``, ``unexpected_keys``).

    Raises:
        DataError: naming the directory, how many tensors did not load and the first of them.
    """
    total = len(model.state_dict())
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: m[0])
    if mismatched:
        first, stored, wanted = mismatched[0]
        raise DataError(
            f"the weights in '{name}' do not fit its config.json: {len(mismatched)} of the backbone's "
            f"{total} tensors differ in shape ({first}: {tuple(stored)} in the weights, "
            f"{tuple(wanted)} by config.json); give the directory save_pretrained wrote, config.json and "
            "weights together"
        )
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        # as many tensors of other names (not a pooler or a head beside fewer layers): their names say why
        unused = sorted(info.get("unexpected_keys") or ())
        held = (
            f"; the weights hold {len(unused)} other tensors, e.g. {unused[0]}"
            if len(unused) >= len(missing)
            else ""
        )
        raise DataError(
            f"the weights in '{name}' do not fit its config.json: {len(missing)} of the backbone's {total} "
            f"tensors are missing from them ({shown}){held}; they would train from random values: give the "
            "directory save_pretrained wrote for this backbone"
        )


def _is_config(source: object) -> bool:
    """Whether ``source`` is a transformers config object (build a randomly initialised backbone)."""
    return isinstance(source, require_transformers().PretrainedConfig)


def _pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _num_patches(config: PretrainedConfig, kind: str) -> int:
    """Spatial output tokens for inputs of ``config.image_size``."""
    (height, width), (ph, pw) = _pair(config.image_size), _pair(config.patch_size)
    if kind == "vit":  # the patch convolution drops incomplete patches
        return (height // ph) * (width // pw)
    # Swin pads to whole patches, then every patch-merging stage halves the grid, padding odd sizes.
    height, width = -(-height // ph), -(-width // pw)
    for _ in range(len(config.depths) - 1):
        height, width = -(-height // 2), -(-width // 2)
    return height * width


# --------------------------------------------------------------------------------------------------
# Vision
# --------------------------------------------------------------------------------------------------


@dataclass
class HFVisionConfig:
    """Configuration of :class:`HFVisionEncoder`."""

    # a local directory, a hub id, or a transformers ViTConfig/SwinConfig for a randomly initialised model
    name_or_path: str | os.PathLike[str] | PretrainedConfig = "google/vit-base-patch16-224-in21k"
    kind: VisionKind | None = None  # "vit" or "swin"; None takes it from the checkpoint's config
    embed_dim: int = 512  # output token width after the projection
    local_files_only: bool = True  # never download; a hub id must already be in the local cache


class HFVisionEncoder(EncoderBase):
    """ViT or Swin from transformers, followed by a projection to ``embed_dim``.

    Args:
        backbone: a local directory, a hub id, or a ``ViTConfig``/``SwinConfig`` for random init.
        kind: "vit" or "swin"; None infers it from the config. A mismatch raises ValueError.
        embed_dim: output token width.
        local_files_only: never download.

    Attributes:
        kind: "vit" or "swin".
        has_cls: True for ViT (token 0 is CLS), False for Swin.
        num_patches: spatial tokens for inputs of the configured image size (196 for ViT-B/16-224,
            49 for Swin-B-224).
    """

    def __init__(
        self,
        backbone: str | os.PathLike[str] | PretrainedConfig,
        *,
        kind: VisionKind | None = None,
        embed_dim: int = 512,
        local_files_only: bool = True,
    ) -> None:
        super().__init__()
        self.backbone, self.kind = _load_backbone(backbone, _VISION_MODELS, kind, local_files_only)
        fuse_qkv(self.backbone)  # one query/key/value product per block (same weights and results)
        config = self.backbone.config
        self.has_cls = self.kind == "vit"
        self.num_patches = _num_patches(config, self.kind)
        self.image_size = _pair(config.image_size)[0]
        # pixels per token side: the patch for ViT, the last stage's downsampled cell for Swin
        self.patch_size = self.image_size // max(1, round(self.num_patches**0.5))
        self.embed_dim = embed_dim
        self.pretrained = not _is_config(backbone)
        self.proj = projection(config.hidden_size, embed_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Encode images.

        Args:
            images: (B, 3, H, W) float tensor, normalised as the backbone expects.

        Returns:
            (B, has_cls + num_patches, embed_dim) tokens, not normalised.
        """
        if images.dim() != 4:
            raise ValueError(f"images must have shape (B, 3, H, W), got {tuple(images.shape)}")
        return self.proj(self.backbone(pixel_values=images).last_hidden_state)


# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------


@dataclass
class HFTextConfig:
    """Configuration of :class:`HFTextEncoder`."""

    # a local directory, a hub id, or a transformers BertConfig for a randomly initialised model
    name_or_path: str | os.PathLike[str] | PretrainedConfig = "bert-base-uncased"
    embed_dim: int = 512  # output token width after the projection
    local_files_only: bool = True  # never download; a hub id must already be in the local cache


class HFTextEncoder(EncoderBase):
    """BERT from transformers, followed by a projection to ``embed_dim``.

    Args:
        backbone: a local directory, a hub id, or a ``BertConfig`` for random init.
        embed_dim: output token width.
        local_files_only: never download.

    Attributes:
        vocab_size: number of token ids the embedding table accepts.
        max_len: longest accepted sequence (BERT's position embeddings).
    """

    def __init__(
        self,
        backbone: str | os.PathLike[str] | PretrainedConfig,
        *,
        embed_dim: int = 512,
        local_files_only: bool = True,
    ) -> None:
        super().__init__()
        self.backbone, _ = _load_backbone(backbone, _TEXT_MODELS, None, local_files_only)
        fuse_qkv(self.backbone)  # one query/key/value product per block (same weights and results)
        config = self.backbone.config
        self.vocab_size = config.vocab_size
        self.max_len = config.max_position_embeddings
        self.embed_dim = embed_dim
        self.pretrained = not _is_config(backbone)
        self.proj = projection(config.hidden_size, embed_dim)

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Encode token ids.

        Args:
            ids: (B, L) long token ids, padding id 0, L <= max_len.
            lens: (B,) valid lengths including [CLS] and [SEP].

        Returns:
            (B, L, embed_dim) tokens, not normalised; values at padding positions are meaningless.
        """
        if ids.dim() != 2 or ids.shape[1] > self.max_len:
            raise ValueError(f"ids must have shape (B, L) with L <= {self.max_len}, got {tuple(ids.shape)}")
        # values are checked when reading them is free (host lengths) or outside training: a training step
        # on an accelerator must not wait for the device
        lens = check_lengths(
            lens,
            "lens",
            size=ids.shape[0],
            max_len=ids.shape[1],
            values=not self.training or lens.device.type == "cpu",
        ).to(ids.device, non_blocking=True)  # host lengths: no wait
        # The official mask is ids != 0; also masking positions >= lens makes the output independent of
        # whatever a caller left in the padding.
        attention_mask = (ids != 0) & ~padding_mask(lens, ids.shape[1])  # (B, L) keys to attend to
        if self.backbone.config._attn_implementation == "sdpa":
            # The (B, 1, L, L) mask transformers builds from the (B, L) one for SDPA, given ready-made:
            # it then skips its check whether any position is padded (``mask.all()``), a host sync on an
            # accelerator, twice per training step (captions, dense captions).
            attention_mask = attention_mask[:, None, None, :].expand(-1, 1, ids.shape[1], -1)
        hidden = self.backbone(input_ids=ids, attention_mask=attention_mask).last_hidden_state
        return self.proj(hidden)
