"""A UCMFH hashing run directory: train one from a config, or continue one (loading one back for eval and
search is :mod:`~patchword.hashing.openrun`, imported from here too).

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
the keys in :data:`~patchword.hashing.config.HASH_RESUMABLE_KEYS` may be overridden (one not given keeps
the value of the session that wrote ``last.pt``: config.yaml is never rewritten), and a resumed run ends
with the weights an uninterrupted one would have (batches seeded by (seed, epoch), the random generators
restored from ``last.pt``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from patchword.checkpoint import export_weights, load_checkpoint, seeded_generators
from patchword.config import (
    apply_overrides,
    config_diff,
    flat_config,
    from_dict,
    refuse_edited_config,
    refuse_overrides,
    save_config,
)
from patchword.errors import ConfigError, ResumeHint
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
)
from patchword.hashing.config import (
    HASH_RESUMABLE_KEYS,
    HASH_RESUME_DATA_KEYS,
    HashRunConfig,
    alpha_record,
    check_data_source,
    check_hash_config,
    override_keys,
    saved_run_config,
)
from patchword.hashing.dataset import HashDataset
from patchword.hashing.evaluate import evaluate_hashing
from patchword.hashing.openrun import HashRun, load_hashing_run, open_hashing_run  # imported from here
from patchword.hashing.rundir import (  # HASH_RUN_FILES, refuse_run_outputs: the commands import them here
    HASH_RUN_FILES,
    HASH_RUNS,
    absolute_data,
    check_resumed_data,
    read_hash_run_config,
    recorded_data_location,
    refuse_missing_run_data,
    refuse_run_outputs,
)
from patchword.hashing.runstate import (
    checkpoint_record,
    imported_untrained,
    refuse_fewer_epochs,
    refuse_imported_without_data,
    refuse_nothing_to_resume,
)
from patchword.hashing.trainer import HashTrainer, append_metrics, check_batch_size
from patchword.hashing.usedkeys import check_used_keys
from patchword.runs.claim import Claim
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, METRICS_FILE, RESUMES_FILE
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
            (:func:`~patchword.hashing.usedkeys.check_used_keys`) is refused too, and so is a
            ``train.batch_size`` above the training pairs.

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
        saved, state, stored = _resume_config(run_dir, ())
        changed = [k for k in config_diff(saved, cfg) if k not in _LOCATION_KEYS]
        refused = [k for k in changed if k not in HASH_RESUMABLE_KEYS | HASH_RESUME_DATA_KEYS]
        if refused:
            raise ConfigError(
                refused[0], f"differs from {run_dir / CONFIG_FILE}: a resumed run keeps its own settings"
            )
        values = flat_config(cfg)  # dotted key -> value
        overrides = [f"{k}={json.dumps(values[k])}" for k in changed]
        return _resume(run_dir, apply_overrides(saved, overrides), state, stored, overrides, data)
    # a file in its place, a read-only or vanished output_dir fail now, not after the data were built
    check_output_dir(cfg.output_dir, "output_dir", what="the directory runs go in")
    HASH_RUNS.refuse_existing(run_dir)  # early; checked again under the lock, before anything is written
    return _train(cfg, run_dir, data, given=set(given_keys) | changed_data_keys(cfg.data))


def resume_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> HashRunConfig:
    """The config a resume of ``run_dir`` runs with: its own ``config.yaml``, with the resumable keys
    (:data:`HASH_RESUMABLE_KEYS`) that the session that wrote its last.pt ran with (a resume with
    ``train.epochs=40`` that was stopped goes on to 40, not to config.yaml's), plus ``overrides`` of
    resumable keys (``train.epochs=100``). Reads config.yaml and last.pt, writes nothing.

    Raises:
        MissingFileError: no such run, or it has no last.pt / config.yaml.
        ConfigError: an override of a key that is not safe to change on a resume, naming the key.
    """
    return _resume_config(Path(run_dir), overrides)[0]


def _resume_config(
    run_dir: Path, overrides: Sequence[str]
) -> tuple[HashRunConfig, dict[str, Any], HashRunConfig]:
    """:func:`resume_config`, the last.pt it read (loaded on the CPU) and the config that last.pt records
    (the session that wrote it ran with it)."""
    refuse_nothing_to_resume(run_dir)  # no such run, or a start killed before its first checkpoint
    saved = read_hash_run_config(run_dir)  # a retrieval run's config: said so, not its keys
    refuse_overrides(
        overrides,
        HASH_RESUMABLE_KEYS | HASH_RESUME_DATA_KEYS,
        "cannot change on --resume (the run keeps its own data, model and optimiser settings); "
        f"resumable keys: {', '.join(sorted(HASH_RESUMABLE_KEYS))} (and the data paths, "
        "for the run's data moved)",
    )
    state = load_checkpoint(run_dir / LAST_CHECKPOINT, map_location="cpu")
    # config.yaml is never rewritten: what a resume changed is in the last.pt its session wrote (every
    # last.pt records its config)
    stored = saved_run_config(from_dict(HashRunConfig, state["config"]))
    ran, own = flat_config(stored), flat_config(saved)
    keys = sorted(HASH_RESUMABLE_KEYS - override_keys(overrides))
    session = [f"{key}={json.dumps(ran[key])}" for key in keys if ran[key] != own[key]]
    return apply_overrides(saved, [*session, *overrides]), state, stored


def resume_hashing(
    run_dir: str | Path,
    overrides: Sequence[str] = (),
    *,
    data: HashDataset | None = None,
    threads: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None,
) -> dict[str, Any]:
    """Continue ``run_dir`` from its ``last.pt`` with its own saved config; returns the summary.

    ``overrides`` may change only the keys in :data:`HASH_RESUMABLE_KEYS` (more epochs, another device,
    other evaluation options); one not given keeps the value of the session that wrote last.pt
    (:func:`resume_config`). ``config.yaml`` is never rewritten: each resume is appended to
    ``resumes.jsonl``. The run ends with the weights of an uninterrupted run to the same epoch (same
    machine and thread count). Uses torch's current thread count, as :func:`train_hashing` does, or
    ``threads(train.num_threads)`` around the resume (the command line's: the library sets none).

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
    cfg, state, stored = _resume_config(run_dir, overrides)
    # before threads() applies train.num_threads (a negative count: torch's RuntimeError)
    check_hash_config(cfg)
    with threads(cfg.train.num_threads) if threads is not None else contextlib.nullcontext():
        return _resume(run_dir, cfg, state, stored, overrides, data)


def _resume(
    run_dir: Path,
    cfg: HashRunConfig,
    state: dict[str, Any],
    stored: HashRunConfig,
    overrides: Sequence[str],
    data: HashDataset | None,
) -> dict[str, Any]:
    """:func:`resume_hashing` with the config (checked), the last.pt and its config :func:`_resume_config`
    gave."""
    refuse_fewer_epochs(cfg.train.epochs, state, run_dir)  # before anything is written
    if imported_untrained(run_dir, int(state["step"])):  # never trained here: what data?
        refuse_imported_without_data(run_dir, cfg.data, (), resuming=True)
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
        if state is None:  # a run saved before this check resumes as it trained (one batch of all pairs)
            check_batch_size(cfg, len(data.train))
        else:  # the data the run trained on, bit for bit (rows added re-split them)
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
        metrics = {**evaluate_hashing(model, data, cfg.eval, device), **alpha_record(cfg)}
        metrics["checkpoint"] = checkpoint_record(
            run_dir, trainer.epoch, trainer.batch_in_epoch, trainer.step, cfg.train.epochs
        )
        append_metrics(run_dir, {"split": "test", "epoch": trainer.epoch, "step": trainer.step, **metrics})
        atomic_write_text(run_dir / "eval.json", json.dumps({**metrics, "data": data.summary()}, indent=2))
    return {"run_dir": str(run_dir), "data": data.summary(), **fit, **metrics}
