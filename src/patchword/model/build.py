"""The retrieval model (:class:`RetrievalModel`: image encoder + text encoder + matcher) and its build from
a :class:`~patchword.model.config.ModelConfig` (:func:`build_model`), which checks the matcher's options
first (:func:`~patchword.model.matcher_options.check_matcher_options`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from patchword._validation import check_token_ids_dtype
from patchword.encoders import (
    ContextTransformer,
    ContextualTextEncoder,
    HFTextConfig,
    HFVisionConfig,
    TinyTextConfig,
    TinyViTConfig,
    build_image_encoder,
    build_text_encoder,
)
from patchword.errors import ConfigError
from patchword.matching import MatcherOutput, build_matcher
from patchword.matching.base import Matcher
from patchword.matching.registry import matcher_reads_stage1_tokens
from patchword.model.config import ModelConfig, matcher_section
from patchword.model.matcher_options import check_matcher_options, matcher_arguments, split_saved_geometry

__all__ = ["RetrievalModel", "build_model", "started_pretrained"]

_logger = logging.getLogger(__name__)


class RetrievalModel(nn.Module):
    """dataset tensors -> encoders -> tokens -> matcher -> similarities."""

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, matcher: Matcher) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.matcher = matcher

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) float images or (B, R, D) region features -> (B, L_v, C) projected image tokens,
        cast to the encoder's weight dtype first (float32 pixels into an fp64 or half model)."""
        if not images.is_floating_point():  # uint8 from PIL was torch's error in the first layer
            raise ValueError(f"images must be float, got {images.dtype}: use the run's preprocess transform")
        weight = next(self.image_encoder.parameters(), None)
        if weight is not None:
            images = images.to(weight.dtype)
        return self.image_encoder(images)

    def encode_texts(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 / int32 ids and (B,) lengths -> (B, L, C) text tokens (values unread: no wait)."""
        check_token_ids_dtype(ids)
        return self.text_encoder(ids, lens)

    def forward(
        self,
        images: torch.Tensor,
        cap_ids: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_ids: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """Score every image of the batch against every caption: (B_v, B_t) sims.

        ``dense_ids`` hold one dense caption per batch image (image i's description); with
        ``dense_pairing="caption"`` in a square training batch this is also caption i's ground truth's.
        """
        img = self.encode_images(images)
        cap = self.encode_texts(cap_ids, cap_lens)
        # Matchers that ignore dense text (VSE, LAPS) should not pay for encoding it.
        use_dense = dense_ids is not None and self.matcher.consumes_dense
        dense = self.encode_texts(dense_ids, dense_lens) if use_dense else None
        return self.matcher(img, cap, cap_lens, dense, dense_lens)

    def global_sims(
        self, images: torch.Tensor, cap_ids: torch.Tensor, cap_lens: torch.Tensor
    ) -> torch.Tensor:
        """(B_v, B_t) cosine of the matcher's global embeddings (used to warm-start the encoders)."""
        img = self.encode_images(images)
        cap = self.encode_texts(cap_ids, cap_lens)
        gi, gt = self.matcher.global_embed(img, cap, cap_lens)
        return gi @ gt.T

    def backbone_architectures(self) -> dict[str, dict[str, Any]]:
        """The Hugging Face backbones' architectures (``{"vision"|"text": config dict}``): what
        ``build_model(..., random_init=...)`` needs to rebuild them without their weights files (a saved
        run's checkpoint holds every weight)."""
        out = {}
        for role, encoder in (("vision", self.image_encoder), ("text", self.text_encoder)):
            backbone = getattr(getattr(encoder, "base", encoder), "backbone", None)
            if backbone is not None and hasattr(backbone, "config"):
                out[role] = backbone.config.to_dict()
        return out

    def parameter_groups(self, lr: float, backbone_lr_mult: float) -> list[dict[str, Any]]:
        """AdamW groups: pretrained backbones at ``lr * backbone_lr_mult`` (official recipe), rest at lr."""
        slow, fast = [], list(self.matcher.parameters())
        for enc in (self.image_encoder, self.text_encoder):
            if enc.pretrained:
                slow += list(enc.backbone_parameters())
                fast += list(enc.head_parameters())
            else:
                fast += list(enc.parameters())
        groups = [{"params": fast, "lr": lr, "name": "head"}]
        if slow:
            groups.append({"params": slow, "lr": lr * backbone_lr_mult, "name": "backbone"})
        return groups


def started_pretrained(cfg: ModelConfig) -> tuple[bool, bool]:
    """(image, text): which encoders a run of ``cfg`` starts from pretrained weights (Hugging Face backbones,
    the tiny encoders with ``tiny_pretrained``); those train at ``lr * backbone_lr_mult``."""
    tiny = bool(cfg.tiny_pretrained)
    return (
        cfg.image_encoder == "hf" or (cfg.image_encoder == "tiny" and tiny),
        cfg.text_encoder == "bert" or (cfg.text_encoder == "tiny" and tiny),
    )


def _check_stage1_tokens(cfg: ModelConfig) -> None:
    """Stage-1 local tokens (TGDT's) need both context transformers to hand them over, and only a matcher
    that reads them may ask for them (the matcher declares it: ``Matcher.reads_stage1_tokens``)."""
    wants = matcher_reads_stage1_tokens(cfg.matcher, **matcher_arguments(cfg))
    emitters = {"model.text_context.emit_stage1": cfg.text_context.emit_stage1}
    if cfg.image_encoder == "precomp":
        emitters["model.precomp.context.emit_stage1"] = cfg.precomp.context.emit_stage1
    for key, emits in emitters.items():
        if emits != wants:
            raise ConfigError(
                key,
                f"is {emits}, but {'' if wants else 'only '}model.tgdt.local_tokens=stage1 (TGDT's official "
                "test-time local tokens) reads stage-1 tokens: set it and both emit_stage1 flags together",
            )
    if wants and cfg.image_encoder != "precomp":
        raise ConfigError(
            "model.tgdt.local_tokens", "stage1 needs the region encoder (model.image_encoder=precomp)"
        )


def build_model(
    cfg: ModelConfig,
    vocab_size: int | None = None,
    vocab_words: Sequence[str] | None = None,
    *,
    random_init: dict[str, dict[str, Any]] | None = None,
    saved: str | os.PathLike[str] | None = None,
) -> RetrievalModel:
    """Build encoders and matcher; the matcher's token geometry follows the image encoder.

    Args:
        cfg: the architecture.
        vocab_size: the tokenizer's vocabulary size (tiny and GRU text encoders).
        vocab_words: the word vocabulary by id, only to align a GloVe file with the GRU encoder.
        random_init: Hugging Face backbones to build randomly initialised instead of loading weights:
            ``{"vision": {...}, "text": {...}}`` of ``transformers.AutoConfig.for_model`` arguments
            (``model_type`` plus the architecture); the named model configs carry them.
        saved: the ``config.yaml`` of a saved run ``cfg`` was read from. Token geometry its
            ``model.options`` holds (a plug-in run saved before it was refused there) is accepted where it
            agrees with the encoders' (:func:`_check_saved_geometry`); a new model's is refused.

    Raises:
        ConfigError: a matcher option refused (:func:`~patchword.model.matcher_options.
            check_matcher_options`), naming its key; a saved run's geometry that disagrees, naming its key.
    """
    saved_geometry: dict[str, Any] = {}
    if saved is not None:
        cfg, saved_geometry = split_saved_geometry(cfg)
    # first: an option that would fail, be ignored or be overridden is named before any encoder is built
    check_matcher_options(cfg, unread_sections=False)
    random_init = random_init or {}
    if cfg.image_encoder == "tiny":
        vit_cfg = TinyViTConfig(**{**cfg.tiny_vit.__dict__, "embed_dim": cfg.embed_dim})
        image_encoder = build_image_encoder(vit_cfg)
    elif cfg.image_encoder == "hf":
        from patchword.hub import keyed_source_errors

        source = _hf_architecture(random_init["vision"]) if "vision" in random_init else cfg.hf_vision
        with keyed_source_errors("model.hf_vision", source):  # a directory or hub id: errors name the key
            image_encoder = build_image_encoder(
                HFVisionConfig(source, embed_dim=cfg.embed_dim, local_files_only=cfg.hf_local_files_only)
            )
    elif cfg.image_encoder == "precomp":
        image_encoder = build_image_encoder(dataclasses.replace(cfg.precomp, embed_dim=cfg.embed_dim))
    else:
        raise ValueError(f"model.image_encoder must be 'tiny', 'hf' or 'precomp', got {cfg.image_encoder!r}")
    if cfg.text_encoder == "tiny":
        if vocab_size is None:
            raise ConfigError("vocab_size", "the tiny text encoder needs the tokenizer's vocabulary size")
        text_cfg = TinyTextConfig(
            vocab_size=vocab_size,
            max_len=cfg.max_text_len,
            width=cfg.tiny_text_width,
            depth=cfg.tiny_text_depth,
            embed_dim=cfg.embed_dim,
        )
        text_encoder = build_text_encoder(text_cfg)
    elif cfg.text_encoder == "bert":
        from patchword.hub import keyed_source_errors

        source = _hf_architecture(random_init["text"]) if "text" in random_init else cfg.hf_text
        with keyed_source_errors("model.hf_text", source):  # a directory or hub id: errors name the key
            text_encoder = build_text_encoder(
                HFTextConfig(source, embed_dim=cfg.embed_dim, local_files_only=cfg.hf_local_files_only)
            )
    elif cfg.text_encoder == "gru":
        if vocab_size is None:
            raise ConfigError("vocab_size", "the GRU text encoder needs the word tokenizer's vocabulary size")
        gru_cfg = dataclasses.replace(cfg.gru, embed_dim=cfg.embed_dim)
        text_encoder = build_text_encoder(gru_cfg, vocab_size=vocab_size, words=vocab_words)
    else:
        raise ValueError(f"model.text_encoder must be 'tiny', 'bert' or 'gru', got {cfg.text_encoder!r}")
    _check_stage1_tokens(cfg)
    if cfg.text_context.layers:
        if cfg.text_context.global_token:
            raise ValueError("model.text_context.global_token is unsupported: text token 0 is the global one")
        context = ContextTransformer(cfg.embed_dim, cfg.text_context)
        text_encoder = ContextualTextEncoder(text_encoder, context)
    geometry = dict(
        embed_dim=cfg.embed_dim, has_cls=image_encoder.has_cls, num_patches=image_encoder.num_patches
    )
    _check_saved_geometry(saved_geometry, geometry, saved)
    encoders = nn.ModuleDict({"image_encoder": image_encoder, "text_encoder": text_encoder})
    if cfg.tiny_pretrained:
        if cfg.image_encoder != "tiny" or cfg.text_encoder != "tiny" or cfg.text_context.layers:
            raise ConfigError(
                "model.tiny_pretrained", "needs model.image_encoder=tiny and model.text_encoder=tiny"
            )
        from patchword.pretrained import load_pretrained_encoders

        load_pretrained_encoders(encoders, cfg, cfg.tiny_pretrained)
    try:
        # the geometry last: the encoders decide it (check_matcher_options refused it in model.options;
        # a saved run's that agrees with it was taken out of them)
        matcher = build_matcher(cfg.matcher, **{**matcher_arguments(cfg), **geometry})
    except ValueError as err:  # an option value the matcher refuses
        raise ConfigError(f"model.{matcher_section(cfg.matcher)}", str(err)) from None
    return RetrievalModel(image_encoder, text_encoder, matcher)


def _check_saved_geometry(
    recorded: Mapping[str, Any], geometry: Mapping[str, Any], saved: str | os.PathLike[str] | None
) -> None:
    """The token geometry a saved run's ``model.options`` records (``recorded``), against the ``geometry``
    its encoders give: a value that agrees is dropped (the matcher is built as it was), one that disagrees
    (a matcher built with other geometry than its encoders') is refused.

    Raises:
        ConfigError: naming ``model.options.<key>`` and ``saved``.
    """
    for key, value in recorded.items():
        actual = geometry[key]
        # has_cls=1 is not has_cls=True: the saved run's check refused a value of another type
        if value != actual or isinstance(value, bool) != isinstance(actual, bool):
            raise ConfigError(
                f"model.options.{key}",
                f"is {value!r} in {saved}, but the run's encoders give {key}={actual!r}: token geometry "
                "comes from the encoders (model.embed_dim, the image encoder's patches and CLS token), so "
                "this run's matcher cannot be built as it was saved",
            )
        _logger.debug("%s: model.options.%s=%r is the encoders' token geometry: ignored", saved, key, value)


def _hf_architecture(spec: dict[str, Any]):
    """A transformers config object (random init, no download) from ``{"model_type": ..., **kwargs}``."""
    from patchword.hub import require_transformers

    spec = dict(spec)
    return require_transformers().AutoConfig.for_model(spec.pop("model_type"), **spec)
