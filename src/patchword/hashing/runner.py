"""A UCMFH hashing run directory: train one from a config, continue one, or load one back.

A run directory holds ``config.yaml`` (the resolved :class:`HashRunConfig`, what ``--config`` reads back;
written once, after everything was checked and built, and never rewritten), ``metrics.jsonl`` (one record
per epoch, then the final evaluation), ``last.pt`` (atomic, everything to resume; written every
``train.save_every`` epochs and at the end), ``model.safetensors`` + ``config.json`` (weights-only export),
``eval.json`` (with the epoch and step of the checkpoint it evaluated), ``.lock`` (held while a command
trains the run) and, once resumed, ``resumes.jsonl`` (one record per resume with its overrides). The test
split is evaluated once at the end, never used to select a checkpoint (SPEC decision 4).

A new run never writes into a directory that holds anything but what a start killed before its first
checkpoint left, which it removes, and one whose start fails before its first checkpoint is removed again
(:mod:`~patchword.hashing.rundir`: the rules of :mod:`patchword.runs.claim`). SIGTERM / SIGINT while
training save ``last.pt`` and stop (:class:`~patchword.hashing.trainer.HashTrainingInterrupted`); elsewhere
they stop with a line saying what was kept. A resume first removes what a kill during a write left
(temporary files, a torn last line of ``resumes.jsonl``).

:func:`resume_hashing` continues a run with its own config, as ``patchword train --resume`` does: only
the keys in :data:`~patchword.hashing.config.HASH_RESUMABLE_KEYS` may be overridden, and a resumed run
ends with the weights an uninterrupted one would have (batches seeded by (seed, epoch), the random
generators restored from ``last.pt``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from patchword.checkpoint import export_weights, load_checkpoint, load_fitting_weights, seeded_generators
from patchword.config import (
    apply_overrides,
    config_diff,
    config_from_mapping,
    flat_config,
    from_dict,
    refuse_edited_config,
    refuse_overrides,
    save_config,
)
from patchword.device import resolve_device
from patchword.errors import ConfigError, MissingFileError, ResumeHint
from patchword.fileio import (
    append_line,
    atomic_write_text,
    check_output_dir,
    keep_jsonl_records,
    repair_jsonl,
)
from patchword.hashing.build import (
    build_hashing_dataset,
    build_hashing_model,
    changed_data_keys,
    refuse_ignored_keys,
    refuse_resplit,
)
from patchword.hashing.config import (
    HASH_RESUMABLE_KEYS,
    HASH_RESUME_DATA_KEYS,
    HashRunConfig,
    check_data_source,
    check_hash_config,
    check_used_keys,
    override_keys,
)
from patchword.hashing.dataset import HashDataset
from patchword.hashing.evaluate import evaluate_hashing
from patchword.hashing.model import UCMFH
from patchword.hashing.rundir import (  # HASH_RUN_FILES, refuse_run_outputs: the commands import them here
    HASH_RUN_FILES,
    HASH_RUNS,
    absolute_data,
    check_evaluated_data,
    check_resumed_data,
    recorded_data_location,
    refuse_missing_run_data,
    refuse_run_outputs,
    refuse_trained_run_overrides,
)
from patchword.hashing.runstate import (
    checkpoint_record,
    imported_untrained,
    refuse_fewer_epochs,
    refuse_imported_without_data,
    refuse_nothing_to_resume,
)
from patchword.hashing.trainer import HashTrainer, append_metrics
from patchword.runs.claim import Claim
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, METRICS_FILE, RESUMES_FILE
from patchword.runs.load import read_run_mapping
from patchword.train.process import stop_raises

__all__ = [
    "HashRun",
    "hashing_run_dir",
    "train_hashing",
    "resume_config",
    "resume_hashing",
    "load_hashing_run",
    "open_hashing_run",
    "refuse_run_outputs",
    "HASH_RUN_FILES",
]

_logger = logging.getLogger(__name__)


#: Keys that say where a run lives, not how it trains: a run directory that was moved still resumes.
_LOCATION_KEYS = frozenset({"output_dir", "name"})


def hashing_run_dir(cfg: HashRunConfig) -> Path:
    """``output_dir/name``; the name defaults to data format, bits, loss and seed."""
    name = cfg.name or f"ucmfh_{cfg.data.format}_{cfg.model.bits}b_{cfg.train.loss}_s{cfg.train.seed}"
    return Path(cfg.output_dir) / name


def train_hashing(
    cfg: HashRunConfig,
    *,
    resume: bool = False,
    data: HashDataset | None = None,
    given_keys: Collection[str] = (),
) -> dict[str, Any]:
    """Build data and model from ``cfg``, train, evaluate once, write the run directory; returns the summary.

    Uses torch's current thread count (``cfg.train.num_threads`` is applied by the CLI, not here).

    Args:
        cfg: the resolved config.
        resume: continue ``run_dir/last.pt`` (:func:`resume_hashing` with the keys where ``cfg`` differs
            from the run's config.yaml); without it a run directory that holds anything is an error (no
            silent overwrite, no second run's records in a killed run's metrics.jsonl).
        data: an already built dataset (benchmarks reuse one); built from ``cfg.data`` when None.
        given_keys: the keys the caller's overrides set (``hash train``'s): a key the data format would
            ignore is refused even at its default value (one that splits one set of pairs, such as
            ``data.num_query``, for pre-split files, which decide the splits; ``data.split_seed`` for
            synthetic data, split in order; a ``data.synthetic_*`` key for files); such a key whose value
            differs from its default is refused anyway. A key the other settings do not use
            (:func:`~patchword.hashing.config.check_used_keys`) is refused too.

    Raises:
        RunExistsError: the run directory holds something and ``resume`` is False, or another process
            trains the run now.
        Interrupted: SIGTERM / SIGINT (:class:`~patchword.hashing.trainer.HashTrainingInterrupted` during
            training, after last.pt was written).
        MissingFileError: ``resume`` of a run that does not exist or never saved a checkpoint.
        ConfigError: ``resume`` with settings other than the run's own (except
            :data:`HASH_RESUMABLE_KEYS`); the run's config.yaml is never rewritten. A data key the format
            does not read or would ignore (:func:`~patchword.hashing.build.build_hashing_dataset`), a
            key the other settings do not use (the loss, the optimiser, the fusion mode).
    """
    check_hash_config(cfg)
    if not resume:  # a key the settings do not read would be ignored (a resume keeps the run's own config)
        check_data_source(cfg.data)
        check_used_keys(cfg, given_keys)
    run_dir = hashing_run_dir(cfg)
    if resume:
        saved = resume_config(run_dir)
        changed = [k for k in config_diff(saved, cfg) if k not in _LOCATION_KEYS]
        refused = [k for k in changed if k not in HASH_RESUMABLE_KEYS | HASH_RESUME_DATA_KEYS]
        if refused:
            raise ConfigError(
                refused[0], f"differs from {run_dir / CONFIG_FILE}: a resumed run keeps its own settings"
            )
        values = flat_config(cfg)  # dotted key -> value
        return resume_hashing(run_dir, [f"{k}={json.dumps(values[k])}" for k in changed], data=data)
    # a file in its place, a read-only or vanished output_dir fail now, not after the data were built
    check_output_dir(cfg.output_dir, "output_dir", what="the directory runs go in")
    HASH_RUNS.refuse_existing(run_dir)  # early; checked again under the lock, before anything is written
    return _train(cfg, run_dir, data, given=set(given_keys) | changed_data_keys(cfg.data))


def resume_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> HashRunConfig:
    """The config a resume of ``run_dir`` runs with: its own ``config.yaml`` plus ``overrides`` of keys in
    :data:`HASH_RESUMABLE_KEYS` (``train.epochs=100``). Reads nothing else and writes nothing.

    Raises:
        MissingFileError: no such run, or it has no last.pt / config.yaml.
        ConfigError: an override of a key that is not safe to change on a resume, naming the key.
    """
    run_dir = Path(run_dir)
    refuse_nothing_to_resume(run_dir)  # no such run, or a start killed before its first checkpoint
    if not (run_dir / CONFIG_FILE).is_file():
        raise MissingFileError(f"{run_dir} is not a hashing run directory (no {CONFIG_FILE})")
    mapping = read_run_mapping(run_dir, kind="hashing")  # a retrieval run's config: say so, not its keys
    refuse_overrides(
        overrides,
        HASH_RESUMABLE_KEYS | HASH_RESUME_DATA_KEYS,
        "cannot change on --resume (the run keeps its own data, model and optimiser settings); "
        f"resumable keys: {', '.join(sorted(HASH_RESUMABLE_KEYS))} (and the data paths, "
        "for the run's data moved)",
    )
    saved = config_from_mapping(HashRunConfig, mapping, run_dir / CONFIG_FILE)  # the mapping read above
    return apply_overrides(saved, list(overrides))


def resume_hashing(
    run_dir: str | Path, overrides: Sequence[str] = (), *, data: HashDataset | None = None
) -> dict[str, Any]:
    """Continue ``run_dir`` from its ``last.pt`` with its own saved config; returns the summary.

    ``overrides`` may change only the keys in :data:`HASH_RESUMABLE_KEYS` (more epochs, another device,
    other evaluation options); ``config.yaml`` is never rewritten: each resume is appended to
    ``resumes.jsonl``. The run ends with the weights of an uninterrupted run to the same epoch (same
    machine and thread count). Uses torch's current thread count, as :func:`train_hashing` does.

    Raises:
        MissingFileError: no such run, or it has no last.pt / config.yaml.
        ConfigError: an override of a key that is not safe to change on a resume, a config.yaml that
            disagrees with its last.pt (edited by hand), a data file that is gone (naming its key) or data
            other than the run's (rows / sha256 recorded in last.pt; data.image=NEW may point at them moved);
            a ``train.epochs`` below the epochs the run already trained (nothing to train); an imported
            checkpoint without data of its own (its config.yaml's synthetic stand-in: import it again with
            its data).
    """
    run_dir = Path(run_dir)
    cfg = resume_config(run_dir, overrides)
    check_hash_config(cfg)
    state = load_checkpoint(run_dir / LAST_CHECKPOINT, map_location="cpu")
    refuse_fewer_epochs(cfg.train.epochs, state, run_dir)  # before anything is written
    if imported_untrained(run_dir, int(state["step"])):  # never trained here: what data?
        refuse_imported_without_data(run_dir, cfg.data, (), resuming=True)
    stored = from_dict(HashRunConfig, state["config"])
    # the data paths a resume pointed at the moved data are in last.pt, not in config.yaml
    refuse_edited_config(run_dir / CONFIG_FILE, cfg, stored, HASH_RESUMABLE_KEYS | HASH_RESUME_DATA_KEYS)
    moved = override_keys(overrides) & HASH_RESUME_DATA_KEYS
    # where an earlier resume found the moved data (last.pt's config), unless pointed elsewhere again
    located, source = recorded_data_location(cfg.data, stored.data, moved)
    cfg = replace(cfg, data=located)
    refuse_missing_run_data(cfg.data, run_dir, moved, run_dir / source)
    return _train(cfg, run_dir, data, state=state, overrides=overrides, moved=moved)


def _train(
    cfg: HashRunConfig,
    run_dir: Path,
    data: HashDataset | None,
    *,
    state: dict[str, Any] | None = None,
    overrides: Sequence[str] = (),
    given: Collection[str] = (),
    moved: Collection[str] = (),
) -> dict[str, Any]:
    """Build, then start (``state`` None: creates the run directory and its config.yaml) or continue from
    ``state`` (a loaded last.pt), train, evaluate once on the test split; the run directory is locked
    throughout. ``given``: the keys the caller set (:func:`build_hashing_dataset`); ``moved``: the data
    keys a resume points at the run's data elsewhere (:func:`check_resumed_data`)."""
    device = check_hash_config(cfg)
    hint = ResumeHint.resume(HASH_RUNS.command, run_dir)
    phase: dict[str, Any] = {"then": hint.before_start() if state is None else hint.before_resumed()}
    claim = Claim()
    # the global generators seeded for the run, the caller's back after it (no process-wide change)
    with stop_raises(phase), contextlib.ExitStack() as locks, seeded_generators(cfg.train.seed, device):
        if state is not None:
            HASH_RUNS.lock_for_resume(run_dir, locks)  # and removes what a kill during a write left
        data = data if data is not None else build_hashing_dataset(cfg.data, given)
        if state is not None:  # the data the run trained on, bit for bit (rows added re-split them)
            check_resumed_data(state, data, cfg.data, run_dir, moved)
        # recorded absolute: its commands read these files from any working directory
        cfg = replace(cfg, data=absolute_data(cfg.data))
        if cfg.train.loss == "hashnet" and not data.has_labels:
            _logger.info("hashnet loss without labels: pairs are similar only to themselves (ids)")
        model = build_hashing_model(cfg.model, data.image_dim, data.text_dim)
        trainer = HashTrainer(cfg, model, data, run_dir)
        try:
            if state is None:  # everything is checked and built: now the run directory and its config
                HASH_RUNS.claim_new(run_dir, locks, claim)
                save_config(cfg, run_dir / CONFIG_FILE)
            else:
                trainer.load_state_dict(state)
                _logger.info("resumed %s at epoch %d, step %d", run_dir, trainer.epoch, trainer.step)
                # the records of the epochs this resume redoes (a kill after the checkpoint) go
                keep_jsonl_records(
                    run_dir / METRICS_FILE, lambda r, step=trainer.step: int(r["step"]) <= step
                )
                record = {
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "epoch": trainer.epoch,
                    "step": trainer.step,
                }
                repair_jsonl(run_dir / RESUMES_FILE)  # a torn last line would glue onto this record
                append_line(run_dir / RESUMES_FILE, json.dumps({**record, "overrides": list(overrides)}))
            fit = trainer.fit()
        except BaseException:
            if claim.owned and not (run_dir / LAST_CHECKPOINT).is_file():
                HASH_RUNS.remove_failed_start(run_dir, claim.created)
            raise
        phase["then"] = hint.evaluating()
        export_weights(model, asdict(cfg), run_dir, data=data.summary())
        metrics = evaluate_hashing(model, data, cfg.eval, device)
        metrics["checkpoint"] = checkpoint_record(
            run_dir, trainer.epoch, trainer.batch_in_epoch, trainer.step, cfg.train.epochs
        )
        append_metrics(run_dir, {"split": "test", "epoch": trainer.epoch, "step": trainer.step, **metrics})
        atomic_write_text(run_dir / "eval.json", json.dumps({**metrics, "data": data.summary()}, indent=2))
    return {"run_dir": str(run_dir), "data": data.summary(), **fit, **metrics}


@dataclass
class HashRun:
    """A trained run loaded back: config (with the overrides applied), model (eval mode, on
    ``cfg.device``), data, and :func:`checkpoint_record` of the weights."""

    cfg: HashRunConfig
    model: UCMFH
    data: HashDataset
    checkpoint: dict[str, Any]


def open_hashing_run(
    run_dir: str | Path,
    overrides: Sequence[str] | None = None,
    device: str | None = None,
    *,
    unimodal: str = "",
) -> HashRun:
    """Config, trained model, dataset and checkpoint record of a run (see :func:`load_hashing_run`);
    ``unimodal``: why the caller needs a unimodal model, said (ValueError) before the data are read."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise MissingFileError(f"{run_dir} is not a hashing run directory (no {CONFIG_FILE})")
    # read once, and refused when empty or a retrieval run's (each of its keys was "unknown config key")
    mapping = read_run_mapping(run_dir, kind="hashing")
    if not (run_dir / LAST_CHECKPOINT).is_file():
        raise MissingFileError(f"{run_dir} has no last.pt: the run never saved a checkpoint")
    refuse_trained_run_overrides(overrides or [])
    given = override_keys(overrides or [])
    saved = config_from_mapping(HashRunConfig, mapping, run_dir / CONFIG_FILE)  # errors name the file
    cfg = apply_overrides(saved, list(overrides or []))  # a copy: ``saved`` stays the run's own
    cfg = replace(
        cfg, device=str(resolve_device(device or cfg.device, key="--device" if device else "device"))
    )
    # the overridden eval / data keys get the checks training made (eval.topk=0 reported map@0 = 0.0)
    check_hash_config(cfg)
    if unimodal and cfg.model.fusion != "unimodal":
        raise ValueError(unimodal)
    # an override the run's settings never read (model.eval_batch_size on a unimodal run) is refused as a
    # new run's is; the values its config.yaml holds are the run's, not the command's
    check_used_keys(cfg, given, only_given=True)
    # refused before the data are read or built (minutes on real data): a data key the overrides set that
    # the run's format would ignore (a split key for a split directory, a data.synthetic_* key for files...;
    # the run's own are not), then one that re-splits the run's data
    refuse_ignored_keys(cfg.data, given)
    state = load_checkpoint(run_dir / LAST_CHECKPOINT, map_location=cfg.device)
    # the run's data are where its last resume found them (a moved run: last.pt), unless overridden
    recorded = from_dict(HashRunConfig, state["config"]).data if state.get("config") else None
    saved = replace(saved, data=recorded_data_location(saved.data, recorded)[0])
    located, source = recorded_data_location(cfg.data, recorded, given)
    cfg = replace(cfg, data=located)
    # an imported checkpoint not trained on since has no data of its own
    trained = not imported_untrained(run_dir, int(state["step"]))
    if trained:
        # weights trained on the run's split: another split (or synthetic set) of the same data put
        # training pairs in the query set
        refuse_resplit(saved.data, cfg.data)
    else:  # its config.yaml's synthetic stand-in is no data to evaluate it on, unless asked
        refuse_imported_without_data(run_dir, saved.data, given)
    refuse_missing_run_data(cfg.data, run_dir, given, run_dir / source)
    # the training split is unused here: a capped default data.num_train is no news (said at training)
    data = build_hashing_dataset(cfg.data, given, training=False)
    if trained:  # a copy of the run's data re-split, or its files changed since (rows added)
        check_evaluated_data(state, data, saved.data, cfg.data, run_dir)
    model = build_hashing_model(cfg.model, data.image_dim, data.text_dim)
    # data (overridden, or its files replaced) with other feature sizes build a model the weights do not fit
    builds = f"these data build (image {data.image_dim}-d, text {data.text_dim}-d)"
    load_fitting_weights(model, state["model"], run_dir / LAST_CHECKPOINT, "data", builds)
    # the epochs the session that wrote it trained to (a resume may have raised config.yaml's)
    epochs = (state.get("config") or {}).get("train", {}).get("epochs", cfg.train.epochs)
    checkpoint = checkpoint_record(
        run_dir, int(state["epoch"]), int(state.get("batch_in_epoch", 0)), int(state["step"]), int(epochs)
    )
    return HashRun(cfg, model.to(cfg.device).eval(), data, checkpoint)


def load_hashing_run(
    run_dir: str | Path, overrides: list[str] | None = None, device: str | None = None
) -> tuple[HashRunConfig, UCMFH, HashDataset]:
    """Config, trained model (eval mode, on the config's or the given device) and dataset of a run.

    ``overrides`` may change only the keys in :data:`HASH_EVAL_KEYS` (evaluation options, the device, the
    data): the run's model is its own. The overridden config is checked as training checks it.

    Raises:
        MissingFileError: ``run_dir`` has no ``config.yaml`` or no ``last.pt``.
        ConfigError: an override of another key, a value out of range, data whose feature sizes do not
            fit the trained weights, or a split / synthetic key re-splitting the run's own data; an
            imported checkpoint without data of its own unless ``data.format`` is given.
    """
    run = open_hashing_run(run_dir, overrides, device)
    return run.cfg, run.model, run.data
