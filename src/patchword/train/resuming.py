"""What a training session says and decides about going on with its run, besides training it.

* How an interruption's message says to go on (:func:`train_hint`): ``patchword train --resume RUN`` with
  the session's own overrides (a resume that extended the run to ``train.epochs=8`` goes on with
  ``train.epochs=8``, not with config.yaml's limit), under ``torchrun`` as the launch it needs; the other
  ranks of a launch leave the command to rank 0's message.
* The records a resume goes on from (:func:`resume_records`, one read of ``metrics.jsonl``): those of the
  steps it redoes dropped, and whether the step ``last.pt`` is at still owes its validation although the
  run's limit is reached there: a signal stopped the session at a step that was no validation step then,
  and the resume ends the run there (``train.max_steps`` at that step). A run's last step is always
  validated.
* Whether a resume has anything to do at all (:func:`nothing_to_do`): a finished run whose ``summary.json``
  describes its checkpoint as this resume would evaluate it is left as it is.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from patchword.distributed import Distributed, LaunchInfo, launch_info
from patchword.errors import PatchwordError, ResumeHint
from patchword.fileio import file_sha256, keep_jsonl_records
from patchword.readers import read_json, read_json_lines
from patchword.runs.config import RunConfig
from patchword.runs.files import BEST_CHECKPOINT, LAST_CHECKPOINT, METRICS_FILE, SUMMARY_FILE
from patchword.runs.recorded import DIGEST_FIELD
from patchword.train.limits import RunLimits
from patchword.train.sessions import evaluates_otherwise

if TYPE_CHECKING:
    from patchword.train.trainer import Trainer

__all__ = ["drop_metrics_after", "has_dev_record", "nothing_to_do", "resume_records", "train_hint"]

_logger = logging.getLogger(__name__)

#: What another rank than 0 says instead of the command (rank 0's message names it, once per launch).
_RANK_ZERO = "the command rank 0 names"


def _launched(command: str, line: str, launch: LaunchInfo) -> str:
    """``line`` (``command --resume ...``) as the launch of ``launch`` runs it, backquoted."""
    if launch.world_size <= 1:
        return f"`{line}`"
    if launch.launcher == "torchrun":
        module = line.replace(command, f"-m {command}", 1)  # `-m patchword train`: torchrun runs a script
        local = int(os.environ.get("LOCAL_WORLD_SIZE", launch.world_size) or launch.world_size)
        if local >= launch.world_size:
            return f"`torchrun --standalone --nproc_per_node={launch.world_size} {module}`"
        nodes = launch.world_size // local
        return (
            f"`torchrun --nnodes={nodes} --nproc_per_node={local} {module}` on every node, with the "
            "launch's rendezvous options"
        )
    return f"`{line}` in a launch of {launch.world_size} processes, as before ({launch.launcher})"


def train_hint(
    command: str, run_dir: str | Path, overrides: Sequence[str] = (), launch: LaunchInfo | None = None
) -> ResumeHint:
    """How an interruption of a session of the run in ``run_dir`` says to go on
    (:class:`~patchword.errors.ResumeHint`): ``command --resume RUN`` with the session's ``overrides``
    (shell-quoted), under ``torchrun`` with its process count (``launch``: this process's, by default from
    the environment); on another rank than 0, a pointer to rank 0's message."""
    launch = launch or launch_info()
    if launch.rank != 0:
        return ResumeHint(_RANK_ZERO)
    line = f"{command} --resume {shlex.join([str(run_dir), *overrides])}"
    return ResumeHint(_launched(command, line, launch))


def has_dev_record(run_dir: Path, step: int) -> bool:
    """Whether the run's ``metrics.jsonl`` holds a dev record of ``step``."""
    records = read_json_lines(run_dir / METRICS_FILE, "metrics log")
    return any(r.get("split") == "dev" and r.get("step") == step for r in records)


def drop_metrics_after(run_dir: str | Path, step: int, *, validation_due: bool = False) -> int:
    """Keep the records of ``metrics.jsonl`` up to ``step`` (the checkpoint a resume starts from), dropping
    those of the steps the resume will redo and a last line cut short by a kill; returns how many lines
    were dropped, and logs which steps' records they were. ``validation_due``: the checkpoint was written
    before the validation of ``step``, which the resume runs again: a dev record of ``step`` (logged
    before a kill) goes too."""
    return _drop_records_after(Path(run_dir), step, validation_due)[0]


def _drop_records_after(run_dir: Path, step: int, validation_due: bool) -> tuple[int, bool]:
    """:func:`drop_metrics_after`, and whether a dev record of ``step`` is kept: one read of the log."""
    redone: list[int] = []  # the steps of the records dropped
    validated = False

    def keep(record: dict) -> bool:
        nonlocal validated
        at = int(record["step"])
        dev = record.get("split") == "dev"
        kept = at < step or (at == step and not (validation_due and dev))
        if not kept:
            redone.append(at)
        validated |= kept and dev and at == step
        return kept

    dropped = keep_jsonl_records(run_dir / METRICS_FILE, keep)
    if redone:
        low, high = min(redone), max(redone)
        steps = f"step {low}" if low == high else f"steps {low}-{high}"
        _logger.info(
            "%d metrics record(s) of %s dropped (last.pt is at step %d): redone now", len(redone), steps, step
        )
    return dropped, validated


def resume_records(trainer: Trainer, run_dir: Path, dist: Distributed) -> None:
    """The records a resume from ``trainer``'s position goes on from, decided on rank 0 (whose
    ``metrics.jsonl`` it reads once): those of the steps it redoes dropped (:func:`drop_metrics_after`),
    and where the run's limit is reached at a step never validated, that step validated first (a signal
    stopped a session at a step that was no validation step then, and the resume ends the run there)."""
    owed = None
    if dist.is_main:
        _, validated = _drop_records_after(run_dir, trainer.step, trainer.validation_due)
        if not trainer.validation_due and not validated:
            owed = trainer.limits.reached_limit(trainer.epoch, trainer.step, trainer.train_seconds)
    (owes,) = dist.any(owed is not None)
    if owes:
        trainer.validation_due = True
        _logger.info(
            "%s is reached at step %d, which was never validated: validating it first", owed, trainer.step
        )


def nothing_to_do(run_dir: Path, cfg: RunConfig, state: dict[str, Any]) -> dict[str, Any] | None:
    """The run's summary when resuming it with ``cfg`` (the overrides applied) would only write it again: the
    run is finished (its limit reached at the step ``last.pt`` (``state``) is at, that step validated and no
    validation due), ``summary.json`` describes the checkpoint an evaluation would read (``best.pt``, else
    ``last.pt``, by its sha256) and this resume evaluates it with the settings of the session that wrote
    it (:func:`~patchword.train.sessions.evaluates_otherwise`). None: there is work to do."""
    epoch, step, seconds = int(state["epoch"]), int(state["step"]), float(state.get("train_seconds", 0.0))
    if state.get("validation_due") or RunLimits(cfg.train).reached_limit(epoch, step, seconds) is None:
        return None
    scored = run_dir / (BEST_CHECKPOINT if (run_dir / BEST_CHECKPOINT).is_file() else LAST_CHECKPOINT)
    try:
        summary = read_json(run_dir / SUMMARY_FILE, "run summary", default=None)
        if summary is None or summary.get("checkpoint") != scored.name or evaluates_otherwise(run_dir, cfg):
            return None  # (a run stopped before its end has no summary: its log is read once, by the resume)
        if not has_dev_record(run_dir, step):  # its last step is still to validate
            return None
        if summary.get(DIGEST_FIELD) != file_sha256(scored):
            return None
    except (PatchwordError, OSError):  # a damaged file: the resume goes on, and repairs or names it
        return None
    _logger.info(
        "%s is finished and its %s already describes %s as this resume would evaluate it: nothing to do "
        "(to evaluate it otherwise: `patchword eval %s` with eval.* overrides, or a --resume with other "
        "eval.* settings)",
        run_dir,
        SUMMARY_FILE,
        scored.name,
        run_dir,
    )
    return summary
