"""Named architectures: ``create_model("seps-vit-b16-code")``, as open_clip's ``create_model``.

Each name is a YAML file in ``patchword/model_configs/``: a ``model`` mapping of
:class:`~patchword.model.ModelConfig` fields and, for Hugging Face backbones, a ``random_init`` mapping with
their architecture so ``pretrained=False`` builds them without downloading anything.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import cache
from importlib import resources
from typing import Any

import torch
import yaml

from patchword.config import config_to_dict, from_dict
from patchword.errors import ConfigError
from patchword.model import ModelConfig, RetrievalModel, build_model

__all__ = ["list_models", "get_model_config", "create_model"]

_PACKAGE = "patchword.model_configs"
#: The vocabulary a word-level text encoder (tiny transformer, GRU) gets when ``create_model`` is not told
#: the tokenizer's: the shipped synthetic-scenes vocabulary (what the demo and the shipped encoders use).
DEFAULT_VOCAB = "synthetic-64"
_WORD_ENCODERS = ("tiny", "gru")

_logger = logging.getLogger(__name__)


@cache
def _named() -> dict[str, dict[str, Any]]:
    configs = {}
    for entry in resources.files(_PACKAGE).iterdir():
        if entry.name.endswith(".yaml"):
            configs[entry.name[: -len(".yaml")]] = yaml.safe_load(entry.read_text())
    return configs


def list_models() -> list[str]:
    """Names of the shipped model configs, sorted."""
    return sorted(_named())


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of named architecture ``name`` with field ``overrides`` on top
    (sections as mappings: ``seps={"sparse_ratio": 0.6}``)."""
    if name not in _named():
        raise ConfigError("model", f"unknown model {name!r}; shipped: {', '.join(list_models())}")
    merged = _merge(config_to_dict(ModelConfig()), _named()[name]["model"])
    return from_dict(ModelConfig, _merge(merged, overrides), "model")


def create_model(
    name: str,
    *,
    pretrained: bool = True,
    vocab_size: int | None = None,
    vocab_words: list[str] | None = None,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> RetrievalModel:
    """Build named architecture ``name``.

    Args:
        name: one of :func:`list_models`.
        pretrained: load the Hugging Face backbones' weights (local directory or cached hub id); False
            builds them randomly initialised from the architecture in the model config (no download).
            The tiny and region encoders always start from scratch.
        vocab_size: the tokenizer's vocabulary size, for the tiny and GRU text encoders (word ids). None:
            the shipped synthetic vocabulary (:data:`DEFAULT_VOCAB`), logged; pass your tokenizer's size
            for other data.
        vocab_words: the vocabulary by id (aligns a GloVe file with the GRU encoder).
        device: where to put the model.
        **overrides: :class:`ModelConfig` fields (``embed_dim=256``, ``seps={"sparse_ratio": 0.6}``).
    """
    cfg = get_model_config(name, **overrides)
    if vocab_size is None and cfg.text_encoder in _WORD_ENCODERS:
        vocab_size, vocab_words = _default_vocab(vocab_words)
        _logger.info(
            "%s: vocab_size not given, using the shipped %s vocabulary (%d words); pass vocab_size= for "
            "your tokenizer",
            name,
            DEFAULT_VOCAB,
            vocab_size,
        )
    random_init = None if pretrained else _named()[name].get("random_init", {})
    return build_model(cfg, vocab_size=vocab_size, vocab_words=vocab_words, random_init=random_init).to(
        device
    )


def _default_vocab(words: list[str] | None) -> tuple[int, list[str]]:
    from patchword.data.tokenizers.word import WordVocab
    from patchword.pretrained import resolve_vocab_path

    vocab = WordVocab.load(resolve_vocab_path(DEFAULT_VOCAB))
    return len(vocab), words if words is not None else list(vocab.idx2word)
