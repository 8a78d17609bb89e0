"""End-to-end runs: check, build, train, evaluate, summarise; and resuming a run with its own config.

A run directory is the unit a user owns. Its ``config.yaml`` is written once, after the whole config, the
data and the model have been checked, and never rewritten: ``--resume`` reads it back, accepts only the
overrides in :data:`~patchword.train.validate.RESUMABLE_KEYS` and records itself in ``resumes.jsonl``.
A start that fails (or is stopped by SIGTERM / SIGINT) before its first checkpoint leaves nothing behind;
one killed outright (``kill -9``, the OOM killer: no cleanup runs) leaves only files a start writes, and
the same command removes them and starts again. A start or ``--resume`` also removes the temporary files
of writes a kill cut short. One command at a time owns a run directory: it holds an advisory lock on its
:data:`LOCK_FILE` for its whole life. These rules are every training command's
(:mod:`patchword.runs.claim`); :data:`TRAIN_RUNS` says which files are this command's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from patchword.checkpoint import export_weights, seed_everything
from patchword.config import apply_overrides, from_dict, refuse_edited_config, refuse_overrides, save_config
from patchword.data.prepare import (
    ROLES,
    PreparedData,
    build_tokenizer,
    encode_raw,
    load_raw_data,
    prepare_data,
    reads_dense_text,
)
from patchword.data.tokenizers import WordVocab
from patchword.distributed import Distributed, session
from patchword.errors import Interrupted, ResumeHint, RunExistsError
from patchword.factory import create_model
from patchword.fileio import (
    append_line,
    atomic_write_text,
    check_output_dir,
    file_sha256,
    probe_writable,
    repair_jsonl,
)
from patchword.model import RetrievalModel, model_reads_dense
from patchword.readers import read_json
from patchword.runs import (
    BACKBONES_FILE,
    BERT_VOCAB_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    RESUMES_FILE,
    VOCAB_FILE,
    WEIGHTS_FILE,
    build_run_model,
    load_run_tokenizer,
    read_run_config,
    save_backbones,
)
from patchword.runs.claim import LOCK_FILE, Claim, Refusals, RunKind
from patchword.runs.config import RunConfig
from patchword.runs.evaluate import evaluate_run, json_text
from patchword.runs.files import BEST_CHECKPOINT, EXPORT_DIR, LAST_CHECKPOINT, METRICS_JSON, SUMMARY_FILE
from patchword.runs.origins import recorded_warm_start
from patchword.runs.recorded import DIGEST_FIELD
from patchword.train.agreement import checkpoint_to_evaluate, refuse_differing_configs
from patchword.train.limits import refuse_limits_behind
from patchword.train.process import stop_raises, torch_threads
from patchword.train.resumable import resumable_state
from patchword.train.resuming import nothing_to_do, resume_records, train_hint
from patchword.train.sessions import evaluates_otherwise, session_machine, set_aside_results
from patchword.train.settings import check_model_settings
from patchword.train.trackers import TENSORBOARD_DIR, WANDB_ID_FILE
from patchword.train.trainer import Trainer
from patchword.train.validate import (
    RESUMABLE_KEYS,
    check_config_and_truth,
    check_launch,
    check_model_data,
    refuse_moved_data,
)
from patchword.train.warm import warm_start_run, write_warm_start

__all__ = [
    "PreparedData",
    "prepare_data",
    "train_run",
    "resume_run",
    "RESUMABLE_KEYS",
    "TRAIN_RUNS",
]

_logger = logging.getLogger(__name__)

#: What each tracker of ``train.report_to`` writes into the run directory once training starts.
_TRACKER_FILES = {"tensorboard": (TENSORBOARD_DIR,), "wandb": (WANDB_ID_FILE, "wandb")}


def _tracker_outputs(run_dir: Path) -> list[str]:
    """What the trackers that the config of the run in ``run_dir`` names write there (a start's own)."""
    try:
        report_to = read_run_config(run_dir).train.report_to
    except Exception:  # noqa: BLE001 - no readable config.yaml: no tracker wrote into it either
        report_to = []
    return [name for tracker in report_to for name in _TRACKER_FILES.get(tracker, ())]


#: A new run's refusal of a directory without a last.pt (--resume would refuse it: not advised).
_NOTHING_TO_RESUME = (
    f"run directory {{run_dir}} already exists, with no {LAST_CHECKPOINT} to resume from and files a start "
    "killed before its first checkpoint does not leave; choose another name= or remove it"
)

#: The files a start writes atomically before its first ``last.pt`` (and that one), whose
#: ``.{name}.XXXX.tmp`` a kill during the write leaves.
_START_TEMPS = (CONFIG_FILE, VOCAB_FILE, BACKBONES_FILE, LAST_CHECKPOINT, BEST_CHECKPOINT, WANDB_ID_FILE)

#: Start files: what a start writes into its run directory before its first ``last.pt`` (metrics.jsonl:
#: records of steps nobody can resume), besides its trackers' outputs. Not best.pt: a kill between it and
#: the first last.pt leaves weights one may evaluate. Atomic files: every file a run writes atomically
#: (:func:`~patchword.fileio.atomic_write`), the export's in export/.
TRAIN_RUNS = RunKind(
    command="patchword train",
    start_files=(LOCK_FILE, CONFIG_FILE, VOCAB_FILE, BERT_VOCAB_DIR, BACKBONES_FILE, METRICS_FILE),
    start_temps=_START_TEMPS,
    atomic_files=(
        *_START_TEMPS,
        *(f"{BERT_VOCAB_DIR}/vocab.txt", f"{BERT_VOCAB_DIR}/tokenizer_config.json"),
        *(METRICS_FILE, METRICS_JSON, SUMMARY_FILE, RESUMES_FILE),
        f"{EXPORT_DIR}/{WEIGHTS_FILE}",
        f"{EXPORT_DIR}/config.json",
    ),
    refusals=Refusals(
        resumable=(
            "run directory {run_dir} already exists; choose another name= or continue it with {resume}"
        ),
        stopped=_NOTHING_TO_RESUME,
        foreign=_NOTHING_TO_RESUME,
        is_file="{run_dir} is a file: choose another name= or output_dir=",
        evaluable=(
            f"run directory {{run_dir}} already exists, with {BEST_CHECKPOINT} but no {LAST_CHECKPOINT} "
            f"(a run killed while it wrote its first {LAST_CHECKPOINT}): nothing to resume; evaluate its "
            "weights with `patchword eval {run_dir}`, or remove it or choose another name= to train again"
        ),
    ),
    own_outputs=_tracker_outputs,
    logger=__name__,
)


def _on_main(dist: Distributed, run_dir: Path, claim: Callable[[], None]) -> None:
    """``claim()`` on rank 0, the process that writes the run; its refusal stops every process."""
    error = None
    if dist.is_main:
        try:
            claim()
        except (Exception, Interrupted) as err:  # noqa: BLE001 - raised below, once every process heard of it
            error = err
    (refused,) = dist.any(error is not None)
    if error is not None:
        raise error
    if refused:
        raise RunExistsError(f"run directory {run_dir}: refused by rank 0 (its error says why)")


def _build(
    cfg: RunConfig, data: PreparedData | None, tokenizer=None, run_dir: Path | None = None
) -> tuple[PreparedData, RetrievalModel]:
    """Data (all three splits) and model, every check passed; nothing is written. With ``run_dir`` (a
    resume) the model is built from the run's own files, its checkpoint then supplies every weight."""
    use_dense = reads_dense_text(cfg.data, model_reads_dense(cfg.model))
    t0 = time.perf_counter()
    if data is None:
        raw = load_raw_data(cfg.data, ROLES, use_dense=use_dense)
        if tokenizer is None:
            tokenizer = build_tokenizer(
                cfg.data, raw.splits["train"], local_files_only=cfg.model.hf_local_files_only
            )
        data = encode_raw(raw, cfg.data, tokenizer, use_dense=use_dense)
    _logger.info(
        "data ready in %.1fs: %s",
        time.perf_counter() - t0,
        {k: (v.num_images, v.num_captions) for k, v in data.splits.items()},
    )
    seed_everything(cfg.seed)
    if run_dir is not None:
        model = build_run_model(run_dir, cfg, data.vocab_size, data.vocab_words)
    else:
        model = create_model(cfg.model, vocab_size=data.vocab_size, vocab_words=data.vocab_words)
    check_model_data(cfg, model, data)
    if run_dir is None:  # a new run: no setting its model would not read (a resume keeps its own)
        check_model_settings(cfg, model)
    return data, model


def _trainer(
    cfg: RunConfig, model, data: PreparedData, run_dir: Path, dist: Distributed, hint: ResumeHint
) -> Trainer:
    splits = data.splits
    trainer = Trainer(
        cfg,
        model,
        splits["train"],
        splits["dev"],
        run_dir,
        device=dist.device,
        tokenizer=data.tokenizer,
        dist=dist,
        resume_hint=hint,
    )
    trainer.timing.begin_session(session_machine(dist.device, cfg.train.num_threads, dist.world_size))
    return trainer


def _save_tokenizer(tokenizer, run_dir: Path) -> None:
    """The run's own vocabulary: its resume, eval and export never read a data.bert_vocab that moved."""
    tokenizer.save(run_dir / (VOCAB_FILE if isinstance(tokenizer, WordVocab) else BERT_VOCAB_DIR))


def train_run(
    cfg: RunConfig, *, data: PreparedData | None = None, hint: ResumeHint | None = None
) -> dict[str, Any]:
    """Check everything, then create ``output_dir/name``, train, evaluate the best dev checkpoint.

    Writes config.yaml, vocab.json (word) or bert_vocab/ (BERT), metrics.jsonl, last.pt / best.pt, export/,
    metrics.json and summary.json. ``data`` may be passed to reuse already tokenised splits. ``hint``: how
    an interruption's message says to go on with the run (default ``patchword train --resume``).

    Under ``torchrun`` every process runs this function: each trains on its shard of every global batch
    (:mod:`patchword.distributed`) and rank 0 alone writes the run directory.

    Raises:
        RunExistsError: the run directory already exists (it is never overwritten), or another process is
            starting a run of the same name.
        ConfigError, DataError, MissingFileError, ModelNotFoundError: a check failed; nothing was written.
        DistributedError: another process of the launch died or stopped answering.
        Interrupted: SIGTERM / SIGINT before training (nothing kept) or during the final evaluation;
            :class:`~patchword.train.trainer.TrainingInterrupted` during training (last.pt written).
    """
    # a file in its place or a parent's, a read-only or vanished output_dir: now, not after the data
    check_output_dir(cfg.output_dir, "output_dir", what="the directory runs go in")
    device, truth = check_config_and_truth(cfg)  # truth: the COCO ground truth, read once
    run_dir = Path(cfg.output_dir) / cfg.name
    hint = hint or train_hint(TRAIN_RUNS.command, run_dir)  # the run's own config.yaml: no overrides
    phase: dict[str, Any] = {"then": hint.before_start()}
    with stop_raises(phase), session(device, cfg.dist_timeout_s) as dist, contextlib.ExitStack() as locks:
        refuse_differing_configs(cfg, dist)  # first: every check below is then the same on every process
        check_launch(cfg, dist.world_size)
        # early, before the data is loaded (the claim checks again, under the lock); rank 0 alone takes the
        # lock for a moment to see whether the run trains now: two ranks at once would see each other
        TRAIN_RUNS.refuse_existing(run_dir, probe_lock=dist.is_main)
        dist.barrier()  # every process has checked before rank 0 creates the directory
        data, model = _build(cfg, data)
        warm = warm_start_run(model, cfg.train.init_from) if cfg.train.init_from else None
        claim = Claim()
        try:
            _on_main(dist, run_dir, lambda: TRAIN_RUNS.claim_new(run_dir, locks, claim))
            if dist.is_main:
                save_config(cfg, run_dir / CONFIG_FILE)
                _save_tokenizer(data.tokenizer, run_dir)
                save_backbones(model, run_dir)
                if warm is not None:  # what it loaded, recorded now: the file may be gone at export
                    write_warm_start(run_dir, warm)
            seed_everything(cfg.seed)
            trainer = _trainer(cfg, model, data, run_dir, dist, hint)
            fit = trainer.fit()
        except BaseException:
            # Nothing to resume yet: leave no half-made run behind (the same name can simply be rerun).
            if claim.owned and not (run_dir / LAST_CHECKPOINT).is_file():
                TRAIN_RUNS.remove_failed_start(run_dir, claim.created)
            raise
        phase["then"] = hint.evaluating(run_dir / LAST_CHECKPOINT)
        return _finish(cfg, model, data, run_dir, trainer, fit, dist, truth)


def resume_run(
    run_dir: str | Path, overrides: Sequence[str] = (), *, hint: ResumeHint | None = None
) -> dict[str, Any]:
    """Continue ``run_dir`` from its ``last.pt`` with its own saved config.

    Only the keys in :data:`RESUMABLE_KEYS` may be overridden (more epochs, another device, other eval
    options); ``config.yaml`` is never rewritten: each resume is appended to ``resumes.jsonl``. ``hint``:
    how an interruption's message says to go on with the run (default ``patchword train --resume RUN``
    with these ``overrides``: :func:`~patchword.train.resuming.train_hint`). A finished run whose
    summary.json this resume would only write again is left as it is (its summary returned).

    Raises:
        MissingFileError: no such run, or it has no config.yaml / last.pt.
        ConfigError: an override of a key that is not safe to change on a resume (an unknown key: named as
            one); a train.epochs / train.max_steps below the step last.pt is at (nothing is written).
        RunExistsError: another process trains or resumes the run now.
        Interrupted: SIGTERM / SIGINT outside the training loop;
            :class:`~patchword.train.trainer.TrainingInterrupted` during training (last.pt written).
    """
    run_dir = Path(run_dir)
    saved = read_run_config(run_dir)
    state = resumable_state(run_dir)  # last.pt: read before the overrides are checked, as it was found
    refuse_moved_data(overrides, saved, run_dir / CONFIG_FILE)
    refuse_overrides(
        overrides,
        RESUMABLE_KEYS,
        "cannot change on --resume (the run keeps its own data, model and optimiser settings); "
        f"resumable keys: {', '.join(sorted(RESUMABLE_KEYS))}",
        config=saved,  # an unknown key is named as one (and the closest valid key), not as not resumable
    )
    cfg = apply_overrides(saved, list(overrides))
    device, truth = check_config_and_truth(cfg, resuming=True, source=run_dir / CONFIG_FILE)
    refuse_limits_behind(cfg.train, state, run_dir)
    probe_writable(run_dir)
    stored = from_dict(RunConfig, state["config"])
    refuse_edited_config(run_dir / CONFIG_FILE, saved, stored, RESUMABLE_KEYS)
    tokenizer = load_run_tokenizer(run_dir, cfg.data)
    # an interrupted session goes on with its own overrides (train.epochs=8 is not config.yaml's limit)
    hint = hint or train_hint(TRAIN_RUNS.command, run_dir, overrides)
    phase: dict[str, Any] = {"then": hint.before_resumed()}
    with stop_raises(phase), session(device, cfg.dist_timeout_s) as dist, contextlib.ExitStack() as locks:
        refuse_differing_configs(cfg, dist, overrides)
        check_launch(cfg, dist.world_size)
        # locked, then what a kill during a write left (export/ included) removed
        _on_main(dist, run_dir, lambda: TRAIN_RUNS.lock_for_resume(run_dir, locks))
        summary = nothing_to_do(run_dir, cfg, state) if dist.is_main else None  # summary.json, read once
        if dist.any(summary is not None)[0]:  # kept byte for byte: a resume would only rewrite it
            return summary or read_json(run_dir / SUMMARY_FILE, "run summary")  # the other ranks read it
        data, model = _build(cfg, None, tokenizer=tokenizer, run_dir=run_dir)
        trainer = _trainer(cfg, model, data, run_dir, dist, hint)
        trainer.load_state_dict(state)
        position = (trainer.epoch, trainer.batch_in_epoch, trainer.step)
        _logger.info("resumed %s at epoch %d, batch %d, step %d", run_dir, *position)
        resume_records(trainer, run_dir, dist)  # redone steps' records dropped; a last validation owed
        if dist.is_main:
            # the results a resume replaces are kept (read before this resume is recorded)
            aside = not trainer.finished or evaluates_otherwise(run_dir, cfg)
            record = {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "step": trainer.step,
                "overrides": list(overrides),
            }
            repair_jsonl(run_dir / RESUMES_FILE)  # a torn last line would glue onto this record
            append_line(run_dir / RESUMES_FILE, json.dumps(record))
            if aside:
                set_aside_results(run_dir)
        fit = trainer.fit()
        phase["then"] = hint.evaluating(run_dir / LAST_CHECKPOINT)
        return _finish(cfg, model, data, run_dir, trainer, fit, dist, truth)


def _finish(
    cfg, model, data, run_dir: Path, trainer: Trainer, fit: dict, dist: Distributed, truth=None
) -> dict[str, Any]:
    """Evaluate ``best.pt`` (else ``last.pt``) and write ``summary.json`` (strict JSON): the metrics, the
    ``"checkpoint"`` (its name) and ``"checkpoint_step"`` they describe, the fit's counts and times, and
    ``"train_steps_per_s"``: timed steps over ``step_time_seconds``, the time in steps alone (the
    Trainer's docstring says what each time covers). ``truth``: the COCO ground truth the checks read."""
    # rank 0's best.pt (and its SHA-256), else last.pt (the model's)
    trained, best, digest = checkpoint_to_evaluate(run_dir, dist)
    step = trainer.step if best is None else best["step"]  # last.pt's, or best.pt's
    if best is not None:
        model.load_state_dict(best["model"])
    if dist.is_main:
        export_weights(model, asdict(cfg), run_dir / "export", vocab_size=data.vocab_size)
    with torch_threads(cfg.train.num_threads):  # the command's threads, its evaluation's too
        summary = evaluate_run(cfg, model, data, run_dir, device=dist.device, dist=dist, ground_truth=truth)
    summary.update(checkpoint=trained.name, checkpoint_step=step)
    summary.update(fit)
    summary["skipped_steps"] = trainer.skipped_steps
    summary["world_size"] = dist.world_size
    if (warm := recorded_warm_start(run_dir)) is not None:  # the first session's (a resume keeps it)
        summary["warm_start"] = warm
    timed, seconds = summary.pop("timed_steps", 0), summary.get("step_time_seconds") or 0.0
    # steps over the time in steps (checkpoints of an older version timed none of theirs)
    summary["train_steps_per_s"] = round(timed / seconds, 3) if timed and seconds > 0 else None
    if dist.is_main:
        if trained.is_file():  # the summary describes it while it holds these bytes (evaluation_of)
            summary[DIGEST_FIELD] = digest or file_sha256(trained)
        atomic_write_text(run_dir / SUMMARY_FILE, text := json_text(summary))
        return json.loads(text)  # as written (stdout prints it): null for what JSON cannot hold
    return summary
