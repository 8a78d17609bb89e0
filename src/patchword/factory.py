"""``create_model``: the one way in, as open_clip's ``create_model``: a named architecture
(``create_model("seps-vit-b16-code")``), a :class:`~patchword.model.ModelConfig`, or a saved model (an
export or run directory, ``hf-hub:user/name``).

The names are the table in :mod:`patchword.model_configs` (a ``model`` mapping of ``ModelConfig`` fields
and, for Hugging Face backbones, a ``random_init`` mapping with their architecture so ``pretrained=False``
builds them without downloading anything; a backbone the caller points elsewhere is built from the
``config.json`` of that source instead, never from its weights). A saved model is read by
:func:`patchword.runs.load_run`: this module sits above the run directory in the layers
(docs/architecture.md), which builds its models with :func:`patchword.model.build_model` directly.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
from pathlib import Path
from typing import Any

import torch

from patchword.config import config_to_dict, from_dict
from patchword.data.config import DataConfig
from patchword.device import checked_device
from patchword.errors import ConfigError, MissingFileError, ModelNotFoundError
from patchword.model import ModelConfig, RetrievalModel, build_model, check_matcher_options
from patchword.model_configs import list_models, named_model_mapping, named_random_init
from patchword.pretrained import VOCAB, resolve_pretrained_dir, resolve_vocab_path
from patchword.runs import load_run
from patchword.runs.files import CONFIG_FILE

__all__ = [
    "list_models",
    "get_model_config",
    "named_model_mapping",
    "create_model",
    "create_model_and_transforms",
]

#: The vocabulary a word-level text encoder (tiny transformer, GRU) gets when ``create_model`` is not told
#: the tokenizer's: the shipped synthetic-scenes vocabulary (what the demo and the shipped encoders use).
DEFAULT_VOCAB = "synthetic-64"
_WORD_ENCODERS = ("tiny", "gru")
#: How messages name the pretrained tiny encoders here: the keyword argument (``create_model(name,
#: tiny_pretrained=...)``) or the ModelConfig field, not the run config's ``model.tiny_pretrained``.
_TINY_PRETRAINED_KEY = "tiny_pretrained"

_logger = logging.getLogger(__name__)


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
    merged = _merge(config_to_dict(ModelConfig()), named_model_mapping(name))
    return from_dict(ModelConfig, _merge(merged, overrides), "model")


def create_model(
    model: str | os.PathLike[str] | ModelConfig,
    *,
    pretrained: bool = True,
    vocab_size: int | None = None,
    vocab_words: list[str] | None = None,
    device: str | torch.device = "cpu",
    random_init: dict[str, dict[str, Any]] | None = None,
    **overrides: Any,
) -> RetrievalModel:
    """Build a model: the one factory behind training, ``load_run`` and the public API.

    Args:
        model: a named architecture (one of :func:`list_models`; it wins over a folder of the same name
            in the working directory, reached as ``./NAME``), a :class:`ModelConfig` (used as it is, like a
            run's resolved ``model`` section; one setting only ``name`` is that named architecture, and
            ``create_model(name, **overrides)`` changes one), or a saved model: a directory (``str`` or
            ``Path``) written by ``patchword export`` (or a run directory), or ``hf-hub:user/name`` from the
            local cache.
        pretrained: load the pretrained weights the config points at (Hugging Face backbones from a local
            directory or cached hub id; ``tiny_pretrained`` encoders); False builds every Hugging Face
            backbone randomly initialised, with the architecture of the ``hf_vision`` / ``hf_text`` the
            config names after the overrides (read from its ``config.json``, no weights; a named model's
            own backbones use the architecture its config ships, so nothing is downloaded). Region and GRU
            encoders always start from scratch.
        vocab_size: the tokenizer's vocabulary size, for the tiny and GRU text encoders (word ids). None:
            the vocabulary of the pretrained encoders the config names (``tiny_pretrained``), else the
            shipped synthetic vocabulary (:data:`DEFAULT_VOCAB`), logged; pass your tokenizer's size for
            other data.
        vocab_words: the vocabulary by id (aligns a GloVe file with the GRU encoder).
        device: where to put the model: ``auto`` (CUDA when available, else the CPU), ``cpu``, ``cuda``,
            ``cuda:N``, ``mps`` or any other torch device (``meta``); a CUDA or MPS device this machine
            lacks raises a :class:`ConfigError` naming ``device``.
        random_init: the Hugging Face architectures to build randomly initialised (``{"vision"|"text":
            config kwargs}``, as a run's ``backbones.json`` holds them); overrides ``pretrained`` for the
            backbones it names.
        **overrides: :class:`ModelConfig` fields (``embed_dim=256``, ``seps={"sparse_ratio": 0.6}``).

    Raises:
        ConfigError: naming the key, among others for a matcher option that would fail or do nothing
            (:func:`~patchword.model.check_matcher_options`): one the matcher's config lacks, the token
            geometry in ``options``, ``options`` for a matcher with a typed section, a typed section of
            another matcher (``matcher="vse", seps={...}``).
    """
    # checked first, as score_matrix checks it: cuda on a machine without one was torch's bare
    # AssertionError after the whole build, and "auto" (the CLI's default) a RuntimeError
    device = checked_device(device)
    directory = None if isinstance(model, ModelConfig) else _saved_model_directory(model)
    if directory is not None:  # an exported model (or a run directory): its config and weights
        if overrides or vocab_size is not None or random_init is not None:
            raise ConfigError("model", f"{model}: a saved model is loaded as it is (no overrides)")
        return load_run(directory, device=device).model
    cfg = _model_config(model, overrides)
    # the matcher's options, and the sections of the other matchers (``matcher="vse", seps={...}`` would
    # do nothing), before any vocabulary or weights are read; build_model checks the options again
    check_matcher_options(cfg)
    if pretrained and cfg.tiny_pretrained:  # named as the argument, before build_model reads it
        resolve_pretrained_dir(cfg.tiny_pretrained, key=_TINY_PRETRAINED_KEY)
    if vocab_size is None and cfg.text_encoder in _WORD_ENCODERS:
        vocabulary = _word_vocabulary(cfg)
        vocab_size, vocab_words = _vocab_of(_word_vocabulary_file(cfg), vocab_words)
        _logger.info(
            "%s: vocab_size not given, using the %s vocabulary (%d words); pass vocab_size= for your "
            "tokenizer",
            cfg.name or "model",
            vocabulary,
            vocab_size,
        )
    if not pretrained:
        random_init = {**_random_architectures(cfg, skip=set(random_init or {})), **(random_init or {})}
        cfg = dataclasses.replace(cfg, tiny_pretrained="")
    _check_sizes(cfg, vocab_size)
    built = build_model(cfg, vocab_size=vocab_size, vocab_words=vocab_words, random_init=random_init)
    return built.to(device)


def _check_sizes(cfg: ModelConfig, vocab_size: int | None) -> None:
    """The widths every layer is built with, checked before any is: ``vocab_size=0`` built an empty
    embedding table every forward then failed on, a negative width failed in torch, and ``embed_dim=0``
    was named ``model.seps`` after a torch warning about empty layers.

    Raises:
        ConfigError: ``model.embed_dim`` or ``vocab_size`` not an int >= 1 (``vocab_size`` None: not given).
    """
    given = [("model.embed_dim", cfg.embed_dim)] + (
        [("vocab_size", vocab_size)] if vocab_size is not None else []
    )
    for key, value in given:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ConfigError(key, f"must be an int >= 1, got {value!r}")


def _word_vocabulary(cfg: ModelConfig) -> str:
    """The vocabulary a word text encoder of ``cfg`` reads when none is given: that of the pretrained
    encoders it names (their embedding table has one row per word of it), else :data:`DEFAULT_VOCAB`."""
    return cfg.tiny_pretrained or DEFAULT_VOCAB


def _word_vocabulary_file(cfg: ModelConfig) -> str:
    """The ``vocab.json`` of :func:`_word_vocabulary`.

    Raises:
        MissingFileError: ``tiny_pretrained`` is no pretrained-encoders directory or shipped name, naming
            the argument (:data:`_TINY_PRETRAINED_KEY`), not the run config's ``data.vocab_path``.
    """
    if cfg.tiny_pretrained:
        return str(resolve_pretrained_dir(cfg.tiny_pretrained, key=_TINY_PRETRAINED_KEY) / VOCAB)
    return resolve_vocab_path(DEFAULT_VOCAB)


def _model_config(model: str | os.PathLike[str] | ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """The config to build. A :class:`ModelConfig` is taken as it is (a run's resolved ``model`` section
    carries its name as a label beside the fields it resolved to), except one that sets nothing but a
    registered ``name``: that is the named architecture (it built the default one under that name)."""
    if isinstance(model, ModelConfig):
        if model.name in list_models() and dataclasses.replace(model, name="") == ModelConfig():
            return get_model_config(model.name, **overrides)
        return (
            from_dict(ModelConfig, _merge(config_to_dict(model), overrides), "model") if overrides else model
        )
    return get_model_config(os.fspath(model), **overrides)


#: The Hugging Face backbone roles: ``random_init`` key -> (the ModelConfig field naming its source, the
#: encoder setting that uses it).
_HF_ROLES = {"vision": ("hf_vision", "image_encoder", "hf"), "text": ("hf_text", "text_encoder", "bert")}


def _random_architectures(cfg: ModelConfig, skip: set[str]) -> dict[str, dict[str, Any]]:
    """The architecture of each Hugging Face backbone ``cfg`` uses (but those in ``skip``), for a randomly
    initialised build: the one a shipped named model carries for its own backbone (no download), otherwise
    that of the source the config names (an override, or a config without a name), read from its
    ``config.json``: never the weights."""
    shipped = get_model_config(cfg.name) if cfg.name in list_models() else None
    shipped_architectures = named_random_init(cfg.name) if shipped is not None else {}
    out = {}
    for role, (source_key, encoder_key, encoder) in _HF_ROLES.items():
        if role in skip or getattr(cfg, encoder_key) != encoder:
            continue
        source = getattr(cfg, source_key)
        if role in shipped_architectures and getattr(shipped, source_key) == source:
            out[role] = shipped_architectures[role]
        else:
            out[role] = _architecture_of(source, cfg.hf_local_files_only)
    return out


def _architecture_of(source: str, local_files_only: bool) -> dict[str, Any]:
    """``{"model_type": ..., **architecture}`` of a Hugging Face directory or cached hub id (its config)."""
    from patchword.hub import read_hf_config

    _, config = read_hf_config(source, local_files_only=local_files_only)
    return config.to_dict()


def _saved_model_directory(value: str | os.PathLike[str]) -> Path | None:
    """A saved model: a directory holding ``config.yaml`` (``patchword export`` output or a run), or
    ``hf-hub:user/name`` resolved through the local Hugging Face cache (never downloaded). None for a model
    name; a path (a ``Path``, or a string with a separator) that is not a saved model is an error."""
    text = os.fspath(value)
    if isinstance(value, str) and text.startswith("hf-hub:"):
        return _hub_snapshot(text)
    path = Path(text).expanduser()
    if isinstance(value, str) and text in list_models():
        # A registered name is that architecture wherever the command runs: a folder of the same name in
        # the working directory (a run named after its model, say) is reached as ./NAME or a Path.
        if (path / CONFIG_FILE).is_file():
            _logger.warning(
                "%s is a registered model name: building it; pass ./%s for the saved model", text, text
            )
        return None
    if (path / CONFIG_FILE).is_file():
        return path
    if path.is_file():  # a checkpoint or weights file (runs/x/best.pt, best.pt): not a model name either
        raise MissingFileError(_a_file_is_no_model(text, path))
    if not isinstance(value, str) or os.sep in text or "/" in text or path.is_dir():
        what = "has no " + CONFIG_FILE if path.is_dir() else "does not exist"
        raise MissingFileError(
            f"{text}: {what}; expected a directory written by `patchword export` (or a run directory), "
            f"hf-hub:user/name or a model name ({', '.join(list_models())})"
        )
    return None


def _a_file_is_no_model(text: str, path: Path) -> str:
    """What to give instead of the file ``path``: the saved model (an export or run directory) holding
    it when it is one (and ``load_run`` for that very checkpoint), or any of the other things a model is."""
    parent = path.parent
    instead = "a directory written by `patchword export` (or a run directory)"
    if (parent / CONFIG_FILE).is_file():
        instead = (
            f"the saved model directory holding it ({parent}; for this checkpoint of it: "
            f"patchword.runs.load_run({str(parent)!r}, checkpoint={path.name!r}).model)"
        )
    names = ", ".join(list_models())
    return f"{text} is a file, not a model: give {instead}, hf-hub:user/name or a model name ({names})"


def _hub_snapshot(value: str) -> Path:
    from patchword.hub import require_transformers

    require_transformers()
    from huggingface_hub import snapshot_download

    repo = value[len("hf-hub:") :]
    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except Exception as err:  # the hub library raises its own types for a missing cache entry
        raise ModelNotFoundError(
            f"{value}: not in the local Hugging Face cache (download it once with `huggingface-cli "
            f"download {repo}`): {str(err).splitlines()[0]}"
        ) from None


def create_model_and_transforms(
    model: str | os.PathLike[str] | ModelConfig,
    *,
    pretrained: bool = True,
    vocab: str | None = None,
    device: str | torch.device = "cpu",
    **overrides: Any,
) -> tuple[RetrievalModel, Any, Any]:
    """``(model, tokenizer, preprocess)``. Not the triple of open_clip's function of the same name, which
    returns ``(model, preprocess_train, preprocess_val)`` and a tokenizer apart (``get_tokenizer``).

    Args:
        model, pretrained, device, overrides: as :func:`create_model` (a saved model directory or
            ``hf-hub:`` id gives its own model and the tokenizer it was trained with).
        vocab: word encoders: a vocabulary json or a pretrained-encoders directory / shipped name (default:
            that of the pretrained encoders the config names, else :data:`DEFAULT_VOCAB`); BERT encoders
            read the model's ``hf_text`` vocabulary.
    Returns:
        The model; a tokenizer (``batch_encode(texts) -> (ids, lens)``) that cuts a caption as training
        does (a saved model: its run's ``data.max_caption_len``; a named one: the data default, within the
        text encoder's positions), as open_clip's tokenizers cut to their context length; ``preprocess``, a
        PIL image -> (3, H, W) tensor transform as the image encoder expects (None for region-feature
        encoders).
    """
    directory = None if isinstance(model, ModelConfig) else _saved_model_directory(model)
    if directory is not None:
        if overrides or vocab is not None:
            raise ConfigError("model", f"{model}: a saved model is loaded as it is (no overrides, no vocab)")
        loaded = load_run(directory, device=device)
        cut = loaded.tokenizer.with_max_len(loaded.config.data.max_caption_len)  # the run's own is not cut
        return loaded.model, cut, _preprocess(loaded.model)
    cfg = _model_config(model, overrides)
    if cfg.text_encoder in _WORD_ENCODERS:
        from patchword.data.tokenizers.word import WordVocab

        # the argument's own name in the messages (the run config's data.vocab_path is not involved)
        tokenizer = WordVocab.load(
            resolve_vocab_path(vocab, key="vocab") if vocab else _word_vocabulary_file(cfg)
        )
        vocab_size, words = len(tokenizer), list(tokenizer.idx2word)
    else:
        from patchword.data.tokenizers import BertCaptionTokenizer

        tokenizer = BertCaptionTokenizer.from_pretrained(
            cfg.hf_text, local_files_only=cfg.hf_local_files_only
        )
        vocab_size, words = None, None
    built = create_model(cfg, pretrained=pretrained, vocab_size=vocab_size, vocab_words=words, device=device)
    positions = getattr(built.text_encoder, "max_len", None)
    cut = min(DataConfig().max_caption_len, positions or DataConfig().max_caption_len)
    return built, tokenizer.with_max_len(cut), _preprocess(built)


def _preprocess(model: RetrievalModel):
    """The PIL image -> (3, H, W) tensor transform ``model``'s image encoder expects (None: regions)."""
    from patchword.data.transforms import test_transform

    encoder = model.image_encoder
    if encoder.image_size is None:
        return None
    return test_transform(encoder.image_size, encoder.image_mean, encoder.image_std)


def _vocab_of(vocabulary: str, words: list[str] | None) -> tuple[int, list[str]]:
    from patchword.data.tokenizers.word import WordVocab

    vocab = WordVocab.load(vocabulary)
    return len(vocab), words if words is not None else list(vocab.idx2word)
