"""Encoders: images and captions -> projected token tensors for the matchers.

Image encoders map (B, 3, H, W) images to (B, L_v, embed_dim) tokens (token 0 is CLS when ``has_cls``;
``num_patches`` spatial tokens); the precomp encoder maps (B, R, region_dim) region features to region
tokens instead. Text encoders map (B, L) ids and (B,) lengths to (B, L, embed_dim)
tokens. Outputs are projected but not L2-normalised. Build one from its config dataclass with
:func:`build_image_encoder` / :func:`build_text_encoder`.

The Hugging Face adapters import ``transformers`` only when used (:mod:`patchword.hub`); caption
tokenisation lives with the data (:mod:`patchword.data.tokenizers`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from patchword.encoders.base import EncoderBase, padding_mask, projection
from patchword.encoders.context import ContextConfig, ContextTransformer, ContextualTextEncoder
from patchword.encoders.hf import HFTextConfig, HFTextEncoder, HFVisionConfig, HFVisionEncoder
from patchword.encoders.precomp import PrecompConfig, PrecompRegionEncoder
from patchword.encoders.region_post import RegionPostConfig, RegionPostProcessor
from patchword.encoders.rnn import BiGRUTextEncoder, GRUTextConfig, load_glove
from patchword.encoders.tiny import TinyTextConfig, TinyTextTransformer, TinyViT, TinyViTConfig

__all__ = [
    "BiGRUTextEncoder",
    "ContextConfig",
    "ContextTransformer",
    "ContextualTextEncoder",
    "GRUTextConfig",
    "EncoderBase",
    "HFTextConfig",
    "HFTextEncoder",
    "HFVisionConfig",
    "HFVisionEncoder",
    "ImageEncoderConfig",
    "PrecompConfig",
    "PrecompRegionEncoder",
    "RegionPostConfig",
    "RegionPostProcessor",
    "TextEncoderConfig",
    "TinyTextConfig",
    "TinyTextTransformer",
    "TinyViT",
    "TinyViTConfig",
    "build_image_encoder",
    "build_text_encoder",
    "load_glove",
    "padding_mask",
    "projection",
]

ImageEncoderConfig = TinyViTConfig | HFVisionConfig | PrecompConfig
TextEncoderConfig = TinyTextConfig | HFTextConfig | GRUTextConfig


def build_image_encoder(cfg: ImageEncoderConfig) -> EncoderBase:
    """Build the image encoder described by ``cfg`` (dispatch on the config type)."""
    if isinstance(cfg, TinyViTConfig):
        return TinyViT(cfg)
    if isinstance(cfg, HFVisionConfig):
        return HFVisionEncoder(
            cfg.name_or_path, kind=cfg.kind, embed_dim=cfg.embed_dim, local_files_only=cfg.local_files_only
        )
    if isinstance(cfg, PrecompConfig):
        return PrecompRegionEncoder(cfg)
    raise TypeError(f"no image encoder for config type {type(cfg).__name__}")


def build_text_encoder(
    cfg: TextEncoderConfig, vocab_size: int | None = None, words: Sequence[str] | None = None
) -> EncoderBase:
    """Build the text encoder described by ``cfg`` (dispatch on the config type).

    Args:
        cfg: a :class:`TinyTextConfig`, :class:`HFTextConfig` or :class:`GRUTextConfig`.
        vocab_size: the tokenizer's vocabulary size. It overrides ``cfg.vocab_size`` for the tiny and
            GRU encoders; a pretrained BERT cannot be resized, so there it must not exceed the model's.
        words: the vocabulary words by id (GRU encoder with a GloVe text file only).
    """
    if isinstance(cfg, GRUTextConfig):
        if vocab_size is not None:
            cfg = dataclasses.replace(cfg, vocab_size=vocab_size)
        return BiGRUTextEncoder(cfg, words=words)
    if isinstance(cfg, TinyTextConfig):
        if vocab_size is not None:
            cfg = dataclasses.replace(cfg, vocab_size=vocab_size)
        return TinyTextTransformer(cfg)
    if isinstance(cfg, HFTextConfig):
        encoder = HFTextEncoder(
            cfg.name_or_path, embed_dim=cfg.embed_dim, local_files_only=cfg.local_files_only
        )
        if vocab_size is not None and vocab_size > encoder.vocab_size:
            raise ValueError(
                f"tokenizer vocabulary ({vocab_size} ids) exceeds the text backbone's ({encoder.vocab_size})"
            )
        return encoder
    raise TypeError(f"no text encoder for config type {type(cfg).__name__}")
