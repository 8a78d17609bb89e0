"""A retrieval model: image encoder + text encoder + matcher, built from one :class:`ModelConfig`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from patchword.encoders import (
    ContextConfig,
    ContextTransformer,
    ContextualTextEncoder,
    GRUTextConfig,
    HFTextConfig,
    HFVisionConfig,
    PrecompConfig,
    TinyTextConfig,
    TinyViTConfig,
    build_image_encoder,
    build_text_encoder,
)
from patchword.errors import ConfigError
from patchword.matching import MatcherOutput, build_matcher, matcher_reads_dense

__all__ = ["ModelConfig", "RetrievalModel", "build_model", "matcher_arguments", "model_reads_dense"]


@dataclass
class ModelConfig:
    """Architecture of a retrieval model (encoders + matcher)."""

    matcher: str = "seps"  # registry name: seps | laps | vse | scan | naaf | tgdt
    variant: Literal["code", "paper"] = "paper"  # SEPS/LAPS switch preset
    dense_pairing: Literal["image", "caption"] = "image"  # image (leak-free) | caption (official, leaky)
    sparse_ratio: float = 0.5  # rho, fraction of patches kept
    aggr_ratio: float = 0.4  # aggregated tokens = int(N * aggr_ratio * rho)
    detach_selection: bool = False  # True: official no_grad around patch selection
    matcher_args: dict[str, Any] = field(default_factory=dict)  # any other matcher config field
    embed_dim: int = 256  # width of the projected tokens shared by both encoders
    image_encoder: Literal["tiny", "hf", "precomp"] = "tiny"  # hf: ViT / Swin, local dir or hub id;
    # precomp: region features
    text_encoder: Literal["tiny", "bert", "gru"] = "tiny"  # gru: word embedding + BiGRU (SCAN / NAAF)
    tiny_vit: TinyViTConfig = field(default_factory=TinyViTConfig)  # used when image_encoder == tiny
    tiny_text_width: int = 128  # tiny text transformer width
    tiny_text_depth: int = 2  # tiny text transformer blocks
    hf_vision: str = "google/vit-base-patch16-224-in21k"  # local dir or hub id when image_encoder == hf
    hf_text: str = "bert-base-uncased"  # local dir or hub id when text_encoder == bert
    hf_local_files_only: bool = True  # hub ids (backbones and the BERT vocabulary) only from the local
    # Hugging Face cache; false lets transformers download them (unless HF_HUB_OFFLINE=1 is set)
    max_text_len: int = 256  # longest token sequence the text encoder accepts (dense text included)
    precomp: PrecompConfig = field(default_factory=PrecompConfig)  # image_encoder == precomp
    gru: GRUTextConfig = field(default_factory=GRUTextConfig)  # text_encoder == gru (vocab size set at build)
    text_context: ContextConfig = field(default_factory=ContextConfig)  # transformer after the text encoder
    # (TGDT); the encoders' embed_dim always follows embed_dim above


class RetrievalModel(nn.Module):
    """dataset tensors -> encoders -> tokens -> matcher -> similarities."""

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, matcher: nn.Module) -> None:
        super().__init__()
        self.image_encoder = image_encoder
        self.text_encoder = text_encoder
        self.matcher = matcher

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) images or (B, R, D) region features -> (B, L_v, C) projected image tokens."""
        return self.image_encoder(images)

    def encode_texts(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """(B, L) ids and (B,) lengths -> (B, L, C) projected text tokens."""
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


def build_model(
    cfg: ModelConfig, vocab_size: int | None = None, vocab_words: Sequence[str] | None = None
) -> RetrievalModel:
    """Build encoders and matcher; the matcher's token geometry follows the image encoder.

    ``vocab_words`` (the word vocabulary by id) is needed only to align a GloVe text file with the GRU
    text encoder's embedding.
    """
    if cfg.image_encoder == "tiny":
        vit_cfg = TinyViTConfig(**{**cfg.tiny_vit.__dict__, "embed_dim": cfg.embed_dim})
        image_encoder = build_image_encoder(vit_cfg)
    elif cfg.image_encoder == "hf":
        image_encoder = build_image_encoder(
            HFVisionConfig(cfg.hf_vision, embed_dim=cfg.embed_dim, local_files_only=cfg.hf_local_files_only)
        )
    elif cfg.image_encoder == "precomp":
        image_encoder = build_image_encoder(dataclasses.replace(cfg.precomp, embed_dim=cfg.embed_dim))
    else:
        raise ValueError(f"model.image_encoder must be 'tiny', 'hf' or 'precomp', got {cfg.image_encoder!r}")
    if cfg.text_encoder == "tiny":
        if vocab_size is None:
            raise ValueError("the tiny text encoder needs the vocabulary size")
        text_cfg = TinyTextConfig(
            vocab_size=vocab_size,
            max_len=cfg.max_text_len,
            width=cfg.tiny_text_width,
            depth=cfg.tiny_text_depth,
            embed_dim=cfg.embed_dim,
        )
        text_encoder = build_text_encoder(text_cfg)
    elif cfg.text_encoder == "bert":
        text_encoder = build_text_encoder(
            HFTextConfig(cfg.hf_text, embed_dim=cfg.embed_dim, local_files_only=cfg.hf_local_files_only)
        )
    elif cfg.text_encoder == "gru":
        if vocab_size is None:
            raise ValueError("the GRU text encoder needs the vocabulary size (data.tokenizer=word)")
        gru_cfg = dataclasses.replace(cfg.gru, embed_dim=cfg.embed_dim)
        text_encoder = build_text_encoder(gru_cfg, vocab_size=vocab_size, words=vocab_words)
    else:
        raise ValueError(f"model.text_encoder must be 'tiny', 'bert' or 'gru', got {cfg.text_encoder!r}")
    if cfg.text_context.layers:
        if cfg.text_context.global_token:
            raise ValueError("model.text_context.global_token is unsupported: text token 0 is the global one")
        context = ContextTransformer(cfg.embed_dim, cfg.text_context)
        text_encoder = ContextualTextEncoder(text_encoder, context)
    geometry = dict(
        embed_dim=cfg.embed_dim, has_cls=image_encoder.has_cls, num_patches=image_encoder.num_patches
    )
    try:
        matcher = build_matcher(cfg.matcher, **{**geometry, **matcher_arguments(cfg)})
    except TypeError as err:  # an argument the matcher's config does not have
        raise ConfigError("model.matcher_args", str(err)) from None
    return RetrievalModel(image_encoder, text_encoder, matcher)


def model_reads_dense(cfg: ModelConfig) -> bool:
    """Whether the configured matcher reads dense text (known before building it)."""
    return matcher_reads_dense(cfg.matcher, **matcher_arguments(cfg))


def matcher_arguments(cfg: ModelConfig) -> dict[str, Any]:
    """The matcher's config fields that come from the model config (its geometry comes from the encoders)."""
    args: dict[str, Any] = {}
    if cfg.matcher in ("seps", "laps"):
        args.update(
            variant=cfg.variant,
            dense_pairing=cfg.dense_pairing,
            sparse_ratio=cfg.sparse_ratio,
            aggr_ratio=cfg.aggr_ratio,
            detach_selection=cfg.detach_selection,
        )
    return {**args, **cfg.matcher_args}
