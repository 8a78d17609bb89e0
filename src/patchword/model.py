"""A retrieval model: image encoder + text encoder + matcher, built from one :class:`ModelConfig`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from patchword._validation import check_token_ids_dtype
from patchword.config import field_subset
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
from patchword.matching import (
    DEFAULT_MATCHER,
    FILIPConfig,
    MatcherOutput,
    NAAFConfig,
    SCANConfig,
    SEPSConfig,
    TGDTConfig,
    VSEConfig,
    build_matcher,
    matcher_reads_dense,
)
from patchword.matching.base import Matcher
from patchword.matching.registry import (
    GEOMETRY,
    list_matchers,
    matcher_preset,
    matcher_reads_stage1_tokens,
    matcher_spec,
)
from patchword.model_configs import named_model_mapping

__all__ = [
    "typed_sections",
    "ModelConfig",
    "NAAFOptions",
    "SCANOptions",
    "SEPSOptions",
    "TGDTOptions",
    "VSEOptions",
    "RetrievalModel",
    "build_model",
    "matcher_arguments",
    "matcher_section",
    "model_reads_dense",
    "training_only_keys",
    "started_pretrained",
]

_logger = logging.getLogger(__name__)


# Typed option sections of the built-in matchers (``model.seps.sparse_ratio``, ``model.scan.direction``):
# each is the matcher's own config dataclass minus the token geometry (embed_dim, num_patches, has_cls), which
# comes from ``embed_dim`` and the image encoder. A registered matcher names its section
# (``register_matcher(..., section=)``); a third-party matcher without a typed section here reads
# ``model.options`` (type-checked against its config class when the run starts).
SEPSOptions = field_subset(
    SEPSConfig, GEOMETRY, "SEPSOptions", __name__, "Options of SEPS / LAPS (see SEPSConfig)."
)
VSEOptions = field_subset(
    VSEConfig, GEOMETRY, "VSEOptions", __name__, "Options of the VSE baseline (see VSEConfig)."
)
FILIPOptions = field_subset(
    FILIPConfig, GEOMETRY, "FILIPOptions", __name__, "Options of FILIP pretraining (see FILIPConfig)."
)
SCANOptions = field_subset(SCANConfig, GEOMETRY, "SCANOptions", __name__, "Options of SCAN (see SCANConfig).")
NAAFOptions = field_subset(NAAFConfig, GEOMETRY, "NAAFOptions", __name__, "Options of NAAF (see NAAFConfig).")
TGDTOptions = field_subset(TGDTConfig, GEOMETRY, "TGDTOptions", __name__, "Options of TGDT (see TGDTConfig).")


@dataclass
class ModelConfig:
    """Architecture of a retrieval model: encoders, the shared token width, and the matcher.

    The matcher's options live in its typed section (``model.seps.sparse_ratio``, ``model.scan.direction``);
    a section other than the one ``matcher`` reads must keep its defaults (a setting there would do
    nothing, so it is an error).
    """

    # a named architecture (patchword/model_configs/NAME.yaml, `patchword.list_models()`) this section starts
    # from: its values apply first, the section's other keys on top ("" = the defaults below)
    name: str = ""
    matcher: str = DEFAULT_MATCHER  # a registry name (patchword.matching.list_matchers())
    embed_dim: int = 512  # width of the projected tokens shared by both encoders (official 512)
    image_encoder: Literal["tiny", "hf", "precomp"] = "tiny"  # hf: ViT / Swin, local dir or hub id;
    # precomp: region features
    text_encoder: Literal["tiny", "bert", "gru"] = "tiny"  # gru: word embedding + BiGRU (SCAN / NAAF)
    tiny_vit: TinyViTConfig = field(default_factory=TinyViTConfig)  # used when image_encoder == tiny
    tiny_text_width: int = 128  # tiny text transformer width
    tiny_text_depth: int = 2  # tiny text transformer blocks
    tiny_pretrained: str = ""  # tiny encoders: pretrained weights to start from (a directory written by
    # `patchword pretrain`, or a shipped name such as synthetic-64); set data.vocab_path to the same value
    hf_vision: str = "google/vit-base-patch16-224-in21k"  # local dir or hub id when image_encoder == hf
    hf_text: str = "bert-base-uncased"  # local dir or hub id when text_encoder == bert
    hf_local_files_only: bool = True  # hub ids (backbones and the BERT vocabulary) only from the local
    # Hugging Face cache; false lets transformers download them (unless HF_HUB_OFFLINE=1 is set)
    max_text_len: int = 256  # longest token sequence the text encoder accepts (dense text included)
    precomp: PrecompConfig = field(default_factory=PrecompConfig)  # image_encoder == precomp
    gru: GRUTextConfig = field(default_factory=GRUTextConfig)  # text_encoder == gru (vocab size set at build)
    text_context: ContextConfig = field(default_factory=ContextConfig)  # transformer after the text encoder
    # (TGDT); the encoders' embed_dim always follows embed_dim above
    seps: SEPSOptions = field(default_factory=SEPSOptions)  # matcher = seps or laps
    vse: VSEOptions = field(default_factory=VSEOptions)  # matcher = vse
    filip: FILIPOptions = field(default_factory=FILIPOptions)  # matcher = filip (token-wise pretraining)
    scan: SCANOptions = field(default_factory=SCANOptions)  # matcher = scan
    naaf: NAAFOptions = field(default_factory=NAAFOptions)  # matcher = naaf
    tgdt: TGDTOptions = field(default_factory=TGDTOptions)  # matcher = tgdt
    options: dict[str, Any] = field(default_factory=dict)  # a plug-in matcher's options (no typed section)

    # Configs written before the matcher sections existed (saved runs, old YAML files) keep loading.
    ALIASES: ClassVar[dict[str, str]] = {
        "variant": "seps.variant",
        "dense_pairing": "seps.dense_pairing",
        "sparse_ratio": "seps.sparse_ratio",
        "aggr_ratio": "seps.aggr_ratio",
        "detach_selection": "seps.detach_selection",
    }

    @classmethod
    def named_base(cls, name: str) -> dict[str, Any]:
        """The ``model`` mapping of named architecture ``name`` (a config loader applies it under the
        section's own keys; see :func:`patchword.config.load_config`)."""
        return named_model_mapping(name)

    @classmethod
    def upgrade_legacy(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The old untyped ``matcher_args`` mapping becomes the matcher's section (still type-checked)."""
        legacy = data.pop("matcher_args", None)
        if legacy:
            section = matcher_section(data.get("matcher", cls.matcher))
            _logger.warning("config key model.matcher_args is deprecated: use model.%s", section)
            data[section] = {**legacy, **(data.get(section) or {})}
        return data


def matcher_section(matcher: str) -> str:
    """The :class:`ModelConfig` section that holds ``matcher``'s options (``laps`` -> ``seps``; ``options``
    for a plug-in matcher without a typed section)."""
    try:
        section = matcher_spec(matcher).section
    except KeyError as err:
        raise ConfigError("model.matcher", str(err.args[0])) from None
    return section if section in typed_sections() else "options"


def training_only_keys() -> dict[str, str]:
    """The ``model.*`` override keys of the options every registered matcher declares training-only
    (``register_matcher(..., training_only=)``), with why: ``model.<section>.<field>`` (``model.options.
    <field>`` for a plug-in matcher without a typed section), and the legacy :attr:`ModelConfig.ALIASES`
    spelling of one (``model.detach_selection``), which loads into the same field."""
    keys = {}
    for name in list_matchers():
        section = matcher_section(name)
        for option, why in matcher_spec(name).training_only.items():
            keys[f"model.{section}.{option}"] = why
    for old, new in ModelConfig.ALIASES.items():
        if f"model.{new}" in keys:
            keys[f"model.{old}"] = keys[f"model.{new}"]
    return keys


def typed_sections() -> list[str]:
    """The :class:`ModelConfig` fields that hold a registered matcher's options."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return sorted({matcher_spec(m).section for m in list_matchers()} & names)


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
) -> RetrievalModel:
    """Build encoders and matcher; the matcher's token geometry follows the image encoder.

    Args:
        cfg: the architecture.
        vocab_size: the tokenizer's vocabulary size (tiny and GRU text encoders).
        vocab_words: the word vocabulary by id, only to align a GloVe file with the GRU encoder.
        random_init: Hugging Face backbones to build randomly initialised instead of loading weights:
            ``{"vision": {...}, "text": {...}}`` of ``transformers.AutoConfig.for_model`` arguments
            (``model_type`` plus the architecture); the named model configs carry them.
    """
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
    encoders = nn.ModuleDict({"image_encoder": image_encoder, "text_encoder": text_encoder})
    if cfg.tiny_pretrained:
        if cfg.image_encoder != "tiny" or cfg.text_encoder != "tiny" or cfg.text_context.layers:
            raise ConfigError(
                "model.tiny_pretrained", "needs model.image_encoder=tiny and model.text_encoder=tiny"
            )
        from patchword.pretrained import load_pretrained_encoders

        load_pretrained_encoders(encoders, cfg, cfg.tiny_pretrained)
    try:
        matcher = build_matcher(cfg.matcher, **{**geometry, **matcher_arguments(cfg)})
    except ValueError as err:  # an option value the matcher refuses
        raise ConfigError(f"model.{matcher_section(cfg.matcher)}", str(err)) from None
    return RetrievalModel(image_encoder, text_encoder, matcher)


def _hf_architecture(spec: dict[str, Any]):
    """A transformers config object (random init, no download) from ``{"model_type": ..., **kwargs}``."""
    from patchword.hub import require_transformers

    spec = dict(spec)
    return require_transformers().AutoConfig.for_model(spec.pop("model_type"), **spec)


def model_reads_dense(cfg: ModelConfig) -> bool:
    """Whether the configured matcher reads dense text (known before building it)."""
    return matcher_reads_dense(cfg.matcher, **matcher_arguments(cfg))


def matcher_arguments(cfg: ModelConfig) -> dict[str, Any]:
    """The matcher's config fields from its section (the geometry comes from the encoders); fields the
    registered preset fixes (``laps``: no dense text) keep the preset's value."""
    section = matcher_section(cfg.matcher)
    options = dict(cfg.options) if section == "options" else dataclasses.asdict(getattr(cfg, section))
    preset = matcher_preset(cfg.matcher)
    return {k: v for k, v in options.items() if k not in preset}
