"""``patchword eval RUN``: score a trained run on one split and write a metrics JSON that says how.

Only the split being scored is read and tokenised (with the run's own saved vocabulary); ``--out`` is
checked before anything else, so a finished evaluation is never lost to an existing file.

Under ``torchrun --nproc_per_node=N -m patchword eval RUN`` the processes share the encoding and the
scoring (:func:`patchword.eval.protocol.evaluate`); rank 0 writes and prints the metrics.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from patchword.fileio import probe_writable

__all__ = ["add_arguments", "run", "evaluate_run_dir"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="directory written by `patchword train`")
    parser.add_argument("--checkpoint", default=None, help="checkpoint file inside run_dir (default best.pt)")
    parser.add_argument(
        "--out", type=Path, help="where to write the metrics JSON (default run_dir/eval_<split>.json)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    parser.add_argument(
        "--ensemble",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="more run directories (or checkpoint files inside them) whose similarity matrices are averaged "
        "with run_dir's, as SCAN / NAAF report their best numbers",
    )
    parser.add_argument(
        "--suite",
        choices=("compositional", "patches"),
        help="instead of recall: compositional hard negatives (attribute swap, relation swap, object "
        "replaced, count changed) of the run's synthetic test split, or of --suite-file; patches: linear "
        "probes and patch-word grounding of the image encoder's patch tokens (synthetic scenes)",
    )
    parser.add_argument(
        "--suite-file",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="SugarCrepe-style files (image file, positive caption, negative caption) for real images",
    )
    parser.add_argument("--image-root", type=Path, help="directory the --suite-file image names are in")
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. eval.split=dev eval.coco_1k=true data.root=..."
    )


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

    cfg = read_run_config(run_dir, list(overrides or []))
    with session(resolve_device(cfg.device), cfg.dist_timeout_s) as dist:
        return _evaluate(run_dir, checkpoint, overrides, ensemble, out, force, dist)


def _evaluate(run_dir, checkpoint, overrides, ensemble, out, force, dist) -> tuple[dict[str, Any], Path]:
    from patchword import __version__
    from patchword.data.prepare import eval_role, prepare_data
    from patchword.errors import ConfigError, RunExistsError
    from patchword.eval.protocol import ensemble_metrics, evaluate
    from patchword.runs import config_hash, load_run, read_run_config, resolve_checkpoint
    from patchword.train.run import extra_metrics, run_metadata

    overrides = list(overrides or [])
    cfg = read_run_config(run_dir, overrides)
    role = eval_role(cfg.data, cfg.eval.split)
    members = [(run_dir, checkpoint)] + [_member(p) for p in ensemble or []]
    # Everything cheap first: the output file, every member's config and checkpoint.
    out = out or run_dir / (f"eval_{role}_ensemble.json" if len(members) > 1 else f"eval_{role}.json")
    if out.exists() and not force:
        raise RunExistsError(f"{out} exists; pass --force to overwrite it or --out for another file")
    if not out.parent.is_dir():
        raise ConfigError("--out", f"directory {out.parent} does not exist")
    probe_writable(out.parent)  # a read-only directory fails now, not after the evaluation
    for member_dir, member_ckpt in members:
        read_run_config(member_dir, overrides)
        resolve_checkpoint(member_dir, member_ckpt)
    device = dist.device

    prepared: dict[str, Any] = {}  # identical data configs and tokenizers are tokenised once
    results, reference = [], None
    t0 = time.perf_counter()
    for member_dir, member_ckpt in members:
        loaded = load_run(member_dir, member_ckpt, device=device, overrides=overrides)
        mcfg, model = loaded.config, loaded.model
        use_dense = mcfg.data.dense and model.matcher.consumes_dense
        key = json.dumps([vars(mcfg.data), str(member_dir / "vocab.json"), use_dense], default=str)
        if key not in prepared:
            prepared[key] = prepare_data(
                mcfg.data,
                loaded.tokenizer,
                roles=[role],
                use_dense=use_dense,
                local_files_only=mcfg.model.hf_local_files_only,
            )
        data = prepared[key]
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
            return_sims=len(members) > 1 or mcfg.eval.coco_extended,
            dist=dist,
        )
        meta = {
            "run_dir": str(member_dir),
            "checkpoint": str(loaded.checkpoint),
            "config_hash": config_hash(member_dir),
            **run_metadata(mcfg, model, role),
        }
        results.append((meta, metrics))
    mcfg, data, split, model = reference
    if not dist.is_main:  # rank 0 holds the score matrices and writes the file
        return results[0][1], out
    raw = data.raw[role]
    if len(members) > 1:
        scores = [m.pop("sims") for _, m in results]
        metrics = ensemble_metrics(scores, split.txt2img, mcfg.eval)
        metrics["ensemble"] = [{**meta, **m} for meta, m in results]
        metrics.update({k: v for k, v in results[0][0].items() if k in ("split", "leaky")})
        metrics["leaky"] = any(meta["leaky"] for meta, _ in results)
        if mcfg.eval.coco_extended:
            from patchword.eval.protocol import average_scores

            metrics.update(extra_metrics(mcfg, model, split, raw, average_scores(scores), device))
    else:
        meta, metrics = results[0]
        metrics.update(meta)
        metrics.update(extra_metrics(mcfg, model, split, raw, metrics.pop("sims", None), device))
    if role in data.oracle:
        metrics["oracle_rsum"] = data.oracle[role]["rsum"]
    metrics.update(
        eval_seconds=time.perf_counter() - t0,
        world_size=dist.world_size,
        patchword_version=__version__,
        time=time.strftime("%Y-%m-%dT%H:%M:%S"),
        overrides=overrides,
    )
    _write_json(out, metrics)
    return metrics, out


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    from patchword.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=2))


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
    from patchword.device import resolve_device
    from patchword.distributed import launch_info
    from patchword.errors import ConfigError, RunExistsError
    from patchword.eval.compositional import (
        FileImageSource,
        compositional_accuracy,
        read_sugarcrepe,
        synthetic_suite,
    )
    from patchword.runs import config_hash, load_run, read_run_config, resolve_checkpoint

    if launch_info().world_size > 1:
        raise ConfigError("--suite", "runs in one process: start it without torchrun")
    overrides = list(overrides or [])
    cfg = read_run_config(run_dir, overrides)
    out = out or run_dir / "eval_compositional.json"
    if out.exists() and not force:
        raise RunExistsError(f"{out} exists; pass --force to overwrite it or --out for another file")
    probe_writable(out.parent)
    if not suite_files and cfg.data.dataset != "synthetic":
        raise ConfigError("--suite-file", "a run on real data needs SugarCrepe-style files (--suite-file)")
    resolve_checkpoint(run_dir, checkpoint)
    loaded = load_run(run_dir, checkpoint, device=resolve_device(cfg.device), overrides=overrides)
    dc = loaded.config.data
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
        max_memory_mb=loaded.config.eval.max_memory_mb,
        progress=loaded.config.progress,
    )
    result.update(
        suite="compositional",
        source=source,
        checkpoint=str(loaded.checkpoint),
        config_hash=config_hash(run_dir),
        matcher=loaded.config.model.matcher,
        eval_seconds=time.perf_counter() - t0,
    )
    _write_json(out, result)
    return result, out


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
    from patchword.device import resolve_device
    from patchword.errors import ConfigError, RunExistsError
    from patchword.eval.patch_probe import synthetic_patch_probe
    from patchword.runs import config_hash, load_run, read_run_config, resolve_checkpoint

    overrides = list(overrides or [])
    cfg = read_run_config(run_dir, overrides)
    out = out or run_dir / "eval_patches.json"
    if out.exists() and not force:
        raise RunExistsError(f"{out} exists; pass --force to overwrite it or --out for another file")
    probe_writable(out.parent)
    if cfg.data.dataset != "synthetic" or cfg.model.image_encoder != "tiny":
        raise ConfigError("--suite", "patches probes the tiny image encoder of a run on the synthetic scenes")
    resolve_checkpoint(run_dir, checkpoint)
    loaded = load_run(run_dir, checkpoint, device=resolve_device(cfg.device), overrides=overrides)
    dc = loaded.config.data
    t0 = time.perf_counter()
    result = synthetic_patch_probe(
        loaded.model,
        dc.synthetic_config(),
        loaded.tokenizer,
        cache_dir=dc.cache_dir or None,
        device=loaded.device,
    )
    result.update(
        suite="patches",
        scenes=dc.synthetic_scenes,
        checkpoint=str(loaded.checkpoint),
        config_hash=config_hash(run_dir),
        eval_seconds=time.perf_counter() - t0,
    )
    _write_json(out, result)
    return result, out


def run(args: argparse.Namespace) -> None:
    from patchword.distributed import launch_info

    if args.suite == "patches":
        from patchword.eval.patch_probe import format_probe_table

        result, out = evaluate_patch_suite(
            args.run_dir, args.checkpoint, overrides=args.overrides, out=args.out, force=args.force
        )
        print(format_probe_table(result))
        print(f"written: {out}")
        return
    if args.suite or args.suite_file:
        from patchword.eval.compositional import format_compositional_table

        result, out = evaluate_suite(
            args.run_dir,
            args.checkpoint,
            suite_files=args.suite_file,
            image_root=args.image_root,
            overrides=args.overrides,
            out=args.out,
            force=args.force,
        )
        print(format_compositional_table(result))
        print(f"written: {out}")
        return

    main = launch_info().rank == 0
    if not main:
        logging.getLogger().setLevel(logging.WARNING)  # one process reports
    metrics, out = evaluate_run_dir(
        args.run_dir,
        args.checkpoint,
        overrides=args.overrides,
        ensemble=args.ensemble,
        out=args.out,
        force=args.force,
    )
    if main:
        print(json.dumps({k: v for k, v in metrics.items() if k != "ensemble"}, indent=2))
        print(f"written: {out}")
