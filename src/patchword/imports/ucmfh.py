"""Importer of the official UCMFH checkpoints (XinyuXia97/UCMFH ``utils.save_checkpoints``).

A hash run (task 1) saves ``checkpoints/hash/<dataset>_hash_<bits>.pth`` = ``{"FusionTransformer",
"ImageMlp", "TextMlp"}``, three state dicts and nothing else (no options: the architecture is read from
the tensors' shapes, the rest is hard-coded in ``ICMR.py``). It becomes a hashing run directory
(:mod:`patchword.hashing`, ``model.fusion=official_fused``), which :func:`patchword.hashing.load_hashing_run`
and ``patchword hash eval / search`` read:

========================================================  ==============================================
official                                                  patchword (``UCMFH``)
========================================================  ==============================================
``FusionTransformer``: ``transformerEncoder.layers.i.*``  ``fuse_encoder.layers.i.*``
``ImageMlp``: ``fc1.*``, ``tohash.*``                     ``image_head.fc1.*``, ``image_head.tohash.*``
``TextMlp``: ``fc1.*``, ``tohash.*``                      ``text_head.fc1.*``, ``text_head.tohash.*``
========================================================  ==============================================

From the shapes: ``model.bits`` (``tohash`` rows), ``model.hidden`` (``fc1`` rows), the feature widths
(``fc1`` columns; the fused width must be their sum, split in halves as officially),
``model.num_layers`` and ``model.dim_feedforward``. Hard-coded officially and set as such:
``model.nhead=4``, dropouts 0.1 / 0.3, ``model.eval_batch_size=128`` (the evaluation blocks whose pairs
attend to each other), ``eval.topk=50``. The heads' final L2 normalisation is left out by patchword's
model (it changes neither the codes nor the ranking).

A real-valued checkpoint (``checkpoints/real``, task 0: ``FusionTransformer`` alone) has no hash heads and
is refused: patchword's hashing runs evaluate codes. The features are not in the checkpoint: without data
overrides on import the run's ``data`` section is a synthetic stand-in at the checkpoint's feature widths,
which ``hash eval`` refuses to evaluate unless ``data.format`` is given (``data.format=splits
data.root=DIR``; ``data.format=synthetic`` on purpose), and the import says so; the file name's dataset
and bits are recorded in ``import.json``.

The run directory is written the way ``patchword hash train`` writes one (``config.yaml``, ``last.pt`` as
the trainer saves it at epoch 0, ``model.safetensors`` + ``config.json``) plus ``import.json``, into a
temporary directory renamed into place.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.errors import ConfigError, DataError
from patchword.imports.base import (
    IMPORT_FILE,
    ImportOptions,
    ImportPlan,
    check_fit,
    import_record,
    new_directory,
    register_family,
)
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT

__all__ = ["FAMILY", "detect", "convert", "write_hashing_run"]

_logger = logging.getLogger(__name__)

FAMILY = "ucmfh"
_HEADS = 4  # ICMR.Solver: FuseTransEncoder(num_layers=2, hidden_size=1024, nhead=4)
_EVAL_BLOCK = 128  # ICMR.Solver.batch_size: the evaluation loader's batch = one attention block
_ENC = "transformerEncoder."
_PARTS = {"FusionTransformer": "fuse_encoder.", "ImageMlp": "image_head.", "TextMlp": "text_head."}
_NAME = re.compile(r"^(?P<dataset>.+)_hash_(?P<bits>\d+)\.pth$")


def detect(ckpt: dict[str, Any]) -> bool:
    """A UCMFH checkpoint: a ``FusionTransformer`` state dict of the fusion encoder's layers."""
    fusion = ckpt.get("FusionTransformer")
    return isinstance(fusion, dict) and any(
        isinstance(k, str) and k.startswith(_ENC + "layers.") for k in fusion
    )


def _tensor(ckpt: dict[str, Any], part: str, key: str, path: Path) -> torch.Tensor:
    tensor = ckpt[part].get(key)
    if not isinstance(tensor, torch.Tensor):
        raise DataError(f"{path}: the UCMFH checkpoint has no {part}.{key}")
    return tensor


def _architecture(ckpt: dict[str, Any], path: Path) -> dict[str, int]:
    """Feature widths, bits, head width, encoder depth and FFN width from the tensors' shapes."""
    fusion = ckpt["FusionTransformer"]
    layers = sorted({int(k.split(".")[2]) for k in fusion if k.startswith(_ENC + "layers.")})
    if layers != list(range(len(layers))):
        raise DataError(f"{path}: FusionTransformer has layers {layers}, expected 0..{len(layers) - 1}")
    width = _tensor(ckpt, "FusionTransformer", _ENC + "layers.0.self_attn.in_proj_weight", path).shape[1]
    ffn = _tensor(ckpt, "FusionTransformer", _ENC + "layers.0.linear1.weight", path).shape[0]
    heads = {}
    for part in ("ImageMlp", "TextMlp"):
        fc1 = _tensor(ckpt, part, "fc1.weight", path)
        tohash = _tensor(ckpt, part, "tohash.weight", path)
        heads[part] = (int(fc1.shape[1]), int(fc1.shape[0]), int(tohash.shape[0]))
    (d_img, hidden, bits), (d_txt, hidden_t, bits_t) = heads["ImageMlp"], heads["TextMlp"]
    if (hidden_t, bits_t) != (hidden, bits):
        raise DataError(
            f"{path}: TextMlp.tohash.weight is {bits_t} x {hidden_t}, ImageMlp's {bits} x {hidden}: the "
            "two hash heads of one run have the same shape"
        )
    if d_img != d_txt or d_img + d_txt != width:
        raise DataError(
            f"{path}: ImageMlp.fc1.weight reads {d_img}-d and TextMlp.fc1.weight {d_txt}-d features, but "
            f"FusionTransformer is {width}-d: the official encoder's halves feed the heads"
        )
    if width % _HEADS:
        raise DataError(
            f"{path}: FusionTransformer width {width} is not divisible by the {_HEADS} official heads"
        )
    return {
        "image_dim": d_img,
        "text_dim": d_txt,
        "bits": bits,
        "hidden": hidden,
        "num_layers": len(layers),
        "dim_feedforward": int(ffn),
    }


def convert(ckpt: dict[str, Any], options: ImportOptions, path: Path) -> ImportPlan:
    """Map a UCMFH hash checkpoint onto a hashing run config and ``UCMFH``'s parameter names.

    Raises:
        DataError: a real-valued checkpoint (no hash heads), an entry that is not UCMFH's, heads whose
            shapes disagree with each other or with the fusion encoder (naming the tensor).
    """
    from patchword.hashing.config import HashDataConfig, HashEvalConfig, HashModelConfig, HashRunConfig

    missing = [part for part in ("ImageMlp", "TextMlp") if not isinstance(ckpt.get(part), dict)]
    if missing:
        raise DataError(
            f"{path}: no {' / '.join(missing)}: a real-valued UCMFH checkpoint (checkpoints/real, task 0) "
            "holds the fusion encoder alone; patchword's hashing runs need the hash heads (checkpoints/hash, "
            "task 1)"
        )
    unknown = sorted(str(k) for k in ckpt if k not in _PARTS)
    if unknown:
        raise DataError(
            f"{path}: unexpected entry {unknown[0]!r} in a UCMFH checkpoint (expected {sorted(_PARTS)})"
        )
    arch = _architecture(ckpt, path)
    state: dict[str, torch.Tensor] = {}
    for part, prefix in _PARTS.items():
        for key, tensor in ckpt[part].items():
            name = key[len(_ENC) :] if part == "FusionTransformer" and key.startswith(_ENC) else None
            if part == "FusionTransformer" and name is None:
                raise DataError(
                    f"{path}: unexpected tensor FusionTransformer.{key} (not a layer of the encoder)"
                )
            state[prefix + (name if name is not None else key)] = tensor
    config = HashRunConfig(
        data=HashDataConfig(
            format="synthetic", synthetic_image_dim=arch["image_dim"], synthetic_text_dim=arch["text_dim"]
        ),
        model=HashModelConfig(
            bits=arch["bits"],
            fusion="official_fused",
            nhead=_HEADS,
            num_layers=arch["num_layers"],
            dim_feedforward=arch["dim_feedforward"],
            hidden=arch["hidden"],
            eval_batch_size=_EVAL_BLOCK,
        ),
        eval=HashEvalConfig(topk=50),  # calculate_top_map(topk=50)
    )
    named = _NAME.match(path.name)
    if named and int(named.group("bits")) != arch["bits"]:
        # the tensors decide (tohash's rows): a renamed or mislabelled file must not pass unnoticed
        _logger.warning(
            "%s: the file name says %s bits, the checkpoint's hash heads have %d (tohash rows): importing "
            "%d-bit codes (model.bits=%d)",
            path,
            named.group("bits"),
            arch["bits"],
            arch["bits"],
            arch["bits"],
        )
    metadata: dict[str, Any] = {
        "image_dim": arch["image_dim"],
        "text_dim": arch["text_dim"],
        "dataset": named.group("dataset") if named else None,
        "bits_in_name": int(named.group("bits")) if named else None,
        "data": "the checkpoint holds no features: set data.format / data.root (the official "
        "train / query / retrieval pickles: data.format=splits)",
        "not_reproduced": "the official loaders' drop_last and 4,992-pair training cut (docs/hashing.md)",
    }
    return ImportPlan(family=FAMILY, config=config, state_dict=state, metadata=metadata)


def _placeholder_data(image_dim: int, text_dim: int):
    """Two zero pairs: the trainer needs a dataset to exist, its saved state holds none of it."""
    from patchword.hashing.dataset import HashDataset, make_split

    split = make_split(
        np.zeros((2, image_dim), np.float32), np.zeros((2, text_dim), np.float32), source="import"
    )
    return HashDataset(train=split, query=split, retrieval=split)


def write_hashing_run(plan: ImportPlan, source: Path, out: Path) -> dict[str, Any]:
    """Build the planned ``UCMFH``, load the mapped tensors strictly, write the hashing run directory ``out``
    atomically; returns the import record (the fields :func:`~patchword.imports.base.write_imported_run`
    records).

    Raises:
        RunExistsError: ``out`` exists.
        DataError: a tensor missing, unexpected or of another shape (after overrides), naming it.
        ConfigError: synthetic data of other widths than the checkpoint's heads read.
    """
    from patchword.checkpoint import atomic_save, export_weights
    from patchword.config import save_config
    from patchword.fileio import atomic_write_text
    from patchword.hashing.build import build_hashing_model
    from patchword.hashing.config import check_hash_config
    from patchword.hashing.runstate import IMPORTED_DATA_HINT
    from patchword.hashing.trainer import HashTrainer

    out = out.absolute()  # checked by import_checkpoint first, and by new_directory before writing
    cfg = replace(plan.config, output_dir=str(out.parent), name=out.name)
    check_hash_config(cfg)
    dims = (plan.metadata["image_dim"], plan.metadata["text_dim"])
    data = cfg.data
    if data.format == "synthetic" and (data.synthetic_image_dim, data.synthetic_text_dim) != dims:
        raise ConfigError(
            "data.synthetic_image_dim",
            f"the checkpoint's heads read {dims[0]}-d image and {dims[1]}-d text features, the synthetic "
            f"data would be {data.synthetic_image_dim}-d and {data.synthetic_text_dim}-d",
        )
    try:
        model = build_hashing_model(cfg.model, *dims)
    except ValueError as err:  # e.g. an overridden nhead that does not divide the width
        raise ConfigError("model", str(err)) from None
    check_fit(plan, model.state_dict(), source)
    model.load_state_dict(plan.state_dict, strict=True)
    record = import_record(plan, source)
    with new_directory(out) as tmp:
        save_config(cfg, tmp / CONFIG_FILE)
        # last.pt as HashTrainer saves it (model, fresh optimiser, epoch 0): load_hashing_run reads it, and
        # `patchword hash train --resume` fine-tunes the imported weights on the data the import was given
        # (an import without data is refused: its stand-in is no data to train on).
        trainer = HashTrainer(cfg, model, _placeholder_data(*dims), tmp)
        atomic_save(trainer.state_dict(), tmp / LAST_CHECKPOINT)
        export_weights(model, asdict(cfg), tmp, imported_from=str(source))
        atomic_write_text(tmp / IMPORT_FILE, json.dumps(record, indent=2, default=str))
    _logger.info("%s: UCMFH hashing run written to %s", source, out)
    if cfg.data.format == "synthetic":  # no data overrides: hash eval refuses the stand-in without them
        _logger.info(
            "%s holds no features: evaluate it with `patchword hash eval %s` and %s",
            source,
            out,
            IMPORTED_DATA_HINT,
        )
    return record


register_family(
    FAMILY,
    "UCMFH hashing (checkpoints/hash/<dataset>_hash_<bits>.pth: FusionTransformer, ImageMlp, TextMlp)",
    detect,
    convert,
    writer=write_hashing_run,
    reads=(),  # it reads CLIP features: no backbone, vocabulary or dense text to name
)
