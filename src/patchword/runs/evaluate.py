"""Evaluating a run directory: recall on a split (alone or as an ensemble), the extra reports (patch
selection, ECCV Caption / CxC), the compositional and patch suites; each writes one JSON file.

``patchword eval`` parses its arguments and calls :func:`evaluate_run_dir`, :func:`evaluate_suite` or
:func:`evaluate_patch_suite`; training calls :func:`evaluate_run` on its best checkpoint.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from patchword.data.prepare import PreparedData, eval_role
from patchword.distributed import Distributed
from patchword.eval.engine.memory import configured_budget_mb
from patchword.eval.protocol import evaluate
from patchword.fileio import atomic_write_text, check_output_file
from patchword.matching import matcher_spec
from patchword.model import RetrievalModel, matcher_arguments
from patchword.runs.checks import check_eval_settings
from patchword.runs.config import RunConfig
from patchword.runs.files import METRICS_JSON, VOCAB_FILE
from patchword.runs.load import refuse_run_output
from patchword.runs.recorded import evaluation_identity, evaluation_provenance, suite_files_identity

__all__ = [
    "run_metadata",
    "extra_metrics",
    "evaluate_run",
    "evaluate_run_dir",
    "evaluate_suite",
    "evaluate_patch_suite",
]


def run_metadata(cfg: RunConfig, model: RetrievalModel, role: str, split) -> dict[str, Any]:
    """What a metrics file must say about how it was obtained (``split``: the scored EncodedSplit)."""
    matcher = model.matcher
    options = matcher_arguments(cfg.model)
    return {
        "split": role,
        "images": split.num_images,  # the gallery of caption queries
        "captions": split.num_captions,
        "matcher": cfg.model.matcher,
        # the options the matcher's registration asks every metrics file to record (SEPS: its variant)
        **{key: options.get(key) for key in matcher_spec(cfg.model.matcher).report},
        "dense_pairing": matcher.dense_pairing if matcher.consumes_dense else None,
        "leaky": bool(cfg.data.dense and matcher.leaky),
        "eval_precision": cfg.eval.precision,  # the scoring engine's products ("tf32" is not exact)
        "params_total": sum(p.numel() for p in model.parameters()),
        # what fine-tuning updates (frozen embeddings excluded), as the model is built from the config
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


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
) -> dict[str, Any]:
    """Metrics on ``eval.split`` (plus the oracle bound on synthetic data); writes metrics.json (on rank 0
    of a multi-process launch, whose processes share the evaluation)."""
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
        metrics.update(extra_metrics(cfg, model, split, data.raw[role], metrics.pop("sims", None), device))
    metrics["eval_seconds"] = time.perf_counter() - t0
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    metrics.update(run_metadata(cfg, model, role, split))
    if dist.is_main:
        atomic_write_text(run_dir / METRICS_JSON, json.dumps(metrics, indent=2))
    return metrics


def _member(path: Path) -> tuple[Path, Path | None]:
    """``RUN_DIR`` or ``RUN_DIR/ckpt.pt`` -> (run directory, checkpoint or None for best.pt)."""
    return (path.parent, path) if path.is_file() else (path, None)


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

    cfg = read_run_config(run_dir, overrides)
    with session(resolve_device(cfg.device), cfg.dist_timeout_s) as dist:
        return _evaluate(run_dir, checkpoint, overrides, ensemble, out, force, dist, cfg)


def _evaluate(run_dir, checkpoint, overrides, ensemble, out, force, dist, cfg=None) -> tuple[dict, Path]:
    """:func:`evaluate_run_dir` in its session (``cfg``: run_dir's config with the overrides, or None)."""
    from patchword.data.prepare import eval_role, prepare_data
    from patchword.errors import ConfigError
    from patchword.eval.protocol import ensemble_metrics, evaluate
    from patchword.runs import load_run, read_run_config, resolve_checkpoint
    from patchword.runs.checks import check_model_data
    from patchword.runs.load import check_backbone_overrides

    overrides = list(overrides or [])
    cfg = cfg or read_run_config(run_dir, overrides)
    role = eval_role(cfg.data, cfg.eval.split)
    truth = check_eval_settings(cfg, dist.device)  # the COCO ground truth the scoring reads, or None
    members = [(run_dir, checkpoint)] + [_member(p) for p in ensemble or []]
    ensembled = len(members) > 1
    # Everything cheap first: the output file, each member's config (read, checked once) and checkpoint.
    out = out or run_dir / (f"eval_{role}_ensemble.json" if len(members) > 1 else f"eval_{role}.json")
    _check_output(out, force, [member_dir for member_dir, _ in members])
    configs = [cfg]
    for n, (member_dir, member_ckpt) in enumerate(members):
        if n:
            configs.append(read_run_config(member_dir, overrides))
            truth = check_eval_settings(configs[n], dist.device, truth)
        check_backbone_overrides(member_dir, overrides)
        refuse_run_output(out, reads=[resolve_checkpoint(member_dir, member_ckpt)])
    device = dist.device

    prepared: dict[str, Any] = {}  # identical data configs and tokenizers are tokenised once
    results, reference = [], None
    t0 = time.perf_counter()
    for (member_dir, member_ckpt), member_cfg in zip(members, configs, strict=True):
        loaded = load_run(member_dir, member_ckpt, device=device, overrides=overrides, config=member_cfg)
        mcfg, model = loaded.config, loaded.model
        if ensembled:
            # every member under the ensemble's COCO 1K setting (checked and evaluated so): a two-stage
            # member's folds are its own searches of each fold (return_fold_sims), which the ensemble
            # averages fold by fold
            mcfg = replace(mcfg, eval=replace(mcfg.eval, coco_1k=cfg.eval.coco_1k))
        use_dense = mcfg.data.dense and model.matcher.consumes_dense
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
        metrics = ensemble_metrics(scores, split.txt2img, mcfg.eval, fold_members=folds)
        metrics["ensemble"] = [{**meta, **m} for meta, m in results]
        metrics.update({k: v for k, v in results[0][0].items() if k in ("split", "leaky")})
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
    atomic_write_text(out, json.dumps(metrics, indent=2))
    return metrics, out


def _check_output(out: Path, force: bool, run_dirs: list[Path]) -> Path:
    """Before any work: ``out`` is none of the files of the runs evaluated (``run_dirs``: their
    checkpoints, config.yaml...; :func:`patchword.runs.load.refuse_run_output`), which ``--force`` would
    have replaced with the metrics, and a file to write (:func:`patchword.fileio.check_output_file`); a
    finished evaluation is never lost to an existing file or a read-only directory."""
    refuse_run_output(out, run_dirs)
    check_output_file(out, force)
    return out


def _suite_run(suite: str, run_dir: Path, checkpoint, overrides, out: Path | None, force: bool, check, reads):
    """Both suites before scoring: one process; the config (with ``overrides``), the eval settings,
    ``check(cfg)`` (the suite's refusals) and ``out`` (default ``RUN/eval_<suite>.json``) checked; the
    files read (``reads``: suite files or None) refused as ``out``. Returns (loaded run, data config, out)."""
    from patchword.device import resolve_device
    from patchword.distributed import launch_info
    from patchword.errors import ConfigError
    from patchword.runs import load_run, read_run_config, resolve_checkpoint

    if launch_info().world_size > 1:
        raise ConfigError("--suite", "runs in one process: start it without torchrun")
    overrides = list(overrides or [])
    cfg = read_run_config(run_dir, overrides)
    check_eval_settings(cfg, resolve_device(cfg.device))
    out = _check_output(out or run_dir / f"eval_{suite}.json", force, [run_dir])
    check(cfg)
    refuse_run_output(out, reads=[resolve_checkpoint(run_dir, checkpoint), *(reads or [])])
    loaded = load_run(run_dir, checkpoint, device=resolve_device(cfg.device), overrides=overrides, config=cfg)
    return loaded, loaded.config.data, out


def _write_suite(result: dict, loaded, run_dir: Path, overrides: list[str], files, out: Path, t0: float):
    """A suite's record: its figures and the identity a recall record carries (the run, the checkpoint's
    path, step and digest, the config hash, the overrides; :func:`~patchword.runs.recorded.
    suite_evaluation_of` reads them), plus ``suite_files`` (the ``--suite-file`` files read and their
    digests; [] for none), written to ``out``."""
    result.update(
        **evaluation_identity(run_dir, loaded.checkpoint),
        suite_files=suite_files_identity(files),
        eval_seconds=time.perf_counter() - t0,
        **evaluation_provenance(list(overrides or [])),
    )
    atomic_write_text(out, json.dumps(result, indent=2))
    return result, out


def evaluate_suite(
    run_dir: Path,
    checkpoint: Path | str | None = None,
    *,
    suite_files: list[Path] | None = None,
    image_root: Path | None = None,
    overrides: list[str] | None = None,
    out: Path | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], Path]:
    """The compositional suite: every (image, caption, one-fact negative) triple, accuracy per kind
    (the true caption must score strictly higher; chance 50). Writes ``RUN/eval_compositional.json``."""
    from patchword.errors import ConfigError
    from patchword.eval.compositional import (
        FileImageSource,
        compositional_accuracy,
        read_sugarcrepe,
        synthetic_suite,
    )

    def check(cfg: RunConfig) -> None:
        if not suite_files and cfg.data.dataset != "synthetic":
            raise ConfigError("--suite-file", "a run on real data needs SugarCrepe-style files")

    loaded, dc, out = _suite_run(
        "compositional", run_dir, checkpoint, overrides, out, force, check, suite_files
    )
    dense = None
    if suite_files:
        paths, triples = read_sugarcrepe(suite_files, image_root)
        images, source = FileImageSource(paths, loaded.image_transform()), [str(f) for f in suite_files]
    else:
        from patchword.data.synthetic import SyntheticScenes

        scenes = SyntheticScenes.load_or_generate(dc.synthetic_config(), cache_dir=dc.cache_dir or None)
        images, triples, dense = synthetic_suite(scenes, dc.test_split, seed=0)
        source = f"synthetic {dc.test_split} split, seed {dc.synthetic_seed}"
    t0 = time.perf_counter()
    result = compositional_accuracy(
        loaded.model,
        loaded.tokenizer,
        images,
        triples,
        max_caption_len=dc.max_caption_len,
        max_dense_len=dc.max_dense_len,
        dense_captions=dense if dc.dense else None,
        device=loaded.device,
        max_memory_mb=configured_budget_mb(loaded.config.eval.max_memory_mb, loaded.device),
        progress=loaded.config.progress,
    )
    root = str(image_root) if suite_files and image_root else None  # where the suite files' images are
    result.update(suite="compositional", source=source, image_root=root, matcher=loaded.config.model.matcher)
    return _write_suite(result, loaded, run_dir, overrides, suite_files, out, t0)


def evaluate_patch_suite(
    run_dir: Path,
    checkpoint: Path | str | None = None,
    *,
    overrides: list[str] | None = None,
    out: Path | None = None,
    force: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Linear probes and patch-word grounding of the run's image encoder on its synthetic scenes
    (:mod:`patchword.eval.patch_probe`); writes ``RUN/eval_patches.json``."""
    from patchword.errors import ConfigError
    from patchword.eval.patch_probe import synthetic_patch_probe

    def check(cfg: RunConfig) -> None:
        if cfg.data.dataset != "synthetic" or cfg.model.image_encoder != "tiny":
            raise ConfigError("--suite", "patches probes a tiny image encoder on the synthetic scenes")

    loaded, dc, out = _suite_run("patches", run_dir, checkpoint, overrides, out, force, check, None)
    t0 = time.perf_counter()
    result = synthetic_patch_probe(
        loaded.model,
        dc.synthetic_config(),
        loaded.tokenizer,
        cache_dir=dc.cache_dir or None,
        device=loaded.device,
    )
    result.update(suite="patches", scenes=dc.synthetic_scenes)
    return _write_suite(result, loaded, run_dir, overrides, None, out, t0)
