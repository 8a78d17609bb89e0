"""A UCMFH hashing run directory: train one from a config, or load one back.

A run directory holds ``config.yaml`` (the resolved :class:`HashRunConfig`, what ``--config`` reads back),
``metrics.jsonl`` (one record per epoch, then the final evaluation), ``last.pt`` (atomic, everything to
resume; written every ``train.save_every`` epochs and at the end), ``model.safetensors`` + ``config.json``
(weights-only export) and ``eval.json``. The test split is evaluated once at the end, never used to select
a checkpoint (SPEC decision 4).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from patchword.config import config_diff, load_config, save_config
from patchword.device import resolve_device
from patchword.errors import ConfigError, MissingFileError, RunExistsError
from patchword.fileio import atomic_write_text
from patchword.hashing.build import build_hashing_dataset, build_hashing_model
from patchword.hashing.config import HASH_RESUMABLE_KEYS, HashRunConfig, check_hash_config
from patchword.hashing.dataset import HashDataset
from patchword.hashing.evaluate import evaluate_hashing
from patchword.hashing.model import UCMFH
from patchword.hashing.trainer import HashTrainer, append_metrics
from patchword.train.checkpoint import export_weights, load_checkpoint, seed_everything

__all__ = ["hashing_run_dir", "train_hashing", "load_hashing_run"]

_logger = logging.getLogger(__name__)


def hashing_run_dir(cfg: HashRunConfig) -> Path:
    """``output_dir/name``; the name defaults to data format, bits, loss and seed."""
    name = cfg.name or f"ucmfh_{cfg.data.format}_{cfg.model.bits}b_{cfg.train.loss}_s{cfg.train.seed}"
    return Path(cfg.output_dir) / name


def train_hashing(
    cfg: HashRunConfig, *, resume: bool = False, data: HashDataset | None = None
) -> dict[str, Any]:
    """Build data and model from ``cfg``, train, evaluate once, write the run directory; returns the summary.

    Uses torch's current thread count (``cfg.train.num_threads`` is applied by the CLI, not here).

    Args:
        cfg: the resolved config.
        resume: continue ``run_dir/last.pt``; without it an existing run directory with a checkpoint is
            an error (no silent overwrite).
        data: an already built dataset (benchmarks reuse one); built from ``cfg.data`` when None.

    Raises:
        RunExistsError: the run directory already holds a checkpoint and ``resume`` is False.
        MissingFileError: ``resume`` of a run that does not exist or never saved a checkpoint.
        ConfigError: ``resume`` with settings other than the run's own (except
            :data:`HASH_RESUMABLE_KEYS`); the run's config.yaml is never rewritten.
    """
    device = check_hash_config(cfg)
    run_dir = hashing_run_dir(cfg)
    if resume:
        if not (run_dir / "last.pt").is_file():
            raise MissingFileError(f"{run_dir} has no last.pt to resume (no such run, or it never saved one)")
        saved = load_config(HashRunConfig, run_dir / "config.yaml")
        changed = [k for k in config_diff(saved, cfg) if k not in HASH_RESUMABLE_KEYS]
        if changed:
            raise ConfigError(
                changed[0], f"differs from {run_dir / 'config.yaml'}: a resumed run keeps its own settings"
            )
    elif (run_dir / "last.pt").exists():
        raise RunExistsError(f"{run_dir} already holds a run; pass --resume or choose another name")
    seed_everything(cfg.train.seed)
    data = data if data is not None else build_hashing_dataset(cfg.data)
    if cfg.train.loss == "hashnet" and not data.has_labels:
        _logger.info("hashnet loss without labels: pairs are similar only to themselves (ids)")
    model = build_hashing_model(cfg.model, data.image_dim, data.text_dim)
    trainer = HashTrainer(cfg, model, data, run_dir)
    if not resume:  # everything is checked and built: now the run directory and its config
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
    else:
        trainer.resume(run_dir / "last.pt")
    fit = trainer.fit()
    export_weights(model, asdict(cfg), run_dir, data=data.summary())
    metrics = evaluate_hashing(model, data, cfg.eval, device)
    append_metrics(run_dir, {"split": "test", "epoch": trainer.epoch, "step": trainer.step, **metrics})
    atomic_write_text(run_dir / "eval.json", json.dumps(metrics, indent=2))
    return {"run_dir": str(run_dir), "data": data.summary(), **fit, **metrics}


def load_hashing_run(
    run_dir: str | Path, overrides: list[str] | None = None, device: str | None = None
) -> tuple[HashRunConfig, UCMFH, HashDataset]:
    """Config, trained model (eval mode, on the config's or the given device) and dataset of a run.

    Raises:
        MissingFileError: ``run_dir`` has no ``config.yaml`` or no ``last.pt``.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise MissingFileError(f"{run_dir} is not a hashing run directory (no config.yaml)")
    if not (run_dir / "last.pt").is_file():
        raise MissingFileError(f"{run_dir} has no last.pt: the run never saved a checkpoint")
    cfg = load_config(HashRunConfig, run_dir / "config.yaml", overrides or [])
    cfg = replace(
        cfg, device=str(resolve_device(device or cfg.device, key="--device" if device else "device"))
    )
    data = build_hashing_dataset(cfg.data)
    model = build_hashing_model(cfg.model, data.image_dim, data.text_dim)
    model.load_state_dict(load_checkpoint(run_dir / "last.pt", map_location=cfg.device)["model"])
    return cfg, model.to(cfg.device).eval(), data
