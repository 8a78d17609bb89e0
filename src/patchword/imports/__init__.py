"""Bring your own model: checkpoints saved by the official SEPS / LAPS / SCAN / NAAF / TGDT / UCMFH code
become ordinary patchword run directories (``patchword import CKPT --out RUN``), which ``load_run``,
``patchword eval``, ``index build``, ``search`` and ``serve`` then use unchanged.

:func:`import_checkpoint` reads the checkpoint with the restricted unpickler, recognises its family (or
takes ``family=``), lets the family's importer map its ``opt`` and tensors (:mod:`patchword.imports.base`),
and writes the run directory. The importers register themselves below.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError, DataError
from patchword.fileio import check_output_dir
from patchword.imports.base import (
    IMPORT_FILE,
    IMPORT_FLAGS,
    Family,
    ImportOptions,
    ImportPlan,
    family,
    list_families,
    refuse_existing_out,
    register_family,
    safe_load,
    write_imported_run,
)
from patchword.imports.layout import layout_hint, refuse_unusual_tensors
from patchword.runs.config import RunConfig, not_evaluation_reason

__all__ = [
    "IMPORT_FILE",
    "ImportOptions",
    "ImportPlan",
    "import_checkpoint",
    "list_families",
    "register_family",
    "safe_load",
]

_logger = logging.getLogger(__name__)


def import_checkpoint(
    path: str | Path, out: str | Path, *, family_name: str | None = None, options: ImportOptions | None = None
) -> dict[str, Any]:
    """Import the official checkpoint ``path`` as the run directory ``out``; returns the import record.

    Raises:
        DataError: not a checkpoint of a family patchword reads (or not of ``family_name``), a tensor that
            does not fit, a class outside the unpickling allow-list.
        ConfigError: an ``opt`` value patchword cannot map (naming it), a missing ``--hf-*`` / ``--vocab``,
            ``out`` (or one of its parents) a file or where files cannot be created (naming ``--out``).
        RunExistsError: ``out`` exists.
    """
    path, out, options = Path(path), Path(out), options or ImportOptions()
    # before the checkpoint is read (gigabytes) and converted: a file in the place of --out or of one of its
    # parents, a read-only or vanished location
    check_output_dir(out, "--out", what="the run directory to write")
    refuse_existing_out(out)
    ckpt = safe_load(path)
    refuse_unusual_tensors(ckpt, path)  # sparse, meta, quantized: before any importer maps them
    matches = [f for f in list_families() if f.detect(ckpt)]
    if family_name is not None:
        chosen = family(family_name)
        if chosen not in matches:
            looks = f" (it looks like {', '.join(f.name for f in matches)})" if matches else ""
            # what the family looked for, then what the layout says (a bare state_dict, 'module.' names)
            why = [chosen.explain(ckpt) if chosen.explain else "", "" if matches else layout_hint(ckpt)]
            why = "; ".join(filter(None, why))
            raise DataError(f"{path} is not a {family_name} checkpoint{looks}{': ' + why if why else ''}")
    elif not matches:
        known = ", ".join(f.name for f in list_families())
        hint = layout_hint(ckpt)
        raise DataError(
            f"{path}: not a checkpoint of a family patchword imports ({known}){': ' + hint if hint else ''}"
        )
    elif len(matches) > 1:  # e.g. SEPS and LAPS share their arguments and parameters
        names = " or ".join(f.name for f in matches)
        raise DataError(f"{path} could be a {names} checkpoint: say which with --family")
    else:
        chosen = matches[0]
    for flag, spelled in IMPORT_FLAGS.items():
        if getattr(options, flag) is not None and flag not in chosen.reads:
            raise ConfigError(spelled, f"a {chosen.name} checkpoint does not use it; leave it out")
    plan = chosen.convert(ckpt, options, path)
    if options.overrides:
        plan.config = _checked_overrides(plan.config, list(options.overrides), chosen)
        plan.overrides = list(options.overrides)
    if isinstance(plan.config, RunConfig):  # a hashing run's writer runs check_hash_config itself
        check_run_values(plan.config)
        # its data paths absolute, as a trained run's: it evaluates from any directory (the BERT vocabulary
        # stays the file the import copies into the run directory, read relative to it)
        plan.config = replace(plan.config, data=plan.config.data.absolute_file_paths())
    if plan.overrides:
        _logger.info(
            "%s: overrides applied on import (recorded in %s): %s", path, IMPORT_FILE, plan.overrides
        )
    _logger.info("%s: %s checkpoint; its opt: %s", path, chosen.name, plan.opt)
    for key, reason in plan.ignored.items():
        _logger.info("not loaded: %s (%s)", key, reason)
    writer = chosen.writer or write_imported_run
    return writer(plan, path, out)


#: model keys an import may override: how the model is loaded, not what it computes
_LOADING_KEYS = {"model.hf_local_files_only"}


def _checked_overrides(config, overrides: list[str], chosen: Family):
    """``config`` with ``overrides`` applied. An override that changes a value the checkpoint set is refused
    naming the key: a ``model.*`` value (architecture, scoring) or one of the keys the family declares its
    checkpoints decide (``Family.determines``: tokenizer, text length, image size, dense text...). An
    imported model is what its checkpoint says, fed as it was trained; where the data lies and how it is
    evaluated (``data.root``, ``eval.*``) are the user's. In a retrieval run, a key no evaluation reads
    (``train.*``, ``seed``, ``data.vocab_path``...: :func:`_refuse_unread_keys`) is refused whatever its
    value."""
    from patchword.config import apply_overrides, flat_config

    before = flat_config(config)
    after_config = apply_overrides(config, overrides)
    after = flat_config(after_config)
    for key, value in after.items():
        decided = (key.startswith("model.") and key not in _LOADING_KEYS) or key in chosen.determines
        if decided and value != before.get(key):
            raise ConfigError(
                key,
                f"{value!r} contradicts the {chosen.name} checkpoint, which implies {before.get(key)!r}: an "
                "imported model computes what its checkpoint says, on the input it was trained with; "
                "override where the data lies (data.root, ...) and eval.* keys only",
            )
    changed = [key for key, value in after.items() if value != before.get(key)]
    if isinstance(config, RunConfig):  # a retrieval run: `patchword eval` reads it as it reads any run
        _refuse_unread_keys(overrides, changed, after)
        _refuse_unread_data(config, after_config, changed, chosen)
    else:  # a hashing run: `patchword hash eval` reads it as it reads any trained run
        _refuse_hash_train_keys(overrides, changed)
    return after_config


def _refuse_unread_keys(overrides: list[str], changed: list[str], after: dict[str, Any]) -> None:
    """A key no evaluation of the imported run reads (:data:`patchword.runs.config.NOT_EVALUATION_KEYS`,
    which ``patchword eval`` refuses too: ``train.*``, ``seed``, ``data.vocab_path``, ``data.word_split``...)
    is refused: stored in ``config.yaml`` and listed as applied, it would say the run tokenises, was seeded
    or is named as it is not. ``changed``: the dotted keys whose value the overrides changed (a key set
    inside a section's mapping, ``data={word_split: unicode}``, is one of them); ``after``: every dotted
    key's value with the overrides (``precision=amp_bf16`` is refused by its value).

    Raises:
        ConfigError: naming the first such key.
    """
    named = [item.split("=", 1)[0].strip() for item in overrides if "=" in item]
    for key in [*named, *changed]:
        why = not_evaluation_reason(key, after.get(key))
        if why is not None:
            raise ConfigError(
                key,
                f"an imported run never reads it (`patchword eval` refuses it too: {why}); override "
                "where the data lies (data.root, ...) and eval.* keys only",
            )


def _refuse_unread_data(before: RunConfig, after: RunConfig, changed: list[str], chosen: Family) -> None:
    """A ``data.*`` override no evaluation of the imported run would read, or one every evaluation would
    refuse, refused now as ``patchword eval`` refuses it (``data.num_train=5`` on LAPS files,
    ``data.region_boxes=true`` on images, ``data.image_root`` on region features): stored in config.yaml
    and listed as applied, it would say the run was evaluated on data it never reads.

    * ``data.dataset``: region features for a model that reads images (or the reverse) are refused, as
      training refuses them; and every key the import set for the checkpoint's dataset that the new one
      never reads (``data.root`` of LAPS files on the synthetic scenes) is named, so the run's config.yaml
      never records a dataset it cannot be evaluated on;
    * ``data.dense_*`` where the checkpoint reads no dense text (``data.dense=false``, decided by it):
      nothing would read the file;
    * the rest: :meth:`~patchword.data.config.DataConfig.refuse_unread_overrides` and
      :func:`~patchword.runs.checks.check_region_boxes`, the config checks ``patchword eval`` makes, and
      every file the evaluation split needs named (:func:`~patchword.data.prepare.check_needed_keys`).

    Raises:
        ConfigError: naming the first such key.
    """
    from patchword.data.prepare import REGION_DATASETS
    from patchword.runs.checks import check_region_boxes

    dc = after.data
    dataset_changed = "data.dataset" in changed
    if dataset_changed and (dc.dataset in REGION_DATASETS) != (after.model.image_encoder == "precomp"):
        holds, reads, how = (
            ("region features", "images", "")
            if dc.dataset in REGION_DATASETS
            else ("images", "region features", " (model.image_encoder=precomp)")
        )
        raise ConfigError(
            "data.dataset",
            f"{dc.dataset} holds {holds}, but the {chosen.name} checkpoint's model reads {reads}{how}: "
            f"evaluate it on data.dataset={before.data.dataset} (or another dataset of {reads})",
        )
    if not dc.dense:
        for role in ("train", "dev", "test"):
            if f"data.dense_{role}" in changed and getattr(dc, f"dense_{role}"):
                raise ConfigError(
                    f"data.dense_{role}",
                    f"the {chosen.name} checkpoint reads no dense text (data.dense=false): no evaluation "
                    "would read the file; leave it out",
                )
    try:
        if dataset_changed:  # every key set for the checkpoint's dataset, not only the overridden ones
            dc.refuse_unread_settings()
        else:
            dc.refuse_unread_overrides(before.data)
        check_region_boxes(after)
    except ConfigError as err:
        if not dataset_changed or err.key in changed:  # a key the overrides set: its message says it
            raise
        raise ConfigError(
            err.key, f"{err.detail} (the import sets it for data.dataset={before.data.dataset})"
        ) from None
    # the files the evaluation split needs are named (eval.split=dev on the SEPS release, which has no
    # dev-split dense captions, was written and failed at every evaluation)
    from patchword.data.prepare import check_needed_keys, eval_role, reads_dense_text
    from patchword.model import model_reads_dense

    role = eval_role(dc, after.eval.split)
    check_needed_keys(dc, [role], reads_dense_text(dc, model_reads_dense(after.model)))


def _refuse_hash_train_keys(overrides: list[str], changed: list[str]) -> None:
    """A hashing import (UCMFH) takes the keys ``patchword hash eval`` takes on a trained run
    (:data:`patchword.hashing.config.HASH_EVAL_KEYS`: ``data.*``, ``eval.*``, ``device``); another one
    (``train.*`` with its seed, ``name``, ``output_dir``) would be stored in ``config.yaml`` and listed as
    applied while no evaluation reads it (``name`` and ``output_dir`` are ``--out``'s).

    Raises:
        ConfigError: naming the first such key.
    """
    from patchword.hashing.config import HASH_EVAL_KEYS

    named = [item.split("=", 1)[0].strip() for item in overrides if "=" in item]
    for key in [*named, *changed]:
        if key not in HASH_EVAL_KEYS and not any(k.startswith(key + ".") for k in HASH_EVAL_KEYS):
            why = "--out places the run" if key in ("name", "output_dir") else "it changes training"
            raise ConfigError(
                key,
                f"an imported hashing run never reads it (`patchword hash eval` refuses it too: {why}); "
                "override data.*, eval.* or device only",
            )


def check_run_values(cfg: RunConfig) -> None:
    """The values of an imported retrieval run's config that ``patchword eval`` (and ``train``'s
    :func:`~patchword.train.validate.check_config`) would refuse, refused on import before anything is
    written (``eval.batch_size=0`` was stored and every later evaluation of the run failed): no NaN,
    ``eval.split`` a split of the dataset, ``eval.*`` in range, ``eval.precision`` one the matcher's
    engine computes in, ``device`` well formed, ``eval.coco_extended`` not on synthetic data.

    What depends on the machine that evaluates the run is left to it: whether its device exists (``auto``
    and ``cuda`` count as CUDA here, so ``eval.precision=tf32`` is kept), and the COCO ground truth
    ``eval.coco_extended`` reads (an extra). ``check_config`` itself is not run: it checks training keys and
    that ``data.root`` exists, while an import is often made where the data is not.

    Raises:
        ConfigError: naming the first offending key.
    """
    import torch

    from patchword.config import check_common_values
    from patchword.data.prepare import eval_role
    from patchword.device import check_device_spec
    from patchword.runs.checks import check_eval_settings

    check_common_values(cfg)
    eval_role(cfg.data, cfg.eval.split)
    check_device_spec(cfg.device)
    # whether the device exists is the evaluating machine's to say: auto and cuda count as CUDA, mps as
    # the CPU (no precision it refuses), so eval.precision is checked against what the run may meet
    device = torch.device("cpu" if cfg.device in ("cpu", "mps") else "cuda")
    check_eval_settings(cfg, device, load_ground_truth=False)  # the evaluation reads the ground truth


# The built-in importers register themselves.
from patchword.imports import scan_naaf, seps, tgdt, ucmfh  # noqa: E402, F401
