"""What a training session says and decides about going on with its run, besides training it.

* How an interruption's message says to go on (:func:`train_hint`): ``patchword train --resume RUN`` with
  the session's own overrides (a resume that extended the run to ``train.epochs=8`` goes on with
  ``train.epochs=8``, not with config.yaml's limit), under ``torchrun`` as the launch it needs; the other
  ranks of a launch leave the command to rank 0's message.
* Whether the step ``last.pt`` is at still owes its validation although the run's limit is reached there
  (:func:`owed_validation`): a signal stopped the session at a step that was no validation step then, and
  the resume ends the run there (``train.max_steps`` at that step). A run's last step is always validated.
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
from patchword.fileio import file_sha256
from patchword.readers import read_json, read_json_lines
from patchword.runs.config import RunConfig
from patchword.runs.files import BEST_CHECKPOINT, LAST_CHECKPOINT, METRICS_FILE, SUMMARY_FILE
from patchword.runs.recorded import DIGEST_FIELD
from patchword.train.limits import RunLimits
from patchword.train.sessions import evaluates_otherwise

if TYPE_CHECKING:
    from patchword.train.trainer import Trainer

__all__ = ["has_dev_record", "nothing_to_do", "owe_last_validation", "owed_validation", "train_hint"]

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


def owed_validation(
    run_dir: Path, limits: RunLimits, epoch: int, step: int, train_seconds: float
) -> str | None:
    """The limit (``train.max_steps=51``) a run at ``step`` (``epoch``, ``train_seconds``: its position and
    training time, as ``last.pt`` holds them) has reached without a dev record of that step: the run ends
    there, and its last step is still to validate. None: a limit not reached, or the step validated."""
    limit = limits.reached_limit(epoch, step, train_seconds)
    return None if limit is None or has_dev_record(run_dir, step) else limit


def owe_last_validation(trainer: Trainer, run_dir: Path, dist: Distributed) -> None:
    """Where the limit of a resumed run is reached at a step never validated (:func:`owed_validation`: on
    rank 0, whose metrics.jsonl it reads), have ``trainer`` validate that step first and say so."""
    owed = None
    if dist.is_main and not trainer.validation_due:
        owed = owed_validation(run_dir, trainer.limits, trainer.epoch, trainer.step, trainer.train_seconds)
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
        if not has_dev_record(run_dir, step):  # its last step is still to validate
            return None
        summary = read_json(run_dir / SUMMARY_FILE, "run summary", default=None)
        if summary is None or summary.get("checkpoint") != scored.name or evaluates_otherwise(run_dir, cfg):
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
