"""Pretrained tiny encoders: the paper's setting (SEPS fine-tunes pretrained backbones) in miniature.

A pretrained-encoders directory holds ``model.safetensors`` (the ``image_encoder.*`` and ``text_encoder.*``
weights of a :class:`~patchword.model.RetrievalModel`), ``config.json`` (the encoder architecture, the
recipe and the measured metrics) and ``vocab.json`` (the word vocabulary the text encoder embeds). Runs use
one through ``model.tiny_pretrained`` (a directory, or the name of one shipped here, e.g.
``synthetic-64``) and ``data.vocab_path`` (the same directory or name: its vocabulary).
``patchword pretrain`` writes such a directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from patchword.errors import ConfigError, DataError, MissingFileError
from patchword.fileio import atomic_write, atomic_write_text
from patchword.readers import read_json, read_safetensors

__all__ = [
    "ENCODER_KEYS",
    "resolve_pretrained_dir",
    "resolve_vocab_path",
    "encoder_architecture",
    "load_pretrained_encoders",
    "save_pretrained_encoders",
    "shipped_pretrained",
]

_HERE = Path(__file__).resolve().parent
WEIGHTS, CONFIG, VOCAB = "model.safetensors", "config.json", "vocab.json"
#: ModelConfig fields that fix the tiny encoders' parameter shapes.
ENCODER_KEYS = ("embed_dim", "tiny_vit", "tiny_text_width", "tiny_text_depth", "max_text_len")


def shipped_pretrained() -> list[str]:
    """Names of the pretrained-encoder directories shipped with patchword."""
    return sorted(p.name for p in _HERE.iterdir() if (p / WEIGHTS).is_file())


def resolve_pretrained_dir(name_or_path: str | os.PathLike[str], key: str = "model.tiny_pretrained") -> Path:
    """A shipped name (``synthetic-64``) or a directory -> the directory, checked to hold all three files."""
    name = os.fspath(name_or_path)
    path = _HERE / name if name in shipped_pretrained() else Path(name).expanduser()
    if not path.is_dir():
        shipped = ", ".join(shipped_pretrained()) or "none"
        raise MissingFileError(f"{key}={name}: no such directory (shipped pretrained encoders: {shipped})")
    for file in (WEIGHTS, CONFIG, VOCAB):
        if not (path / file).is_file():
            raise MissingFileError(
                f"{key}={name}: {path / file} is missing (written by `patchword pretrain`)"
            )
    return path


def resolve_vocab_path(value: str, key: str = "data.vocab_path") -> str:
    """``data.vocab_path``: a vocabulary json, or a pretrained-encoders directory / shipped name (its
    ``vocab.json``). ``key``: how the caller spells the setting, for the messages (``vocab`` for
    ``create_model_and_transforms``'s argument).

    Raises:
        MissingFileError: no such file, or a directory that is not a pretrained-encoders one (naming
            ``key``).
    """
    value = os.path.expanduser(value)  # ``~/vocab.json``, as the data paths take it
    if value in shipped_pretrained() or Path(value).is_dir():
        return str(resolve_pretrained_dir(value, key=key) / VOCAB)
    if not Path(value).is_file():  # else the json reader's bare FileNotFoundError, naming no setting
        raise MissingFileError(f"{key}={value}: no such file")
    return value


def encoder_architecture(model_cfg) -> dict[str, Any]:
    """The :data:`ENCODER_KEYS` of a ModelConfig as plain values."""
    from dataclasses import asdict, is_dataclass

    return {k: asdict(v) if is_dataclass(v) else v for k in ENCODER_KEYS for v in [getattr(model_cfg, k)]}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_pretrained_encoders(model: torch.nn.Module, model_cfg, name_or_path: str) -> dict[str, Any]:
    """Load the encoders of ``name_or_path`` into ``model`` (strict) and mark them pretrained.

    Returns the directory's ``config.json``.

    Raises:
        MissingFileError: no such directory or file.
        DataError: a damaged ``config.json`` (not JSON, no ``architecture`` mapping) or ``model.safetensors``
            (empty, truncated), naming the file.
        ConfigError: the architecture in the config differs from the directory's (naming the key), or the
            weights do not fit the encoders.
    """
    path = resolve_pretrained_dir(name_or_path)
    meta = read_json(path / CONFIG, "pretrained-encoders config")
    if not isinstance(meta.get("architecture"), dict):
        raise DataError(
            f"{path / CONFIG}: not a pretrained-encoders config: no 'architecture' mapping (the encoder "
            "sizes `patchword pretrain` records)"
        )
    want, have = _flat(encoder_architecture(model_cfg)), _flat(meta["architecture"])
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            raise ConfigError(
                f"model.{key}",
                f"is {want.get(key)!r} but the pretrained encoders in {path} have {have.get(key)!r}",
            )
    weights = read_safetensors(path / WEIGHTS)
    for prefix in ("image_encoder", "text_encoder"):
        encoder = getattr(model, prefix)
        part = {k[len(prefix) + 1 :]: v for k, v in weights.items() if k.startswith(prefix + ".")}
        try:
            encoder.load_state_dict(part)
        except RuntimeError as err:
            detail = str(err).split("\n", 1)[-1].strip().replace("\n", " ")
            raise ConfigError(
                "model.tiny_pretrained", f"{path} does not fit the {prefix}: {detail}"
            ) from None
        encoder.pretrained = True
    return meta


def save_pretrained_encoders(
    model: torch.nn.Module,
    model_cfg,
    vocab_json: Path,
    out_dir: Path,
    meta: dict[str, Any],
    dtype: torch.dtype = torch.float16,
) -> None:
    """Write ``model``'s encoders (floating tensors stored as ``dtype``: float16 halves the file; loading
    casts back to the model's float32), their architecture and ``meta`` (recipe, metrics) to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {
        k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in model.state_dict().items()
        if k.startswith(("image_encoder.", "text_encoder."))
    }
    atomic_write(out_dir / WEIGHTS, lambda fh: fh.write(save(weights)))
    atomic_write(out_dir / VOCAB, lambda fh: fh.write(Path(vocab_json).read_bytes()))
    atomic_write_text(
        out_dir / CONFIG, json.dumps({"architecture": encoder_architecture(model_cfg), **meta}, indent=2)
    )
