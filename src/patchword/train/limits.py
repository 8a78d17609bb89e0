"""When a run validates, saves ``last.pt`` and stops (the train section of its config).

Validation follows every ``train.eval_every``-th step, each epoch's last step and the run's last step,
once per step; ``last.pt`` is written after every validation and every ``train.checkpoint_every`` steps.
A run stops after ``train.epochs``, ``train.max_steps`` or ``train.time_budget_s``: the time budget counts
the training time of every session of the run (wall-clock, validation and checkpoints included) and is
checked after each step, so a new run always trains at least one step (and validates and saves it).
A resume never moves a run back: ``train.epochs`` or ``train.max_steps`` below where ``last.pt`` is
is refused (:func:`refuse_limits_behind`); one exactly there continues a finished run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchword.errors import ConfigError
from patchword.runs.config import TrainConfig
from patchword.runs.files import LAST_CHECKPOINT

__all__ = ["RunLimits", "refuse_limits_behind"]


class RunLimits:
    """What ``tc`` says about a run's length and its validations and checkpoints."""

    def __init__(self, tc: TrainConfig) -> None:
        self.tc = tc

    def reached(self, epoch: int, step: int, train_seconds: float) -> bool:
        """The epochs, ``max_steps`` or the time budget (``train_seconds``: every session's) are spent."""
        return self.reached_limit(epoch, step, train_seconds) is not None

    def reached_limit(self, epoch: int, step: int, train_seconds: float) -> str | None:
        """The limit that :meth:`reached` finds spent, as ``key=value`` (``train.max_steps=40``), or None."""
        tc = self.tc
        if epoch >= tc.epochs:
            return f"train.epochs={tc.epochs}"
        if tc.max_steps and step >= tc.max_steps:
            return f"train.max_steps={tc.max_steps}"
        if tc.time_budget_s and train_seconds >= tc.time_budget_s:
            return f"train.time_budget_s={tc.time_budget_s:g}"
        return None

    def budget_stopped(self, epoch: int, step: int, train_seconds: float) -> bool:
        """The time budget is spent and neither the epochs nor ``max_steps`` are."""
        tc = self.tc
        other_limit = epoch >= tc.epochs or (tc.max_steps and step >= tc.max_steps)
        return bool(tc.time_budget_s and train_seconds >= tc.time_budget_s and not other_limit)

    def planned_steps(self, batches_per_epoch: int) -> int:
        """The steps ``epochs`` and ``max_steps`` allow (a time budget may end the run sooner)."""
        steps = self.tc.epochs * batches_per_epoch
        return min(steps, self.tc.max_steps) if self.tc.max_steps else steps

    def validates(self, step: int, epoch_end: bool, stop: bool) -> bool:
        """Whether step ``step`` (counted from 1), an epoch's last (``epoch_end``) or the run's last
        (``stop``), is validated."""
        return epoch_end or stop or bool(self.tc.eval_every and step % self.tc.eval_every == 0)

    def saves(self, step: int) -> bool:
        """Whether ``last.pt`` is written after step ``step`` (a validated step saves anyway)."""
        return bool(self.tc.checkpoint_every and step % self.tc.checkpoint_every == 0)


def refuse_limits_behind(tc: TrainConfig, state: dict[str, Any], run_dir: Path) -> None:
    """A resume to ``train.epochs`` / ``train.max_steps`` that ``last.pt`` (``state``) is already past would
    train nothing, validate nothing (the step it is at may never have been validated: a signal stopped the
    session that passed the limit) and report a run longer than its limit says: refused before anything is
    written. A limit exactly at the checkpoint continues a finished run (:func:`~patchword.train.runner.
    resume_run` validates its last step if that is still owed); the time budget is never behind (it is
    checked after each step, so every run overshoots it).

    Raises:
        ConfigError: naming the key, its value and the step ``last.pt`` is at.
    """
    step, epoch, batches = int(state["step"]), int(state["epoch"]), int(state.get("batch_in_epoch", 0))
    last = run_dir / LAST_CHECKPOINT
    evaluate = f"or evaluate it as it is with `patchword eval {run_dir}`"
    if tc.max_steps and tc.max_steps < step:
        raise ConfigError(
            "train.max_steps",
            f"{tc.max_steps} is below step {step}, where {last} is: a resume trains up to train.max_steps, "
            f"so it would train nothing; give train.max_steps={step} or more (0: no step limit), {evaluate}",
        )
    if tc.epochs < epoch or (tc.epochs == epoch and batches):
        trained = f"{epoch} epoch(s)" + (f" and {batches} batch(es) of epoch {epoch + 1}" if batches else "")
        least = epoch + (1 if batches else 0)
        raise ConfigError(
            "train.epochs",
            f"{tc.epochs} but {last} is at step {step}, after {trained}: a resume trains up to train.epochs, "
            f"so it would train nothing; give train.epochs={least} or more, {evaluate}",
        )
