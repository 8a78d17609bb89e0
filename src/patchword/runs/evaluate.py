"""Evaluating a run directory: recall on a split (alone or as an ensemble) and the extra reports (patch
selection, ECCV Caption / CxC); each writes one JSON file. The suites are :mod:`patchword.runs.suites`.

``patchword eval`` parses its arguments and calls :func:`evaluate_run_dir` (or, for a suite,
:mod:`patchword.runs.suites`); training calls :func:`evaluate_run` on its best checkpoint.

Every recall record names the role it scored (``"split"``: ``test`` / ``dev``) and the dataset's split
that role read (``"data_split"``, :func:`data_split`) with what that split is to the run besides a test
set (``"split_use"``: ``"model selection"``, ``"training"`` or None for a held-out split).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from patchword.config import apply_overrides
from patchword.data.prepare import PreparedData, eval_role, reads_dense_text
from patchword.distributed import Distributed
from patchword.eval.engine.memory import configured_budget_mb
from patchword.eval.known_splits import identify_captions
from patchword.eval.protocol import evaluate
from patchword.fileio import atomic_write_text, check_output_file
from patchword.model import RetrievalModel, model_reads_dense, reported_options
from patchword.model.matcher_options import check_matcher_options, split_saved_geometry
from patchword.runs.checks import check_eval_settings
from patchword.runs.config import RunConfig
from patchword.runs.ensemble import (
    in_member,
    member,
    member_overrides,
    refuse_repeated_members,
    shared_metadata,
    shared_split,
    warn_of_scales,
)
from patchword.runs.files import CONFIG_FILE, METRICS_JSON, VOCAB_FILE
from patchword.runs.load import check_backbone_overrides, refuse_run_output
from patchword.runs.recorded import evaluation_identity, evaluation_provenance

__all__ = [
    "model_dtype",
    "run_metadata",
    "data_split",
    "held_out_warning",
    "json_text",
    "extra_metrics",
    "evaluate_run",
    "evaluate_run_dir",
    "check_output",
]

_logger = logging.getLogger(__name__)


def data_split(dc, role: str) -> str:
    """The split of the dataset that ``role`` (``test`` / ``dev``) reads under data config ``dc``, as
    :func:`patchword.imports.published.scored_split` names it: ``dc.test_split`` / ``dc.dev_split``, or for
    the dev role with ``data.dev_from_train`` the images held out of ``dc.train_split``
    (``"train hold-out"``)."""
    if role == "dev" and dc.dev_from_train:
        return f"{dc.train_split} hold-out"
    return getattr(dc, f"{role}_split")


def _split_use(dc, role: str) -> str | None:
    """What the split ``role`` reads is to the run besides a test set
    (:func:`patchword.imports.published.split_use`): ``"model selection"``, ``"training"`` or None."""
    from patchword.imports import published

    return published.split_use({"split": role, "data_split": data_split(dc, role)}, dc)


def held_out_warning(dc) -> str | None:
    """The warning a run whose test role reads a split it is not held out from deserves (its checkpoint is
    chosen on it: ``data.test_split == data.dev_split`` without ``data.dev_from_train``; or it trains on
    it: ``data.test_split == data.train_split``), or None for a held-out test split."""
    use = _split_use(dc, "test")
    if use is None:
        return None
    if use == "training":
        why = f"the split the run trains on (data.train_split={dc.train_split})"
    else:
        why = f"the split the checkpoint is selected on (data.dev_split={dc.dev_split})"
    return (
        f"data.test_split={dc.test_split} is {why}: the test figures of this run are not held-out results "
        '(its records say so: "split_use"); name another split, or validate on training images held out '
        "with data.dev_from_train=N (image-file datasets)"
    )


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (an -inf best rSum of a run never validated, a NaN) None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(record: dict[str, Any]) -> str:
    """``record`` as strict JSON (``-Infinity`` / ``NaN`` are no JSON: other readers refuse them): every
    non-finite number null."""
    return json.dumps(_finite(record), indent=2, allow_nan=False)


def run_metadata(cfg: RunConfig, model: RetrievalModel, role: str, split) -> dict[str, Any]:
    """What a metrics file must say about how it was obtained (``split``: the scored EncodedSplit):
    ``"split"`` the role, ``"data_split"`` the dataset's split it read and ``"split_use"`` what that split
    is to the run besides a test set (None: held out)."""
    matcher, dense = model.matcher, reads_dense_text(cfg.data, model.matcher.consumes_dense)
    return {
        "split": role,
        "data_split": data_split(cfg.data, role),
        "split_use": _split_use(cfg.data, role),
        "images": split.num_images,  # the gallery of caption queries
        "captions": split.num_captions,
        # which published test split the captions are, by their text (None: none of them is a known split's)
        "known_captions": identify_captions(split.captions),
        "matcher": cfg.model.matcher,
        # the options the matcher's registration asks every metrics file to record (SEPS: its variant), as
        # the matcher used them: an option left at its default is recorded as its value, not null
        **reported_options(cfg.model, matcher),
        # None without dense text (data.dense=false, region features, a matcher that reads none): no pairing
        "dense_pairing": matcher.dense_pairing if dense else None,
        "leaky": bool(dense and matcher.leaky),
        "eval_precision": cfg.eval.precision,  # the scoring engine's products ("tf32" is not exact)
        # the weights' dtype, which the encoders computed in (precision=fp64: float64); their tokens reach
        # the scoring engine as float32 whatever it is (eval.scoring), so eval_precision says its products
        "model_dtype": model_dtype(model),
        "params_total": sum(p.numel() for p in model.parameters()),
        # what fine-tuning updates (frozen embeddings excluded), as the model is built from the config
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def model_dtype(model) -> str | None:
    """The dtype of ``model``'s floating-point weights (``float32``; ``float64`` under ``precision=fp64``),
    ``mixed: ...`` where they differ, None for a model without any: what the encoders computed in. Not
    what the scoring did: the encoded tokens are float32 (:mod:`patchword.eval.scoring`), and a matcher
    computing in its inputs' dtype (NAAF) scores in float32 under ``precision=fp64`` too."""
    found = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    return None if not found else found[0] if len(found) == 1 else "mixed: " + ", ".join(found)


#: Why a two-stage search's metrics file has no ``coco_1k_r1_*`` (its ``"coco_extended_note"``).
TWO_STAGE_COCO_1K_NOTE = (
    "coco_1k_r1 left out: a two-stage search's COCO 1K folds each run their own search (coco1k_* with "
    "eval.coco_1k=true); cutting the 5K search's shortlists per fold would be another protocol"
)


def extra_metrics(
    cfg: RunConfig, model: RetrievalModel, split, raw, sims, device, ground_truth=None
) -> dict[str, Any]:
    """What a run reports beside recall: ECCV Caption / CxC on COCO (``eval.coco_extended``, from the
    split's scores ``sims``, with the COCO ``ground_truth`` that ``check_eval_settings`` read: None reads
    it here), and on the synthetic scenes how well patch selection finds the objects.

    ``sims`` of a two-stage search (an ``(i2t, t2i)`` pair) get no ``coco_1k_r1_*``: its 1K folds are
    searched fold by fold (``coco1k_*``), not cut from the 5K shortlists; ``"coco_extended_note"`` says so.
    """
    out: dict[str, Any] = {}
    if cfg.eval.coco_extended:
        from patchword.eval.coco_extended import (
            DEFAULT_COCO_EXTENDED_METRICS,
            coco_extended_metrics,
            coco_extended_percent,
        )

        names = DEFAULT_COCO_EXTENDED_METRICS
        if isinstance(sims, tuple):
            names = tuple(name for name in names if not name.startswith("coco_1k"))
            out["coco_extended_note"] = TWO_STAGE_COCO_1K_NOTE
        ext = coco_extended_metrics(
            sims,
            image_ids=raw.image_ids,
            metrics=names,
            txt2img=split.txt2img,
            ground_truth=ground_truth,
            max_memory_mb=configured_budget_mb(cfg.eval.max_memory_mb, "cpu"),  # ranked on the host
        )
        out.update(coco_extended_percent(ext))
    if cfg.data.dataset == "synthetic":
        from patchword.eval.selection import synthetic_selection_report

        out.update(
            synthetic_selection_report(model, split, cfg.data, raw.name, device=device, progress=False)
        )
    return out


def evaluate_run(
    cfg: RunConfig,
    model: RetrievalModel,
    data: PreparedData,
    run_dir: Path,
    *,
    device=None,
    dist: Distributed | None = None,
    ground_truth=None,
) -> dict[str, Any]:
    """Metrics on ``eval.split`` (plus the oracle bound on synthetic data); writes metrics.json (on rank 0
    of a multi-process launch, whose processes share the evaluation). ``ground_truth``: the COCO ground
    truth the config checks read (``eval.coco_extended``), for :func:`extra_metrics`; None reads it."""
    role = eval_role(cfg.data, cfg.eval.split)
    device = device or torch.device("cpu")
    dist = dist or Distributed(device=device)
    t0 = time.perf_counter()
    progress = cfg.progress if dist.is_main else False
    split = data.splits[role]
    metrics = evaluate(
        model.to(device),
        split,
        cfg.eval,
        device=device,
        progress=progress,
        dist=dist,
        return_sims=cfg.eval.coco_extended,
    )
    if dist.is_main:
        sims = metrics.pop("sims", None)
        metrics.update(extra_metrics(cfg, model, split, data.raw[role], sims, device, ground_truth))
    metrics["eval_seconds"] = time.perf_counter() - t0
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    metrics.update(run_metadata(cfg, model, role, split))
    if dist.is_main:
        atomic_write_text(run_dir / METRICS_JSON, json_text(metrics))
    return metrics


def evaluate_run_dir(
    run_dir: Path,
    checkpoint: Path | str | None = None,
    *,
    overrides: list[str] | None = None,
    ensemble: list[Path] | None = None,
    out: Path | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Evaluate a run (or an ensemble of runs) and write the metrics JSON; returns (metrics, out path).

    Every process of a ``torchrun`` launch calls it; they share the work and rank 0 writes the file.
    """
    from patchword.device import resolve_device
    from patchword.distributed import session
    from patchword.runs import read_run_config

    overrides = list(overrides or [])  # None: none (apply_overrides takes a list)
    saved = read_run_config(run_dir)  # parsed once: the overrides apply to copies
    cfg = apply_overrides(saved, overrides)
    with session(resolve_device(cfg.device), cfg.dist_timeout_s) as dist:
        return _evaluate(run_dir, checkpoint, overrides, ensemble, out, force, dist, saved)


def _evaluate(run_dir, checkpoint, overrides, ensemble, out, force, dist, saved) -> tuple[dict, Path]:
    """:func:`evaluate_run_dir` in its session (``saved``: run_dir's config.yaml, read once)."""
    from patchword.data.prepare import eval_role, prepare_data
    from patchword.errors import ConfigError
    from patchword.eval.protocol import ensemble_metrics, evaluate
    from patchword.runs import load_run, read_run_config, resolve_checkpoint
    from patchword.runs.checks import check_model_data

    cfg = apply_overrides(saved, overrides)
    # a data.* override the run's dataset never reads (the saved config.yaml is not checked: an older
    # version may have recorded such a key, and the run must still evaluate)
    cfg.data.refuse_unread_overrides(saved.data)
    role = eval_role(cfg.data, cfg.eval.split)
    truth = check_eval_settings(cfg, dist.device)  # the COCO ground truth the scoring reads, or None
    reuse = held_out_warning(cfg.data) if role == "test" else None
    if reuse is not None and dist.is_main:  # as training warns of it: its records say so, the log too
        _logger.warning(reuse)
    members = [(run_dir, checkpoint)] + [member(p) for p in ensemble or []]
    ensembled = len(members) > 1
    # Everything cheap first: the output file, each member's config (read, checked once) and checkpoint.
    out = out or run_dir / (f"eval_{role}_ensemble.json" if len(members) > 1 else f"eval_{role}.json")
    member_dirs = [member_dir for member_dir, _ in members]
    check_output(out, force, member_dirs)
    saved_configs, configs, checkpoints = [saved], [cfg], []
    for n, (member_dir, member_ckpt) in enumerate(members):
        with in_member(member_dir, ensembled):  # its key alone does not say which member's config
            if n:
                saved_configs.append(read_run_config(member_dir))
                configs.append(apply_overrides(saved_configs[n], overrides))
                truth = check_eval_settings(configs[n], dist.device, truth)
            check_backbone_overrides(member_dir, overrides)
            checkpoints.append(resolve_checkpoint(member_dir, member_ckpt))
        refuse_run_output(out, member_dirs, reads=[checkpoints[-1]])
    shares = [overrides] * len(members)  # a section only some members read applies to those
    if ensembled:
        shares = member_overrides([c.model for c in configs], overrides)
        members_of = zip(configs, saved_configs, shares, strict=True)
        configs = [c if share == overrides else apply_overrides(r, share) for c, r, share in members_of]
        refuse_repeated_members(checkpoints)
    for (member_dir, _), member_cfg, run_cfg in zip(members, configs, saved_configs, strict=True):
        # the split's files, named by key and file (config.yaml's or an override), before any weights load;
        # the matcher's options first, as the build checks a saved run's (model_reads_dense builds them)
        model_cfg = split_saved_geometry(member_cfg.model)[0]
        with in_member(member_dir, ensembled):
            check_matcher_options(model_cfg, unread_sections=False)
        use_dense = reads_dense_text(member_cfg.data, model_reads_dense(model_cfg))
        source = str(member_dir / CONFIG_FILE)
        member_cfg.data.require_files([role], dense=use_dense, source=source, saved=run_cfg.data)
    device = dist.device

    prepared: dict[str, Any] = {}  # identical data configs and tokenizers are tokenised once
    results, reference = [], None
    t0 = time.perf_counter()
    for (member_dir, member_ckpt), member_cfg, share in zip(members, configs, shares, strict=True):
        with in_member(member_dir, ensembled):
            loaded = load_run(member_dir, member_ckpt, device=device, overrides=share, config=member_cfg)
        mcfg, model = loaded.config, loaded.model
        if ensembled:
            # every member under the ensemble's COCO 1K setting (checked and evaluated so): a two-stage
            # member's folds are its own searches of each fold (return_fold_sims), which the ensemble
            # averages fold by fold
            mcfg = replace(mcfg, eval=replace(mcfg.eval, coco_1k=cfg.eval.coco_1k))
        use_dense = reads_dense_text(mcfg.data, model.matcher.consumes_dense)
        key = json.dumps([vars(mcfg.data), str(member_dir / VOCAB_FILE), use_dense], default=str)
        if key not in prepared:
            prepared[key] = prepare_data(
                mcfg.data,
                loaded.tokenizer,
                roles=[role],
                use_dense=use_dense,
                local_files_only=mcfg.model.hf_local_files_only,
            )
        data = prepared[key]
        check_model_data(mcfg, model, data)
        split = data.splits[role]
        if reference is None:
            reference = (mcfg, data, split, model)
        elif split.captions != reference[2].captions:
            raise ConfigError("--ensemble", f"{member_dir} evaluates another split than {run_dir}")
        metrics = evaluate(
            model,
            split,
            mcfg.eval,
            device=device,
            progress=mcfg.progress if dist.is_main else False,
            return_sims=ensembled or mcfg.eval.coco_extended,
            return_fold_sims=ensembled,
            dist=dist,
        )
        meta = {
            # the checkpoint's step and the digest of its bytes: which weights these numbers belong to,
            # whatever later happens to the file or its date (runs.recorded.evaluation_of); rank 0 writes
            **evaluation_identity(member_dir, loaded.checkpoint, digest=dist.is_main),
            **run_metadata(mcfg, model, role, split),
        }
        results.append((meta, metrics))
    mcfg, data, split, model = reference
    if not dist.is_main:  # rank 0 holds the score matrices and writes the file
        return results[0][1], out
    raw = data.raw[role]
    if ensembled:
        scores = [m.pop("sims") for _, m in results]
        folds = [m.pop("coco1k_sims", None) for _, m in results]
        warn_of_scales(results, scores)
        metrics = ensemble_metrics(scores, split.txt2img, mcfg.eval, fold_members=folds)
        metrics["ensemble"] = [{**meta, **m} for meta, m in results]
        metrics.update(shared_split([meta for meta, _ in results]))  # one split (checked above)
        metrics.update(shared_metadata([meta for meta, _ in results]))
        metrics["leaky"] = any(meta["leaky"] for meta, _ in results)
        if mcfg.eval.coco_extended:
            from patchword.eval.protocol import average_scores

            metrics.update(extra_metrics(mcfg, model, split, raw, average_scores(scores), device, truth))
    else:
        meta, metrics = results[0]
        metrics.update(meta)
        metrics.update(extra_metrics(mcfg, model, split, raw, metrics.pop("sims", None), device, truth))
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    metrics.update(
        eval_seconds=time.perf_counter() - t0, world_size=dist.world_size, **evaluation_provenance(overrides)
    )
    atomic_write_text(out, json_text(metrics))
    return metrics, out


def check_output(out: Path, force: bool, run_dirs: list[Path]) -> Path:
    """Before any work: ``out`` is none of the files of the runs evaluated (``run_dirs``: their
    checkpoints, config.yaml...; :func:`patchword.runs.load.refuse_run_output`), which ``--force`` would
    have replaced with the metrics, and a file to write (:func:`patchword.fileio.check_output_file`); a
    finished evaluation is never lost to an existing file or a read-only directory."""
    refuse_run_output(out, run_dirs)
    check_output_file(out, force)
    return out
