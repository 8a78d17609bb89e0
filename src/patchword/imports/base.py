"""What every importer shares: reading an official checkpoint safely, the plan an importer makes of it,
and writing that plan as an ordinary run directory.

An importer (one module per family: ``seps``, ``scan``, ...) registers two functions:

* ``detect(checkpoint) -> bool``: whether a loaded checkpoint is of its family (by its keys and ``opt``);
* ``convert(checkpoint, options) -> ImportPlan``: the run config the checkpoint's own ``opt`` implies
  (every hyperparameter mapped onto patchword's keys, an unknown ``opt`` value an error naming it), and
  the checkpoint's tensors renamed to patchword's parameter names. Every tensor is either mapped or
  listed in ``ImportPlan.ignored`` with the reason (an optimizer state, a buffer patchword recomputes).

:func:`write_imported_run` then builds the model the config describes (Hugging Face backbones randomly
initialised from the ``--hf-*`` architectures: their weights come from the checkpoint, never from
there), loads the mapped tensors with ``strict=True`` (a missing, unexpected or mis-shaped tensor is one
error naming it), and writes the run directory atomically: ``config.yaml``, the tokenizer,
``backbones.json``, ``best.pt`` / ``last.pt`` (the imported weights; no training step: they trained
elsewhere) and ``import.json`` (source file as an absolute path, its sha256, the family, the dataset the
``opt`` implies, the official ``opt``, what was ignored and why, the user's overrides).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from patchword._validation import finite_flag
from patchword.checkpoint import atomic_save
from patchword.config import config_to_dict, save_config
from patchword.errors import ConfigError, DataError, RunExistsError
from patchword.fileio import atomic_write_text, file_sha256, probe_writable, staging_dir
from patchword.imports.sources import bert_vocab_file, hf_architecture
from patchword.readers import read_checkpoint
from patchword.runs.config import RunConfig
from patchword.runs.files import BERT_VOCAB_FILE, BEST_CHECKPOINT, IMPORT_FILE, LAST_CHECKPOINT

__all__ = [
    "ImportOptions",
    "ImportPlan",
    "Family",
    "register_family",
    "list_families",
    "family",
    "safe_load",
    "opt_dict",
    "check_opt_names",
    "check_finite",
    "bert_vocab_file",
    "hf_architecture",
    "write_imported_run",
    "refuse_existing_out",
    "IMPORT_FILE",
]


#: The only classes an official checkpoint's pickle may name besides tensors and containers: the
#: ``argparse.Namespace`` every official ``train.py`` saves as ``opt``.
SAFE_GLOBALS = [argparse.Namespace]


@dataclass
class ImportOptions:
    """What the user adds to a checkpoint (``patchword import`` arguments)."""

    hf_vision: str | None = None  # Hugging Face vision architecture + image preprocessing (dir or hub id)
    hf_text: str | None = None  # Hugging Face text architecture + tokenizer files (dir or hub id)
    vocab: str | None = None  # word vocabulary file (SCAN / NAAF json or pkl)
    dense_pairing: str | None = None  # SEPS: "image" (leak-free, default) or "caption" (official, leaky)
    overrides: list[str] = field(default_factory=list)  # dotted run-config overrides on top of the mapping

    @property
    def local_files_only(self) -> bool:
        """Whether a ``--hf-*`` hub id is read from the local Hugging Face cache only: the override
        ``model.hf_local_files_only`` (default true), as training reads it; false lets the import download
        a hub id's ``config.json`` (and BERT's ``vocab.txt``) that the cache lacks. An override that does not
        apply is the overrides' check's to name: here it counts as not given."""
        from patchword.config import apply_overrides, override_keys

        given = [item for item in self.overrides if "model.hf_local_files_only" in override_keys([item])]
        if not given:
            return True
        try:
            return bool(apply_overrides(RunConfig(), given).model.hf_local_files_only)
        except ConfigError:
            return True


@dataclass
class ImportPlan:
    """What an importer makes of a checkpoint.

    Attributes:
        family: the importer's name.
        config: the run config the checkpoint's ``opt`` implies (data, model, eval sections).
        state_dict: the checkpoint's tensors under patchword's parameter names.
        ignored: checkpoint key -> why it is not loaded.
        opt: the official ``opt`` as plain values (written to import.json, shown in the log).
        tokenizer: a word vocabulary (``WordVocab``) for word encoders; None for BERT (its files come from
            ``--hf-text`` and are copied into the run directory).
        architectures: ``{"vision"|"text": transformers config dict}`` of the Hugging Face backbones.
        metadata: epoch, best rsum and the like, as the checkpoint records them.
        bert_files: the BERT vocabulary file copied into the run directory.
        overrides: the dotted overrides the user gave on import and that were applied to ``config``.
        dataset: ``f30k`` / ``coco`` as the checkpoint's ``opt`` implies, or None.
        derived: the keys of ``state_dict`` built from something else than a checkpoint tensor (NAAF's
            thresholds from its ``opt``) -> what: import.json counts them apart from the tensors loaded.
    """

    family: str
    config: RunConfig
    state_dict: dict[str, torch.Tensor]
    ignored: dict[str, str] = field(default_factory=dict)
    opt: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    architectures: dict[str, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    bert_files: Path | None = None
    overrides: list[str] = field(default_factory=list)  # the user's accepted overrides (import.json)
    #: the dataset the checkpoint's ``opt`` says it was trained (and evaluated) on: ``f30k`` or ``coco``;
    #: None where the opt names another or none. import.json keeps it, so that a comparison with published
    #: results can tell when the run was evaluated on other data (``data.root`` is the user's to override)
    dataset: str | None = None
    derived: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """A registered importer: ``detect(checkpoint) -> bool``, ``convert(checkpoint, options, path) ->
    ImportPlan`` and, for a family whose runs are not retrieval runs (UCMFH hashing), its own ``writer(plan,
    source, out) -> dict`` instead of :func:`write_imported_run`."""

    name: str
    description: str
    detect: Callable[[dict[str, Any]], bool]
    convert: Callable[[dict[str, Any], ImportOptions, Path], ImportPlan]
    writer: Callable[[ImportPlan, Path, Path], dict[str, Any]] | None = None
    #: the ImportOptions flags (``hf_vision``, ``hf_text``, ``vocab``, ``dense_pairing``) the family reads;
    #: another one given is refused, never silently ignored
    reads: tuple[str, ...] = ("hf_vision", "hf_text", "vocab", "dense_pairing")
    #: the non-``model.*`` config keys the checkpoint decides (what its model is fed: tokenizer, text length,
    #: image size, dense text...); an override changing one is refused like a ``model.*`` one
    determines: tuple[str, ...] = ()
    #: ``explain(checkpoint) -> str``: what ``detect`` looked for and did not find (an entry, a parameter
    #: prefix, an ``opt`` field), for a checkpoint named of this family (``--family``) that is not; None: the
    #: checkpoint's layout alone is described (:func:`layout_hint`)
    explain: Callable[[dict[str, Any]], str] | None = None


#: The import flags a family may declare it reads (``Family.reads``), as the command line spells them.
IMPORT_FLAGS = {
    "hf_vision": "--hf-vision",
    "hf_text": "--hf-text",
    "vocab": "--vocab",
    "dense_pairing": "--dense-pairing",
}

_FAMILIES: dict[str, Family] = {}


def register_family(
    name: str,
    description: str,
    detect: Callable[[dict[str, Any]], bool],
    convert: Callable[[dict[str, Any], ImportOptions, Path], ImportPlan],
    writer: Callable[[ImportPlan, Path, Path], dict[str, Any]] | None = None,
    reads: tuple[str, ...] = tuple(IMPORT_FLAGS),
    determines: tuple[str, ...] = (),
    explain: Callable[[dict[str, Any]], str] | None = None,
) -> None:
    """Register an importer (each family module calls it once, at import); ``reads``: the import flags
    it uses (``IMPORT_FLAGS``); ``determines``: the dotted config keys outside ``model.*`` that its
    checkpoints decide (``Family.determines``); ``explain``: why a checkpoint is not of it
    (``Family.explain``)."""
    if name in _FAMILIES:
        raise ValueError(f"importer {name!r} is already registered")
    unknown = set(reads) - set(IMPORT_FLAGS)
    if unknown:
        raise ValueError(f"importer {name!r} declares unknown import flags {sorted(unknown)}")
    _FAMILIES[name] = Family(
        name, description, detect, convert, writer, tuple(reads), tuple(determines), explain
    )


def list_families() -> list[Family]:
    """The families ``patchword import`` reads, by name."""
    return [_FAMILIES[name] for name in sorted(_FAMILIES)]


def family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ConfigError("--family", f"unknown family {name!r}; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[name]


def safe_load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An official checkpoint, read with torch's restricted unpickler (tensors, containers and the
    ``argparse.Namespace`` of ``opt``; never arbitrary classes).

    Raises:
        MissingFileError: no such file.
        DataError: not a checkpoint (truncated, not a pickle) or a pickle naming a class outside the
            allow-list (the message names it).
    """
    return read_checkpoint(path, what="checkpoint", safe_globals=SAFE_GLOBALS)


def opt_dict(ckpt: dict[str, Any], path: str = "") -> dict[str, Any]:
    """The checkpoint's ``opt`` (an ``argparse.Namespace`` or a dict) as a plain dict."""
    opt = ckpt.get("opt")
    if isinstance(opt, argparse.Namespace):
        return dict(vars(opt))
    if isinstance(opt, dict):
        return dict(opt)
    raise DataError(
        f"{path or 'the checkpoint'} has no 'opt' (the official train.py saves its arguments there)"
    )


def check_opt_names(opt: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Every field of ``opt`` is named by a string, as an ``argparse.Namespace`` names them. An ``opt``
    saved as a dict can hold any key; one that is not a name is no option of any official code, and would
    otherwise fail deep inside a mapping (sorting or hashing mixed keys) instead of as one line naming it.

    Raises:
        DataError: a field named by something else (the message names it and its type).
    """
    for key in opt:
        if not isinstance(key, str):
            raise DataError(
                f"{path}: opt has a field named {key!r} ({type(key).__name__}), not a name: the official "
                "train.py saves its arguments (an argparse.Namespace), whose fields are names"
            )


def check_fit(plan: ImportPlan, expected: dict[str, torch.Tensor], source: Path) -> None:
    """The mapped tensors are exactly the model's (names and shapes) and finite (:func:`check_finite`);
    else one DataError naming them."""
    missing = sorted(set(expected) - set(plan.state_dict))
    unexpected = sorted(set(plan.state_dict) - set(expected))
    if missing or unexpected:
        what = [
            f"missing {missing[:3]}" if missing else "",
            f"unexpected {unexpected[:3]}" if unexpected else "",
        ]
        raise DataError(
            f"{source}: the {plan.family} checkpoint does not fit the model: {'; '.join(filter(None, what))}"
        )
    for key, tensor in plan.state_dict.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise DataError(
                f"{source}: {key} has shape {tuple(tensor.shape)}, the model built from its opt needs "
                f"{tuple(expected[key].shape)}"
            )
    check_finite(plan, source)


def check_finite(plan: ImportPlan, source: Path) -> None:
    """Every floating-point tensor of ``plan.state_dict`` holds finite values: a NaN or infinite weight (a
    diverged or damaged checkpoint) loads without a word and scores NaN for every pair, so every rank
    and metric of the imported run would be meaningless.

    Raises:
        DataError: naming the first such tensor (patchword's name for it) and how many values are bad.
    """
    named = [(tensor, key) for key, tensor in plan.state_dict.items()]
    some_bad = (flag := finite_flag(named)) is not None and not bool(flag)  # the floating ones, one read
    for tensor, key in named:
        if not (tensor.is_complex() or (some_bad and tensor.is_floating_point())):  # complex: not in the flag
            continue
        bad = int((~torch.isfinite(tensor)).sum())
        if bad:
            raise DataError(
                f"{source}: {key} holds {bad} NaN or infinite value(s) of {tensor.numel()}: a diverged or "
                "damaged checkpoint; import one whose weights are finite"
            )


def import_record(plan: ImportPlan, source: Path) -> dict[str, Any]:
    """What ``import.json`` says about an import: source file (its absolute path: a path relative to the
    directory the import ran in names nothing once the run is read from elsewhere) and its sha256, family,
    the dataset its opt implies, opt, ignored keys, the overrides the user applied; ``"loaded"`` counts the
    checkpoint's tensors loaded, ``"derived"`` lists the model's tensors built from elsewhere (its opt)."""
    opt = {
        k: v if isinstance(v, (int, float, str, bool, type(None), list)) else repr(v)
        for k, v in plan.opt.items()
    }
    return {
        "family": plan.family,
        "source": str(Path(source).resolve()),
        "source_sha256": file_sha256(source),
        "dataset": plan.dataset,
        "opt": opt,
        "ignored": plan.ignored,
        "loaded": len(plan.state_dict) - len(plan.derived),
        "derived": plan.derived,
        "metadata": plan.metadata,
        "overrides": list(plan.overrides),
    }


def refuse_existing_out(out: Path) -> None:
    """Raises ``RunExistsError`` when ``out`` exists: an imported run is never overwritten."""
    if out.exists():
        raise RunExistsError(f"{out} exists; choose another --out (an imported run is never overwritten)")


@contextlib.contextmanager
def new_directory(out: Path):
    """Yield a temporary directory beside ``out`` that becomes ``out`` when the block ends without error
    (removed otherwise): a run directory appears whole or not at all.

    Raises:
        RunExistsError: ``out`` exists.
    """
    refuse_existing_out(out)
    probe_writable(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(staging_dir(out, "import"))
    try:
        yield tmp
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_imported_run(plan: ImportPlan, source: Path, out: Path) -> dict[str, Any]:
    """Build the planned model, load the mapped tensors strictly, write the run directory atomically.

    Raises:
        RunExistsError: ``out`` exists.
        DataError: a tensor is missing, unexpected or of another shape (the message names it).
    """
    from patchword.factory import create_model
    from patchword.runs import BACKBONES_FILE, CONFIG_FILE, VOCAB_FILE, pin_hub_revisions

    cfg = plan.config
    vocab_size = len(plan.tokenizer) if plan.tokenizer is not None else None
    words = list(plan.tokenizer.idx2word) if plan.tokenizer is not None else None
    model = create_model(
        cfg.model, vocab_size=vocab_size, vocab_words=words, random_init=plan.architectures, pretrained=False
    )
    check_fit(plan, model.state_dict(), source)
    model.load_state_dict(plan.state_dict, strict=True)
    record = import_record(plan, source)
    with new_directory(out) as tmp:
        save_config(cfg, tmp / CONFIG_FILE)
        if plan.tokenizer is not None:
            plan.tokenizer.save(tmp / VOCAB_FILE)
        if plan.bert_files is not None:
            shutil.copyfile(plan.bert_files, tmp / BERT_VOCAB_FILE)
        if backbones := pin_hub_revisions(plan.architectures):  # a hub id's commit too, as training's
            atomic_write_text(tmp / BACKBONES_FILE, json.dumps(backbones, indent=2))
        weights = {"model": model.state_dict(), "metrics": {}, "config": config_to_dict(cfg)}
        atomic_save(weights, tmp / BEST_CHECKPOINT)
        atomic_save(weights, tmp / LAST_CHECKPOINT)
        atomic_write_text(tmp / IMPORT_FILE, json.dumps(record, indent=2, default=str))
    return record
