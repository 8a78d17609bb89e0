"""``patchword pretrain``: contrastive pretraining of the tiny encoders on the synthetic scenes.

SEPS fine-tunes *pretrained* backbones (ViT / Swin + BERT). The demo does the same in miniature: the tiny
image and text encoders are first trained CLIP-style (symmetric InfoNCE over the global embeddings with a
learned temperature, :class:`~patchword.losses.ContrastiveLoss` with the ``clip`` matcher) on the synthetic
train split, and the result is shipped in ``src/patchword/pretrained/synthetic-64`` for
``model.tiny_pretrained``. This module is the recipe and the export; the training itself is an ordinary
run (``runs/<name>``: resumable, validated on dev, evaluated on test).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from patchword.config import apply_overrides
from patchword.readers import read_json
from patchword.runs.config import RunConfig, load_run_config
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE, VOCAB_FILE

__all__ = [
    "PRETRAIN_RECIPE",
    "check_encoders_dir",
    "pretrain_config",
    "run_pretrain",
    "global_recall",
    "pretrained_recipe",
    "pretraining_recall",
]

KEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"]

_logger = logging.getLogger(__name__)

#: The recipe that produced ``src/patchword/pretrained/synthetic-64``:
#: ``patchword/configs/pretrain-synthetic-64.yaml`` (what it trains, and why, is written there).
PRETRAIN_RECIPE = "pretrain-synthetic-64"


def pretrain_config(overrides: list[str] | None = None, config: str | None = None) -> RunConfig:
    """The pretraining run: defaults + the recipe ``config`` (default :data:`PRETRAIN_RECIPE`) + overrides."""
    return load_run_config(config or PRETRAIN_RECIPE, overrides)


def global_recall(cfg: RunConfig, data) -> dict[str, float]:
    """Test recall of the global embeddings (CLS vs mean of the words) of the encoders ``cfg`` builds,
    with no training: for ``model.tiny_pretrained`` set, the pretrained encoders as shipped."""
    from patchword.eval.protocol import evaluate
    from patchword.model import build_model

    # on the CPU in float32: the run's eval.precision (tf32) is its own matcher's, on its device
    vse = apply_overrides(cfg, ["model.matcher=vse", "eval.precision=fp32"])
    model = build_model(vse.model, vocab_size=data.vocab_size)
    metrics = evaluate(model, data.splits["test"], vse.eval, progress=False)
    return {k: metrics[k] for k in KEYS}


def pretrained_recipe(name_or_path: str) -> RunConfig | None:
    """The run config that trained a pretrained-encoders directory (its ``config.json`` ``recipe``: a
    recipe name with overrides, or, in directories written before recipes had names, a list of overrides
    on the defaults); None where none is recorded."""
    from patchword.pretrained import CONFIG, resolve_pretrained_dir

    recipe = json.loads((resolve_pretrained_dir(name_or_path) / CONFIG).read_text()).get("recipe")
    if isinstance(recipe, list):
        return load_run_config(None, recipe)
    if isinstance(recipe, dict):
        return load_run_config(recipe.get("config"), recipe.get("overrides", []))
    return None


def pretraining_recall(cfg: RunConfig, data) -> dict[str, Any] | None:
    """Test recall of the pretrained encoders ``model.tiny_pretrained`` under the score they were pretrained
    with, when that is not the global cosine (e.g. FILIP's token-wise late interaction), with no training:
    ``{"matcher": name, **recall}``; None for global pretraining or no pretrained encoders."""
    import dataclasses

    from patchword.eval.protocol import evaluate
    from patchword.matching import matcher_spec
    from patchword.model import build_model

    if not cfg.model.tiny_pretrained:
        return None
    recipe = pretrained_recipe(cfg.model.tiny_pretrained)
    if recipe is None:
        return None
    trained = recipe.model
    if not matcher_spec(trained.matcher).cls.token_level:  # global pretraining: the cosine is all there is
        return None
    section = matcher_spec(trained.matcher).section
    options = getattr(trained, section, None)
    overrides = [f"model.matcher={trained.matcher}", "eval.precision=fp32"]  # scored on the CPU
    if dataclasses.is_dataclass(options):
        overrides += [
            f"model.{section}.{f.name}={getattr(options, f.name)!r}" for f in dataclasses.fields(options)
        ]
    native = apply_overrides(cfg, overrides)
    model = build_model(native.model, vocab_size=data.vocab_size)
    metrics = evaluate(model, data.splits["test"], native.eval, progress=False)
    return {"matcher": trained.matcher, **{k: metrics[k] for k in KEYS}}


def check_encoders_dir(out: Path, force: bool) -> None:
    """``--out`` before any work: a directory (or one that can be created) where files can be written, empty
    unless ``force``. Errors name ``--out``; a read-only place is the ``OSError`` naming it."""
    from patchword.errors import ConfigError, RunExistsError
    from patchword.fileio import probe_writable

    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file: --out names the directory for the encoders")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise RunExistsError(f"{out} exists and is not empty; pass --force to replace the encoders in it")
    try:
        probe_writable(out)
    except NotADirectoryError as err:  # a file where one of its parent directories must go
        raise ConfigError("--out", f"{err.filename} is a file: {out} cannot be created under it") from None


def run_pretrain(
    overrides: list[str] | None = None, *, out: Path, force: bool = False, config: str | None = None
) -> dict[str, Any]:
    """Train (or continue an interrupted run, or take a finished one) and export the encoders.

    Writes ``out/model.safetensors`` (the encoders of the best dev checkpoint, float16), ``vocab.json`` and
    ``config.json`` (architecture, recipe, seed, machine, time and the global test metrics).
    """
    from patchword.bench.machine import machine_description
    from patchword.config import config_diff
    from patchword.data.prepare import prepare_data
    from patchword.errors import ConfigError
    from patchword.pretrained import save_pretrained_encoders
    from patchword.runs import load_run, read_run_config
    from patchword.train.runner import resume_run, train_run
    from patchword.train.validate import RESUMABLE_KEYS

    check_encoders_dir(out, force)
    cfg = pretrain_config(overrides, config)
    run_dir = Path(cfg.output_dir) / cfg.name
    if (run_dir / CONFIG_FILE).is_file():  # an existing run is only taken if it is this recipe
        changed = [k for k in config_diff(read_run_config(run_dir), cfg) if k not in RESUMABLE_KEYS]
        if changed:
            raise ConfigError(changed[0], f"{run_dir} was trained with another value: choose another name=")
    if (run_dir / SUMMARY_FILE).is_file():  # trained already: export again (e.g. to another --out)
        _logger.info("%s is finished: exporting its encoders", run_dir)
        summary = read_json(run_dir / SUMMARY_FILE, "run summary")
    elif (run_dir / LAST_CHECKPOINT).is_file():  # interrupted: continue it with its own config
        summary = resume_run(run_dir)
    else:
        summary = train_run(cfg)
    run = load_run(run_dir)
    meta = {
        "recipe": {"config": config or PRETRAIN_RECIPE, "overrides": list(overrides or [])},
        "seed": cfg.seed,
        "run": str(run_dir),
        "best_dev_rsum": summary.get("best_dev_rsum"),
        "oracle_rsum": summary.get("oracle_rsum"),
        "steps": summary.get("steps"),
        "train_seconds": round(summary["train_seconds"], 1),
        "machine": machine_description(),
    }
    save_pretrained_encoders(run.model, cfg.model, run_dir / VOCAB_FILE, out, meta)
    # The recorded recall is that of the weights as shipped (stored in float16): what a user loads.
    shipped = apply_overrides(cfg, [f"model.tiny_pretrained={out}", f"data.vocab_path={out}"])
    meta["test_global"] = global_recall(shipped, prepare_data(shipped.data, roles=["test"]))
    save_pretrained_encoders(run.model, cfg.model, run_dir / VOCAB_FILE, out, meta)
    _logger.info("pretrained encoders written to %s", out)
    print(json.dumps(meta, indent=2))
    return meta
