"""``patchword pretrain``: contrastive pretraining of the tiny encoders on the synthetic scenes.

SEPS fine-tunes *pretrained* backbones (ViT / Swin + BERT). The demo does the same in miniature: the tiny
image and text encoders are first trained CLIP-style (symmetric InfoNCE over the global embeddings with a
learned temperature, :class:`~patchword.losses.ContrastiveLoss` with the ``clip`` matcher) on the synthetic
train split, and the result is shipped in ``src/patchword/pretrained/synthetic-64`` for
``model.tiny_pretrained``. This module is the recipe and the export; the training itself is an ordinary
run (``runs/<name>``: resumable, validated on dev, evaluated on test).

One command at a time writes an ``--out``: it holds an advisory lock on ``.{name}.lock`` beside it from
before it clears what an earlier export left there until its own export is in place, so a second one is
refused before it writes or removes anything. The lock file goes when the command ends (``--out`` may be a
folder of the package, where a file left beside it would be shipped); so taking the lock checks, once held,
that the file locked is still the one at its path, as densify's output lock does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from patchword.config import apply_overrides
from patchword.errors import ResumeHint
from patchword.fileio import check_output_dir
from patchword.readers import read_json
from patchword.runs.config import RunConfig, load_run_config
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE, VOCAB_FILE

__all__ = [
    "PRETRAIN_RECIPE",
    "check_exportable",
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

    meta = read_json(resolve_pretrained_dir(name_or_path) / CONFIG, "pretrained-encoders config")
    recipe = meta.get("recipe")
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


def _refuse_filled_out(out: Path, force: bool) -> None:
    """``--out`` holds files and ``force`` is not given, or holds anything but encoders (``force`` replaces
    the whole folder: a run, a dataset or a user's notes there would be deleted): refused."""
    from patchword.errors import RunExistsError
    from patchword.fileio import only_entries
    from patchword.pretrained import CONFIG, VOCAB, WEIGHTS

    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise RunExistsError(f"{out} exists and is not empty; pass --force to replace the encoders in it")
    if only_entries(out, {WEIGHTS, VOCAB, CONFIG}) is None:
        others = sorted(set(os.listdir(out)) - {WEIGHTS, VOCAB, CONFIG})
        raise RunExistsError(
            f"{out} holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, not only encoders "
            f"({WEIGHTS}, {VOCAB}, {CONFIG}): --force replaces only a folder of encoders; "
            "choose another --out"
        )


def _refuse_out_over_run(out: Path, cfg: RunConfig) -> None:
    """``--out`` is the pretraining run's own directory, a folder holding it (the export, which replaces
    ``--out`` whole, would delete the run it exports) or a folder inside it (its lock file would stop the
    run's start: a run directory holds only what the run writes). Refused before anything is written.

    Raises:
        ConfigError: naming ``--out`` and the run directory.
    """
    from patchword.errors import ConfigError

    run_dir = Path(os.path.realpath(Path(cfg.output_dir) / cfg.name))
    target = Path(os.path.realpath(out))
    where = "is" if target == run_dir else "holds" if target in run_dir.parents else "lies inside"
    if where != "lies inside" or run_dir in target.parents:
        raise ConfigError(
            "--out",
            f"{out} {where} the pretraining run {Path(cfg.output_dir) / cfg.name} (output_dir/name): the "
            "encoders go in a folder of their own, outside it",
        )


def _out_lock_path(out: Path) -> Path:
    """The lock file of ``--out``: ``.{name}.lock`` beside it (inside, it would make ``out`` not empty)."""
    final = Path(os.path.abspath(out))  # ``--out .`` names the folder ``.`` is: its lock is beside it
    return final.parent / f".{final.name}.lock"


@contextlib.contextmanager
def _out_lock(out: Path) -> Iterator[None]:
    """Hold the lock of ``--out`` for the block (the folder it goes in created if missing); remove its file.

    Raises:
        RunExistsError: another ``patchword pretrain`` writes ``out`` now.
    """
    from patchword.locks import removable_lock

    path = _out_lock_path(out)
    busy = (
        f"{out} is being written by another `patchword pretrain` (lock {path} is held): wait for it to end, "
        "or stop it first"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with removable_lock(path, busy):
        yield


def check_exportable(cfg: RunConfig) -> None:
    """What the export needs of the run, checked before it trains (a run that cannot be exported is
    minutes of training for an error): the tiny image and text encoders with nothing after the text
    encoder (what ``model.tiny_pretrained`` loads, :func:`patchword.model.build_model`) and the word
    tokenizer (the run's ``vocab.json`` is shipped beside the weights).

    Raises:
        ConfigError: naming the key that does not fit.
    """
    from patchword.errors import ConfigError

    needs = "the export is tiny encoders (what model.tiny_pretrained loads)"
    for key, value in (("image_encoder", cfg.model.image_encoder), ("text_encoder", cfg.model.text_encoder)):
        if value != "tiny":
            raise ConfigError(f"model.{key}", f"is {value!r}, but pretrain needs 'tiny': {needs}")
    if cfg.model.text_context.layers:
        raise ConfigError(
            "model.text_context.layers",
            f"is {cfg.model.text_context.layers}, but pretrain needs 0: {needs}, with no context layers",
        )
    if cfg.data.tokenizer != "word":
        raise ConfigError(
            "data.tokenizer",
            f"is {cfg.data.tokenizer!r}, but pretrain needs 'word': the run's word vocabulary is shipped "
            "with the encoders",
        )


def _as_override(key: str, value: Any) -> str:
    """``key=value`` as a user types it: a string as written, anything else as JSON (which YAML reads)."""
    return f"{key}={value}" if isinstance(value, str) else f"{key}={json.dumps(value)}"


def _refuse_other_values(finished: RunConfig, cfg: RunConfig, run_dir: Path) -> None:
    """A finished run is exported as it is: a value of the command that differs from the one the run
    trained with (even a resumable one, ``train.max_steps``) would be recorded in the encoders' recipe
    beside weights it did not produce."""
    from patchword.config import config_diff, flat_config
    from patchword.errors import ConfigError
    from patchword.runs.recorded import NEUTRAL_OVERRIDES

    # how the work runs (progress bars, data cache, loader workers) says nothing of the weights
    changed = [key for key in config_diff(finished, cfg) if key not in NEUTRAL_OVERRIDES]
    if changed:
        key = changed[0]
        have, want = flat_config(finished).get(key), flat_config(cfg).get(key)
        raise ConfigError(
            key,
            f"{run_dir} is finished, trained with {have!r}, not {want!r}: its encoders are exported only "
            f"with the values they were trained with (to train it further: `patchword train --resume "
            f"{run_dir} {_as_override(key, want)}`, then this command again; or choose another name=)",
        )


def _resume_overrides(run_dir: Path, cfg: RunConfig) -> list[str]:
    """The overrides that make a resume of the interrupted ``run_dir`` train with ``cfg``: its resumable
    keys whose values differ from the run's ``config.yaml`` (the others are checked equal already), each
    checked to read back as ``cfg``'s value (a string field takes the text as written, other fields YAML).
    """
    from patchword.config import config_diff, flat_config
    from patchword.errors import ConfigError
    from patchword.runs import read_run_config
    from patchword.runs.config import resolve_run_paths

    saved = resolve_run_paths(read_run_config(run_dir))  # an older run's relative paths, as cfg's
    values = flat_config(cfg)
    overrides = []
    for key in config_diff(saved, cfg):
        value = values.get(key)
        spellings = [_as_override(key, value), f"{key}={json.dumps(value, ensure_ascii=False)}"]
        fits = [o for o in spellings if flat_config(apply_overrides(saved, [o])).get(key) == value]
        if not fits:  # the resume would train with another value than the one recorded with the encoders
            raise ConfigError(key, f"{value!r} cannot be passed on to the resume of {run_dir}")
        overrides.append(fits[0])
    return overrides


def _pretrain_hint(run_dir: Path) -> ResumeHint:
    """How an interruption of the pretraining run in ``run_dir`` says to go on
    (:class:`~patchword.errors.ResumeHint`): the same ``patchword pretrain`` command, which resumes the run
    and then exports the encoders (``patchword train --resume``, the runner's own advice, never exports
    them)."""
    rerun = "running the same `patchword pretrain` command again"
    return ResumeHint(rerun, f"continue by {rerun} (it resumes {run_dir} and exports the encoders)")


def _recover_out(out: Path) -> None:
    """Before anything else, what a kill during an earlier export to ``out`` left beside it: the earlier
    encoders renamed aside (put back when ``out`` is missing: the rerun then replaces them again), staging
    folders (deleted)."""
    from patchword.fileio import recover_directory
    from patchword.pretrained import CONFIG, VOCAB, WEIGHTS

    recover_directory(out, required=(WEIGHTS, VOCAB, CONFIG), staged=("export",))


def _export(run, cfg: RunConfig, run_dir: Path, out: Path, meta: dict[str, Any]) -> None:
    """Write the encoders, their vocabulary and ``config.json`` (``meta`` plus the test recall of the
    weights as stored) into a staging folder beside ``out``, then put it in the place of ``out``
    (:func:`~patchword.fileio.replace_directory`): a failure or a kill at any moment leaves the earlier
    encoders or the new ones, whole, never new weights described by the earlier ``config.json``."""
    from patchword.data.prepare import prepare_data
    from patchword.fileio import replace_directory, staging_dir
    from patchword.pretrained import save_pretrained_encoders

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(staging_dir(out, "export"))
    try:
        save_pretrained_encoders(run.model, cfg.model, run_dir / VOCAB_FILE, stage, meta)
        # The recorded recall is that of the weights as shipped (stored in float16): what a user loads.
        shipped = apply_overrides(cfg, [f"model.tiny_pretrained={stage}", f"data.vocab_path={stage}"])
        meta["test_global"] = global_recall(shipped, prepare_data(shipped.data, roles=["test"]))
        save_pretrained_encoders(run.model, cfg.model, run_dir / VOCAB_FILE, stage, meta)
        replace_directory(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def run_pretrain(
    overrides: list[str] | None = None, *, out: Path, force: bool = False, config: str | None = None
) -> dict[str, Any]:
    """Train (or continue an interrupted run, or take a finished one) and export the encoders.

    Writes ``out/model.safetensors`` (the encoders of the best dev checkpoint, float16), ``vocab.json`` and
    ``config.json`` (architecture, recipe, seed, machine, time and the global test metrics). The recipe
    recorded there is the command's, so the run it exports must have trained with the command's values:
    an interrupted run resumes with the command's resumable values (``train.max_steps``...), a finished one
    is refused where any value differs.

    Raises:
        ConfigError: before any work, a run that cannot be exported (:func:`check_exportable`), an existing
            run trained with another value, ``--out`` naming a file, or ``--out`` holding the run
            (``output_dir/name``, or a folder above it).
        RunExistsError: ``--out`` is not empty and ``force`` is not given, holds anything but encoders
            (even with ``force``), or another ``patchword pretrain`` writes it now.
        Interrupted: SIGTERM / SIGINT; the message says to run the same command again.
    """
    # a directory, or one that can be created, where files can be written (nothing is created)
    check_output_dir(out, "--out", what="the directory for the encoders")
    cfg = pretrain_config(overrides, config)
    check_exportable(cfg)
    _refuse_out_over_run(out, cfg)
    # One command at a time on --out: a second one's recovery would delete the first's staging folder.
    with _out_lock(out):
        _recover_out(out)  # a kill between the renames of a --force export left ``out`` aside: back first
        _refuse_filled_out(out, force)
        return _train_and_export(cfg, out, overrides, config)


def _train_and_export(
    cfg: RunConfig, out: Path, overrides: list[str] | None, config: str | None
) -> dict[str, Any]:
    """The work of :func:`run_pretrain` once ``out`` is checked and locked."""
    from patchword.bench.machine import machine_description
    from patchword.config import config_diff
    from patchword.errors import ConfigError
    from patchword.runs.config import resolve_run_paths
    from patchword.runs.load import last_session_config, load_run, read_run_config
    from patchword.train.runner import resume_run, train_run
    from patchword.train.validate import RESUMABLE_KEYS

    run_dir = Path(cfg.output_dir) / cfg.name
    # An existing run is only taken if it is this recipe; one with no checkpoint (a start killed before
    # its first) is nothing to take: train_run starts it again.
    if (run_dir / LAST_CHECKPOINT).is_file() and (run_dir / CONFIG_FILE).is_file():
        saved = resolve_run_paths(read_run_config(run_dir))  # an older run's relative paths, as cfg's
        changed = [k for k in config_diff(saved, cfg) if k not in RESUMABLE_KEYS]
        if changed:
            raise ConfigError(changed[0], f"{run_dir} was trained with another value: choose another name=")
    hint = _pretrain_hint(run_dir)
    if (run_dir / SUMMARY_FILE).is_file():  # trained already: export again (e.g. to another --out)
        _refuse_other_values(resolve_run_paths(last_session_config(run_dir)), cfg, run_dir)
        _logger.info("%s is finished: exporting its encoders", run_dir)
        summary = read_json(run_dir / SUMMARY_FILE, "run summary")
    elif (run_dir / LAST_CHECKPOINT).is_file():  # interrupted: continue it with this command's values
        summary = resume_run(run_dir, _resume_overrides(run_dir, cfg), hint=hint)
    else:
        summary = train_run(cfg, hint=hint)
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
    _export(run, cfg, run_dir, out, meta)
    _logger.info("pretrained encoders written to %s", out)
    print(json.dumps(meta, indent=2))
    return meta
