"""Configuration of a UCMFH hashing run: data, model, optimisation, evaluation.

``load_config(HashRunConfig, "run.yaml", ["train.epochs=100"])`` (:mod:`patchword.config`) builds it from
the defaults, a YAML file and dotted overrides, checking every key and the ``Literal`` choices; the
cross-field rules are :func:`check_hash_config`, and a new run refuses a key given for settings that do not
use it (:func:`~patchword.hashing.usedkeys.check_used_keys`). The defaults are the official UCMFH values.
"""

from __future__ import annotations

import logging
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from patchword._validation import check_at_least, check_finite_number
from patchword.config import apply_overrides, check_common_values, load_config, override_keys
from patchword.errors import ConfigError

__all__ = [
    "HASH_RESUMABLE_KEYS",
    "HASH_RESUME_DATA_KEYS",
    "HASH_EVAL_KEYS",
    "DATA_SOURCE_FORMATS",
    "FORMAT_READS",
    "LOSSES",
    "HashDataConfig",
    "HashModelConfig",
    "HashTrainConfig",
    "HashEvalConfig",
    "HashRunConfig",
    "check_hash_config",
    "check_data_source",
    "alpha_record",
    "hashnet_alpha",
    "new_run_config",
    "saved_run_config",
]

_logger = logging.getLogger(__name__)

#: ``train.loss``: the contrastive loss on both the features and the codes, or HashNet on the codes.
HashLoss = Literal["infonce", "balanced", "infonce_i2t", "hashnet"]
LOSSES: tuple[str, ...] = typing.get_args(HashLoss)


@dataclass
class HashDataConfig:
    """Where the features come from.

    ``format``: ``synthetic`` (labelled synthetic set), ``pairs`` (``image`` / ``text`` ``.npy`` files,
    optional ``labels``; split with ``num_query`` / ``num_train``), ``splits`` (``root`` directory of
    ``train/query/retrieval`` ``.npz`` or ``.pkl``) or ``mat`` (``root`` is a ``.mat`` file).
    """

    format: Literal["synthetic", "pairs", "splits", "mat"] = "synthetic"
    root: str = ""
    image: str = ""
    text: str = ""
    labels: str = ""
    num_query: int = 500
    num_train: int = 2000
    split_seed: int = 0
    synthetic_num_retrieval: int = 4000
    synthetic_seed: int = 0
    synthetic_image_dim: int = 512
    synthetic_text_dim: int = 512


@dataclass
class HashModelConfig:
    """:class:`~patchword.hashing.model.UCMFH` arguments (official values by default)."""

    bits: int = 64
    fusion: Literal["unimodal", "official_fused"] = "unimodal"
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 2048
    dropout: float = 0.1
    hidden: int = 4096
    head_dropout: float = 0.3
    eval_batch_size: int = 128


@dataclass
class HashTrainConfig:
    """Optimisation (official UCMFH values by default).

    ``num_threads`` (0 = leave torch's setting) is applied by ``patchword hash train``, not by the library:
    :func:`~patchword.hashing.runner.train_hashing` never changes the process-wide thread count.
    """

    epochs: int = 50
    batch_size: int = 128
    drop_last: bool = True
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    lr_encoder: float = 1e-4
    lr_heads: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.5, 0.999])
    weight_decay: float = 0.0
    loss: HashLoss = "infonce"
    temperature: float = 0.5
    feature_weight: float = 1.0
    hash_weight: float = 0.5
    hashnet_alpha: float | None = None  # None: 10 / model.bits (hashnet_alpha())
    seed: int = 2023
    num_threads: int = 0
    save_every: int = 10


@dataclass
class HashEvalConfig:
    """Evaluation: mAP@``topk``, precision / recall at ``ks``; ``map_all`` adds mAP over the full ranking."""

    topk: int = 50
    ks: list[int] = field(default_factory=lambda: [1, 5, 10, 50])
    map_all: bool = False


@dataclass
class HashRunConfig:
    """Everything a ``patchword hash train`` run needs."""

    data: HashDataConfig = field(default_factory=HashDataConfig)
    model: HashModelConfig = field(default_factory=HashModelConfig)
    train: HashTrainConfig = field(default_factory=HashTrainConfig)
    eval: HashEvalConfig = field(default_factory=HashEvalConfig)
    output_dir: str = "runs/hash"
    name: str = ""
    device: str = "cpu"


#: Keys a ``hash train --resume`` may change: how long to train, how often to save, where to run and how
#: to evaluate at the end. Everything else (data, model, optimiser, seed) is the run's own (its config.yaml).
HASH_RESUMABLE_KEYS = frozenset(
    {
        "train.epochs",
        "train.save_every",
        "train.num_threads",
        "device",
        "eval.topk",
        "eval.ks",
        "eval.map_all",
    }
)


#: Keys a ``hash train --resume`` may point at the run's data where it lies now (moved, copied): accepted
#: only when the data read there are the ones the run trained on (same rows and sha256, recorded in last.pt).
HASH_RESUME_DATA_KEYS = frozenset({"data.image", "data.text", "data.labels", "data.root"})


#: Keys ``hash eval`` may override on a trained run: how to evaluate, where, and on which data (an imported
#: checkpoint has no data of its own; the weights must fit the features' sizes). Every other key builds
#: another model than the trained weights (``model.bits``) or has no effect on an evaluation.
HASH_EVAL_KEYS = frozenset(
    {"eval.topk", "eval.ks", "eval.map_all", "device", "model.eval_batch_size"}
    | {f"data.{f.name}" for f in fields(HashDataConfig)}
)


#: The ``data.*`` keys that say where the features are, and the formats that read each: another format
#: would ignore it (``--data synthetic --image x.npy`` trained on generated features).
DATA_SOURCE_FORMATS = {
    "data.image": ("pairs",),
    "data.text": ("pairs",),
    "data.labels": ("pairs",),
    "data.root": ("splits", "mat"),
}

#: Where each ``data.format`` takes its features from (the error of a key it does not read says it).
FORMAT_READS = {
    "synthetic": "generates its features",
    "pairs": "reads data.image and data.text (--image, --text)",
    "splits": "reads the split directory data.root (--root)",
    "mat": "reads the .mat file data.root (--root)",
}


#: The longest code length a run takes (published codes are 16-128 bits).
MAX_BITS = 4096


def hashnet_alpha(cfg: HashRunConfig) -> float:
    """The HashNet scale a run trains with: ``train.hashnet_alpha``, or ``10 / model.bits`` when unset."""
    alpha = cfg.train.hashnet_alpha
    return alpha if alpha is not None else 10.0 / cfg.model.bits


def alpha_record(cfg: HashRunConfig) -> dict[str, float]:
    """``{"hashnet_alpha": scale}`` for a HashNet run's records (its config may say null: the default), else
    ``{}``."""
    return {"hashnet_alpha": hashnet_alpha(cfg)} if cfg.train.loss == "hashnet" else {}


def saved_run_config(cfg: HashRunConfig) -> HashRunConfig:
    """A run's saved config (its config.yaml, or its last.pt's) as this version reads it: runs saved before
    the default became ``None`` hold ``train.hashnet_alpha: 0.0`` for it (10 / bits then too), which a new
    run refuses."""
    if cfg.train.hashnet_alpha != 0:
        return cfg
    return replace(cfg, train=replace(cfg.train, hashnet_alpha=None))


def new_run_config(path: str | Path | None, overrides: Sequence[str]) -> HashRunConfig:
    """A new run's config as ``load_config(HashRunConfig, path, overrides)`` builds it (the defaults, the
    ``--config`` file at ``path``, then ``overrides``), except that the file's ``train.hashnet_alpha: 0.0``
    is read as unset (null: 10 / ``model.bits``), with a warning naming the file, as resume and evaluation
    read it (:func:`saved_run_config`): every config.yaml saved before null was the default holds 0.0, and
    the versions that wrote it trained with 10 / bits for any 0.0, so a new run from an old run's config
    trains as that run did. An override of the key is the command's own: ``train.hashnet_alpha=0`` is
    refused (:func:`check_hash_config`)."""
    cfg = load_config(HashRunConfig, path)
    if cfg.train.hashnet_alpha == 0 and "train.hashnet_alpha" not in override_keys(overrides):  # the file's
        _logger.warning(
            "train.hashnet_alpha: 0.0 in %s is how runs saved before null was the default wrote it unset: "
            "read as null (10 / model.bits with train.loss=hashnet); write null (or a scale > 0) there",
            path,
        )
        cfg = saved_run_config(cfg)
    return apply_overrides(cfg, list(overrides))


def check_data_source(
    dc: HashDataConfig, overrides: Sequence[str] | None = None, flags: dict[str, str] | None = None
) -> None:
    """Each key of :data:`DATA_SOURCE_FORMATS` that is set is one ``data.format`` reads: another format's
    key would be ignored without a word. ``overrides`` (``key=value`` items): check only the keys they set
    (a trained run's own config.yaml is not refused for a key it kept); ``flags``: the command-line flag
    that set a key (``{"data.image": "--image"}``), named instead of it, and the format named as ``--data``.

    Raises:
        ConfigError: naming the key (or its flag), the format and the formats that read it.
    """
    given = None if overrides is None else override_keys(overrides)
    for key, formats in DATA_SOURCE_FORMATS.items():
        value = getattr(dc, key.removeprefix("data."))
        if (given is None or key in given) and value and dc.format not in formats:
            name = (flags or {}).get(key, key)
            spell = " or ".join(f"--data {f}" if flags is not None else f"data.format={f}" for f in formats)
            reads = FORMAT_READS.get(dc.format, "does not read it")
            raise ConfigError(name, f"data.format={dc.format} {reads}; {name} is read only with {spell}")


def check_hash_config(cfg: HashRunConfig):
    """Rules the field types cannot express (configs built in code skip the loader's checks, so the
    choices are checked here too); returns the resolved ``torch.device``.

    Every numeric key is checked for its range here, before anything is built or written: a value out of
    range otherwise surfaced after training (``eval.ks=[0]``), as a traceback from torch
    (``model.nhead=0``: ZeroDivisionError) or not at all (``eval.topk=-5`` reported a mislabelled mAP).
    What depends on the data (``nhead`` dividing the feature widths, the number of pairs) is checked when
    the data are built (:mod:`~patchword.hashing.build`), still before anything is written.

    Raises:
        ConfigError: naming the dotted key (an unavailable device included).
    """
    from patchword.device import resolve_device

    device = resolve_device(cfg.device)
    _check_choices(cfg)
    _check_train_ranges(cfg.train)
    _check_model_ranges(cfg.model)
    _check_data_ranges(cfg.data)
    _check_eval_ranges(cfg.eval)
    check_common_values(cfg, seeds=("train.seed", "data.split_seed", "data.synthetic_seed"))
    return device


def _check_choices(cfg: HashRunConfig) -> None:
    tc = cfg.train
    if tc.loss not in LOSSES:
        raise ConfigError("train.loss", f"must be one of {', '.join(LOSSES)}, got {tc.loss!r}")
    if tc.optimizer not in ("adam", "adamw", "sgd"):
        raise ConfigError("train.optimizer", f"must be adam, adamw or sgd, got {tc.optimizer!r}")


def _check_train_ranges(tc: HashTrainConfig) -> None:
    check_at_least("train.batch_size", tc.batch_size, 2, "a contrastive batch")
    if len(tc.betas) != 2:
        raise ConfigError("train.betas", f"must be two numbers, got {tc.betas}")
    check_at_least("train.epochs", tc.epochs, 0, "0 evaluates the untrained model")
    check_at_least("train.num_threads", tc.num_threads, 0, "0 = torch's default")
    check_at_least("train.save_every", tc.save_every, 0, "epochs between checkpoints; 0 = at the end only")
    for key in ("lr_encoder", "lr_heads", "weight_decay", "feature_weight", "hash_weight"):
        check_finite_number(f"train.{key}", getattr(tc, key))
    if tc.hashnet_alpha is not None and not 0 < tc.hashnet_alpha < math.inf:  # 0 was 10/bits, silently
        raise ConfigError(
            "train.hashnet_alpha",
            f"must be a finite number > 0, got {tc.hashnet_alpha!r} (unset, null: 10 / model.bits)",
        )
    for i, beta in enumerate(tc.betas):  # torch names no key ("Invalid beta parameter at index 0")
        if not 0 <= beta < 1:
            raise ConfigError(f"train.betas[{i}]", f"must lie in [0, 1), got {beta!r}")
    check_finite_number("train.temperature", tc.temperature, inclusive=False)


def _check_model_ranges(mc: HashModelConfig) -> None:
    check_at_least("model.bits", mc.bits, 1, "the code length")
    if mc.bits > MAX_BITS:  # a code longer than any feature: --bits 100000000 ran until the memory was gone
        raise ConfigError(
            "model.bits", f"must be at most {MAX_BITS} (the code length; 16-128 is usual), got {mc.bits}"
        )
    check_at_least("model.nhead", mc.nhead, 1, "attention heads")  # 0 was a ZeroDivisionError in torch
    check_at_least("model.num_layers", mc.num_layers, 1, "encoder layers")  # 0 was an IndexError in torch
    check_at_least("model.dim_feedforward", mc.dim_feedforward, 1, "the encoder's feed-forward width")
    check_at_least("model.hidden", mc.hidden, 1, "the hash heads' hidden width")
    check_at_least("model.eval_batch_size", mc.eval_batch_size, 1, "pairs per evaluation block")
    for key in ("dropout", "head_dropout"):  # torch's message names no key either
        if not 0 <= getattr(mc, key) < 1:
            raise ConfigError(f"model.{key}", f"must lie in [0, 1), got {getattr(mc, key)!r}")


def _check_data_ranges(dc: HashDataConfig) -> None:
    check_at_least("data.num_query", dc.num_query, 1, "query pairs")
    check_at_least("data.num_train", dc.num_train, 2, "a contrastive batch needs two training pairs")
    check_at_least("data.synthetic_num_retrieval", dc.synthetic_num_retrieval, 1, "retrieval pairs")
    check_at_least("data.synthetic_image_dim", dc.synthetic_image_dim, 1, "the image feature width")
    check_at_least("data.synthetic_text_dim", dc.synthetic_text_dim, 1, "the text feature width")
    if dc.format == "synthetic" and dc.num_train > dc.synthetic_num_retrieval:
        raise ConfigError(
            "data.num_train",
            f"synthetic training pairs are drawn from the retrieval set: at most "
            f"data.synthetic_num_retrieval={dc.synthetic_num_retrieval}, got {dc.num_train}",
        )


def _check_eval_ranges(ec: HashEvalConfig) -> None:
    if ec.topk < 1:  # mAP@0 is no measurement: a run wrote 0.0 for it
        raise ConfigError("eval.topk", f"must be >= 1, got {ec.topk}")
    if not ec.ks or min(ec.ks) < 1:  # found only after training, by the metrics
        raise ConfigError("eval.ks", f"must be a non-empty list of cut-offs >= 1, got {ec.ks}")
