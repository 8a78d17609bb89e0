"""The architecture of a retrieval model as a run config's ``model`` section: :class:`ModelConfig` (encoders,
token width, matcher) with a typed options section per built-in matcher, and which section a matcher reads.

Nothing here builds a module (:mod:`patchword.model.build`) or checks a matcher's options against its
registration (:mod:`patchword.model.matcher_options`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from patchword.config import field_subset
from patchword.encoders import (
    ContextConfig,
    GRUTextConfig,
    PrecompConfig,
    TinyViTConfig,
)
from patchword.errors import ConfigError
from patchword.matching import (
    DEFAULT_MATCHER,
    FILIPConfig,
    NAAFConfig,
    SCANConfig,
    SEPSConfig,
    TGDTConfig,
    VSEConfig,
)
from patchword.matching.registry import GEOMETRY, list_matchers, matcher_spec
from patchword.model_configs import named_model_mapping

__all__ = [
    "FILIPOptions",
    "ModelConfig",
    "NAAFOptions",
    "SCANOptions",
    "SEPSOptions",
    "TGDTOptions",
    "VSEOptions",
    "matcher_section",
    "typed_sections",
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


def typed_sections() -> list[str]:
    """The :class:`ModelConfig` fields that hold a registered matcher's options."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return sorted({matcher_spec(m).section for m in list_matchers()} & names)
