"""Importer of the official SEPS (dense-caption branch) and LAPS checkpoints: ``model_best.pth`` as their
``train.py`` saves it, ``{'model': VSEModel.state_dict(), 'opt': argparse.Namespace, 'epoch', 'best_rsum',
'Eiters'}`` (reference/seps_laps.md 1).

The two families share one layout: the same ``arguments.py``, the same parameters (SEPS's second, dense
selection module has none). Both therefore recognise it; ``--family seps|laps`` says which code trained it.

Tensors (official prefix -> patchword prefix):

===============================  ============================  ===========================================
``img_enc.visual_encoder.``      ``image_encoder.backbone.``   ViT / Swin (transformers 4 key names are
                                                               renamed to the installed transformers')
``img_enc.vision_proj.``         ``image_encoder.proj.``       absent when ``embed_size`` = backbone width
``txt_enc.bert.``                ``text_encoder.backbone.``    BERT
``txt_enc.fc.``                  ``text_encoder.proj.``        absent when ``embed_size`` = BERT width
``cross_net.aggr_net.``          ``matcher.aggr_net.``         ``scale`` (1, 1, 1) -> (1,)
===============================  ============================  ===========================================

Not loaded (listed in import.json with the reason): the backbones' pooling layers (the official encoders
read ``last_hidden_state``) and constant index buffers the backbones rebuild from their architecture.

Over 400 lines: the key map of SEPS / LAPS checkpoints with the ViT / Swin / BERT backbone renaming, one
official format.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError, DataError
from patchword.imports.base import (
    ImportOptions,
    ImportPlan,
    bert_vocab_file,
    check_opt_names,
    hf_architecture,
    opt_dict,
    register_family,
)
from patchword.imports.published import OFFICIAL_MAX_WORD, text_length_caveat
from patchword.runs.files import BERT_VOCAB_FILE

__all__ = ["detect", "convert"]

_logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------
# The official ``opt`` (arguments.py, identical in LAPS and SEPS, plus what train.py and the encoders add).
# ---------------------------------------------------------------------------------------------------------

#: Fields that decide the model; each is mapped (or checked against the ``--hf-*`` architectures).
_MODEL_OPT = ("vit_type", "img_res", "embed_size", "sparse_ratio", "aggr_ratio", "num_patches")

#: Fields that decide the evaluation or the data it reads, with the official default when a checkpoint
#: lacks one: ``max_word`` (evaluation keeps that many word embeddings), ``dataset`` (f30k: the 1K test
#: split; coco: ``testall`` with the 5-fold 1K protocol too), ``evaluate_cxc`` (COCO's extended metrics),
#: the data paths (the defaults of ``data.root`` / ``data.image_root``, which a user overrides on import
#: or on ``patchword eval``) and ``size_augment`` (the training caption augmentation).
_EVAL_OPT_DEFAULTS: dict[str, Any] = {
    "max_word": OFFICIAL_MAX_WORD,
    "dataset": "f30k",
    "evaluate_cxc": 0,
    "data_path": "data/",
    "f30k_img_path": "",
    "coco_img_path": "",
    "size_augment": 1,
}

#: Fields recorded in import.json but not mapped: they concern training only (optimiser, schedule, loss,
#: logging, processes), name the machine's paths, or change nothing the official code computes:
#: ``shard_size`` only blocks the evaluation's score matrix, ``bert_path`` is never read (the official
#: encoders load ``bert-base-uncased`` by hub name), ``attention_weight`` is stored and never used,
#: ``ratio_weight`` weights a loss term without gradient.
_TRAINING_ONLY_OPT = frozenset(
    {
        "margin", "num_epochs", "batch_size", "grad_clip", "learning_rate", "workers", "log_step",
        "val_step", "logger_name", "model_name", "max_violation", "vse_mean_warmup_epochs",
        "embedding_warmup_epochs", "multi_gpu", "world_size", "rank", "local_rank", "dist_backend",
        "dist_url", "seed", "loss", "eval", "save_results", "gpu_id", "gpu", "distributed", "bert_path",
        "lr_schedules", "decay_rate", "shard_size", "attention_weight", "ratio_weight",
    }
)  # fmt: skip

#: ``vit_type`` -> backbone kind. The official encoders test substrings (``'swin' in vit_type``); these are
#: the values their README and code name (LAPS builds 224-pixel backbones whatever the suffix).
_VIT_TYPES = {f"{kind}{size}": kind for kind in ("vit", "swin") for size in ("", "_224", "_384")}

# ---------------------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------------------

#: official prefix -> (patchword prefix, backbone role or None)
_PREFIXES = (
    ("img_enc.visual_encoder.", "image_encoder.backbone.", "vision"),
    ("img_enc.vision_proj.", "image_encoder.proj.", None),
    ("txt_enc.bert.", "text_encoder.backbone.", "text"),
    ("txt_enc.fc.", "text_encoder.proj.", None),
    ("cross_net.aggr_net.", "matcher.aggr_net.", None),
)

#: Backbone tensors the official checkpoint holds and patchword does not load: pattern -> reason.
_NOT_LOADED = (
    (re.compile(r"^pooler\."), "pooling layer: the official encoders read last_hidden_state only"),
    (
        re.compile(r"\.relative_position_index$"),
        "constant buffer: the Swin backbone rebuilds it from its window size",
    ),
    (
        re.compile(r"^embeddings\.(position_ids|token_type_ids)$"),
        "constant buffer: the backbone rebuilds it",
    ),
)

#: Key names of checkpoints written with transformers 4 (the official code's) -> transformers 5 names;
#: applied in order, and only to a key the installed backbone does not have as it is.
_SHARED_LEGACY = (
    (r"\.attention\.output\.dense\.", ".attention.o_proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),
)
_LEGACY_NAMES = {
    "vit": (
        (r"^encoder\.layer\.(\d+)\.", r"layers.\1."),
        *((rf"\.attention\.attention\.{w}\.", f".attention.{w[0]}_proj.") for w in ("query", "key", "value")),
        *_SHARED_LEGACY,
    ),
    "swin": (
        *((rf"\.attention\.self\.{w}\.", f".attention.{w[0]}_proj.") for w in ("query", "key", "value")),
        (r"\.attention\.self\.(relative_position_bias_table)$", r".attention.relative_position_bias.\1"),
        *_SHARED_LEGACY,
    ),
    "bert": ((r"LayerNorm\.gamma$", "LayerNorm.weight"), (r"LayerNorm\.beta$", "LayerNorm.bias")),
}

_ARG = {"vision": "--hf-vision", "text": "--hf-text"}


# ---------------------------------------------------------------------------------------------------------
# Detection
# ---------------------------------------------------------------------------------------------------------


def detect(ckpt: dict[str, Any]) -> bool:
    """An official SEPS / LAPS ``model_best.pth``: a ``model`` state dict with the VSEModel's encoders and
    the cross_net's aggregation, and an ``opt`` naming the backbone and the ratios (:func:`explain` finds
    nothing missing)."""
    return not explain(ckpt)


#: The parameter prefixes of an official ``model`` state dict (:func:`detect`), with the part each names.
_PARTS = {
    "img_enc.visual_encoder.": "the vision backbone",
    "txt_enc.bert.": "BERT",
    "cross_net.aggr_net.": "the patch aggregation",
}
#: The ``opt`` fields :func:`detect` reads.
_OPT_FIELDS = ("vit_type", "sparse_ratio", "aggr_ratio")


def explain(ckpt: dict[str, Any]) -> str:
    """What :func:`detect` looked for in ``ckpt`` and did not find: the ``model`` entry, a parameter prefix
    of its state dict, ``opt`` or one of its fields (empty when it finds them all)."""
    state = ckpt.get("model")
    if state is None:
        return "it has no 'model' entry (the official train.py saves the state dict there)"
    if not isinstance(state, Mapping):
        return f"its 'model' entry is a {type(state).__name__}, not a state dict"
    if not all(isinstance(k, str) for k in state):
        return "its 'model' entry is not keyed by parameter names"
    missing = [f"{p}* ({part})" for p, part in _PARTS.items() if not any(k.startswith(p) for k in state)]
    if missing:
        return f"its 'model' state dict has no parameter {' nor '.join(missing)}"
    try:
        fields = opt_dict(ckpt)
    except DataError:
        return "it has no 'opt' (the official train.py saves its arguments there)"
    absent = [f for f in _OPT_FIELDS if f not in fields]
    return (
        f"its opt has no {', '.join(absent)} (arguments of the official SEPS / LAPS code)" if absent else ""
    )


# ---------------------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------------------


def convert(ckpt: dict[str, Any], options: ImportOptions, path: Path, *, family: str) -> ImportPlan:
    """The run of an official checkpoint: the ``seps`` matcher (``variant=code``, the dense-caption branch)
    for SEPS, ``laps`` (no dense text) for LAPS; Hugging Face encoders of the ``--hf-*`` architectures."""
    from patchword.config import from_dict
    from patchword.runs.config import RunConfig

    opt = opt_dict(ckpt, str(path))
    _check_opt_keys(opt, family, path)
    pairing = _dense_pairing(options, family)
    kind = _vit_kind(opt)
    offline = options.local_files_only  # model.hf_local_files_only: whether a hub id may be downloaded
    architectures = {
        "vision": hf_architecture(options.hf_vision, "vision", "--hf-vision", local_files_only=offline),
        "text": hf_architecture(options.hf_text, "text", "--hf-text", local_files_only=offline),
    }
    _check_model_types(architectures, kind, opt)
    max_positions = int(architectures["text"].get("max_position_embeddings", 512))
    model = _model_section(opt, options, family, pairing, max_positions)
    expected = _expected_model(model, architectures)
    encoder = expected.image_encoder
    _check_geometry(opt, encoder.num_patches, encoder.has_cls, encoder.image_size)
    data, eval_ = _data_and_eval(opt, family, max_positions)
    config = from_dict(RunConfig, {"data": data, "model": model, "eval": eval_})
    state, ignored = _map_tensors(ckpt["model"], expected.state_dict(), architectures, path, family)
    for key in ckpt:
        if key not in ("model", "opt", "epoch", "best_rsum", "Eiters"):
            ignored[key] = "not part of the official model_best.pth (model, opt, epoch, best_rsum, Eiters)"
    _logger.info(
        "%s: SEPS and LAPS checkpoints have the same layout; importing it as %s (--family chooses)",
        path,
        family,
    )
    _warn_text_length(
        path, family, data["max_caption_len"], opt.get("max_word", _EVAL_OPT_DEFAULTS["max_word"])
    )
    return ImportPlan(
        family=family,
        config=config,
        state_dict=state,
        ignored=ignored,
        opt=opt,
        architectures=architectures,
        metadata={k: _plain(ckpt[k]) for k in ("epoch", "best_rsum", "Eiters") if k in ckpt},
        bert_files=bert_vocab_file(options.hf_text, architectures["text"], local_files_only=offline),
        # _data_and_eval checked it is f30k or coco (absent: the arguments.py default f30k)
        dataset=str(opt.get("dataset", _EVAL_OPT_DEFAULTS["dataset"])),
    )


def _warn_text_length(path: Path, family: str, cut: int, kept: int) -> None:
    """Once per import: the imported run cuts its texts to ``cut`` tokens before BERT, the official
    evaluation keeps ``kept`` (``opt.max_word``) embeddings of BERT's output on the whole text; the export
    card and ``patchword report`` repeat the same caveat
    (:func:`~patchword.imports.published.text_length_caveat`)."""
    _logger.warning("%s: %s (docs/models.md)", path, text_length_caveat(family, cut, kept))


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def _check_opt_keys(opt: dict[str, Any], family: str, path: Path) -> None:
    check_opt_names(opt, path)  # a non-name key would fail the sorting below with a traceback
    known = set(_MODEL_OPT) | set(_EVAL_OPT_DEFAULTS) | _TRAINING_ONLY_OPT
    unknown = sorted(set(opt) - known)
    if unknown:
        raise ConfigError(
            f"opt.{unknown[0]}",
            f"not an option of the official {family.upper()} code (arguments.py); patchword cannot tell "
            "whether it changes the model, so it does not import the checkpoint",
        )
    missing = [k for k in _MODEL_OPT if k not in opt and k != "num_patches"]
    if missing:
        raise ConfigError(f"opt.{missing[0]}", "missing: the official train.py always saves it")


def _dense_pairing(options: ImportOptions, family: str) -> str:
    if family == "laps":
        if options.dense_pairing is not None:
            raise ConfigError("--dense-pairing", "LAPS reads no dense captions; leave it out")
        return "image"
    pairing = options.dense_pairing or "image"
    if pairing not in ("image", "caption"):
        raise ConfigError("--dense-pairing", f"must be image or caption, got {pairing!r}")
    return pairing


def _vit_kind(opt: dict[str, Any]) -> str:
    value = opt["vit_type"]
    # a string first: a list (or any unhashable value) would fail the dict lookup with a traceback
    if not isinstance(value, str) or value not in _VIT_TYPES:
        raise ConfigError(
            "opt.vit_type", f"{value!r} is not a backbone of the official code ({', '.join(_VIT_TYPES)})"
        )
    return _VIT_TYPES[value]


def _check_model_types(architectures: dict[str, dict[str, Any]], kind: str, opt: dict[str, Any]) -> None:
    found = architectures["vision"].get("model_type")
    if found != kind:
        raise ConfigError(
            "--hf-vision", f"is a {found!r} architecture but opt.vit_type={opt['vit_type']!r} needs {kind!r}"
        )
    found = architectures["text"].get("model_type")
    if found != "bert":
        raise ConfigError("--hf-text", f"is a {found!r} architecture; the official text encoder is BERT")


def _number(opt: dict[str, Any], key: str, kind: type, positive: bool = True) -> Any:
    value = opt[key]
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ConfigError(
            f"opt.{key}", f"must be {'a number' if kind is float else 'an integer'}, got {value!r}"
        )
    if positive and value <= 0:
        raise ConfigError(f"opt.{key}", f"must be positive, got {value!r}")
    return kind(value)


def _model_section(
    opt: dict[str, Any], options: ImportOptions, family: str, pairing: str, max_positions: int
) -> dict[str, Any]:
    """The ``model`` section: Hugging Face encoders, the token width, the SEPS/LAPS options as released."""
    from patchword.matching.seps import SEPSConfig

    embed = _number(opt, "embed_size", int)
    ratios = {key: _number(opt, key, float) for key in ("sparse_ratio", "aggr_ratio")}
    for key, value in ratios.items():
        try:
            SEPSConfig(**{key: value}).check()
        except ValueError as err:
            raise ConfigError(f"opt.{key}", str(err)) from None
    seps = {
        "variant": "code",
        "dense_pairing": pairing,
        # SEPS selects under torch.no_grad (selected and fusion tokens carry no gradient); LAPS does not.
        "detach_selection": family == "seps",
        **ratios,
    }
    return {
        "matcher": family,
        "embed_dim": embed,
        "image_encoder": "hf",
        "hf_vision": str(options.hf_vision),
        "text_encoder": "bert",
        "hf_text": str(options.hf_text),
        "max_text_len": max_positions,
        "seps": seps,
    }


def _expected_model(model: dict[str, Any], architectures: dict[str, dict[str, Any]]):
    """The model the mapped config describes, on the meta device: its parameter names, shapes, geometry."""
    from patchword.config import from_dict
    from patchword.factory import create_model
    from patchword.model import ModelConfig

    cfg = from_dict(ModelConfig, model, "model")
    try:
        return create_model(cfg, pretrained=False, random_init=architectures, device="meta")
    except ConfigError as err:
        if err.key.startswith("model.seps"):  # a ratio leaving no token to keep or aggregate
            raise ConfigError("opt.sparse_ratio", f"with opt.aggr_ratio: {err.detail}") from None
        raise


def _check_geometry(opt: dict[str, Any], num_patches: int, has_cls: bool, image_size: int | None) -> None:
    """The official geometry: ``opt.num_patches`` (set by the official encoder) sizes the aggregation, the
    backbone's tokens the selection, and ``is_sqr(tokens)`` decides whether token 0 is CLS."""
    if "num_patches" in opt and _number(opt, "num_patches", int) != num_patches:
        raise ConfigError(
            "opt.num_patches",
            f"is {opt['num_patches']} but the --hf-vision architecture gives {num_patches} patches",
        )
    tokens = num_patches + int(has_cls)
    if (math.isqrt(tokens) ** 2 == tokens) == has_cls:
        raise ConfigError(
            "--hf-vision",
            f"{tokens} output tokens: the official code would take token 0 for CLS "
            f"{'wrongly' if not has_cls else 'not at all'} (it decides by whether the count is a square)",
        )
    img_res = _number(opt, "img_res", int)
    if image_size is not None and img_res != image_size:
        raise ConfigError(
            "opt.img_res", f"is {img_res} but the --hf-vision architecture takes {image_size}-pixel images"
        )


#: The data keys :func:`_data_and_eval` derives from the checkpoint (its BERT tokens, their length, the image
#: resolution, the dense text and the caption augmentation): an import override may not change them.
_DETERMINED = (
    "data.tokenizer",
    "data.bert_vocab",
    "data.max_caption_len",
    "data.max_dense_len",
    "data.image_size",
    "data.dense",
    "data.size_augment",
)


def _data_and_eval(
    opt: dict[str, Any], family: str, max_positions: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``data`` and ``eval`` sections: the official layout, BERT tokens, the evaluation protocol."""
    values = {**_EVAL_OPT_DEFAULTS, **{k: opt[k] for k in _EVAL_OPT_DEFAULTS if k in opt}}
    dataset = values["dataset"]
    if dataset not in ("f30k", "coco"):
        raise ConfigError("opt.dataset", f"must be f30k or coco (the official data loaders), got {dataset!r}")
    max_word = _number(values, "max_word", int)
    if max_word < 3:
        raise ConfigError("opt.max_word", f"must be at least 3 ([CLS], a word, [SEP]), got {max_word}")
    for key in ("data_path", "f30k_img_path", "coco_img_path"):
        if not isinstance(values[key], str):
            raise ConfigError(f"opt.{key}", f"must be a path, got {values[key]!r}")
    for key in ("evaluate_cxc", "size_augment"):
        if not isinstance(values[key], (bool, int)) or int(values[key]) not in (0, 1):
            raise ConfigError(f"opt.{key}", f"must be 0 or 1, got {values[key]!r}")
    test_split = "testall" if dataset == "coco" else "test"
    root = str(Path(values["data_path"]) / dataset)
    # The official evaluation runs BERT on the whole text and keeps the first max_word embeddings;
    # patchword truncates the tokens to max_word (keeping [SEP]) before BERT. Both agree on texts of at
    # most max_word tokens (nearly every caption; most SEPS dense captions are longer).
    length = min(max_word, max_positions)
    data = {
        "dataset": "laps",
        "root": root,
        "image_root": values["coco_img_path" if dataset == "coco" else "f30k_img_path"],
        "test_split": test_split,
        "dense": family == "seps",
        "tokenizer": "bert",
        "bert_vocab": BERT_VOCAB_FILE,  # copied into the run directory, read relative to it
        "max_caption_len": length,
        "max_dense_len": length,
        "size_augment": bool(values["size_augment"]),
        "image_size": _number(opt, "img_res", int),
    }
    if family == "seps":
        data["dense_train"] = str(Path(root) / f"{dataset}_train.jsonl")
        data["dense_test"] = str(Path(root) / f"{dataset}_{test_split}.jsonl")
    eval_ = {
        "split": "test",
        "coco_1k": dataset == "coco",
        "coco_extended": dataset == "coco" and bool(values["evaluate_cxc"]),
    }
    return data, eval_


def _backbone_name(rest: str, prefix: str, model_type: str, expected: dict[str, torch.Tensor]) -> str:
    """The installed backbone's name of official backbone key ``rest`` (relative to the backbone), or the
    reason patchword does not load it (a key starting with ``"not loaded: "``)."""
    if prefix + rest in expected:
        return rest
    for pattern, reason in _NOT_LOADED:
        if pattern.search(rest):
            return f"not loaded: {reason}"
    for source, target in _LEGACY_NAMES.get(model_type, ()):
        rest = re.sub(source, target, rest)
    return rest


def _map_tensors(
    state: Mapping[str, Any],
    expected: dict[str, torch.Tensor],
    architectures: dict[str, dict[str, Any]],
    path: Path,
    family: str,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every official tensor under its patchword name (shape-checked), or in ``ignored`` with the reason."""
    mapped: dict[str, torch.Tensor] = {}
    source_of: dict[str, str] = {}
    ignored: dict[str, str] = {}
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise DataError(f"{path}: model[{key!r}] is a {type(tensor).__name__}, not a tensor")
        match = next(((old, new, role) for old, new, role in _PREFIXES if key.startswith(old)), None)
        if match is None:
            raise DataError(f"{path}: {key} is not a tensor of the official {family.upper()} VSEModel")
        old, new, role = match
        rest = key[len(old) :]
        if role is not None:
            rest = _backbone_name(rest, new, architectures[role].get("model_type", ""), expected)
            if rest.startswith("not loaded: "):
                ignored[key] = rest[len("not loaded: ") :]
                continue
        target = new + rest
        hint = (
            f" (compare {_ARG[role]} with the checkpoint's backbone)" if role else " (compare opt.embed_size)"
        )
        if target not in expected:
            raise DataError(
                f"{path}: {key} has no counterpart in the model built from its opt and the --hf-* "
                f"architectures (looked for {target}){hint}"
            )
        if target in source_of:
            raise DataError(f"{path}: {key} and {source_of[target]} both map to {target}")
        want = tuple(expected[target].shape)
        if key == "cross_net.aggr_net.scale" and tensor.numel() == 1:
            tensor = tensor.reshape(want)  # the official scalar is stored as (1, 1, 1)
        if tuple(tensor.shape) != want:
            raise DataError(
                f"{path}: {key} has shape {tuple(tensor.shape)} but the model built from its opt and the "
                f"--hf-* architectures needs {want} for {target}{hint}"
            )
        mapped[target], source_of[target] = tensor, key
    missing = sorted(set(expected) - set(mapped))
    if missing:
        raise DataError(
            f"{path}: the checkpoint has no tensor for {', '.join(missing[:3])}"
            f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}: the --hf-* architectures or "
            "opt.embed_size describe another model than the one it holds"
        )
    return mapped, ignored


register_family(
    "seps",
    "official SEPS model_best.pth (ViT / Swin + BERT, dense-caption branch)",
    detect,
    functools.partial(convert, family="seps"),
    reads=("hf_vision", "hf_text", "dense_pairing"),
    determines=_DETERMINED,
    explain=explain,
)
register_family(
    "laps",
    "official LAPS model_best.pth (ViT / Swin + BERT)",
    detect,
    functools.partial(convert, family="laps"),
    reads=("hf_vision", "hf_text", "dense_pairing"),  # --dense-pairing: refused with its reason
    determines=_DETERMINED,
    explain=explain,
)
