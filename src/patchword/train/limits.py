"""When a run validates, saves ``last.pt`` and stops (the train section of its config).

Validation follows every ``train.eval_every``-th step, each epoch's last step and the run's last step,
once per step; ``last.pt`` is written after every validation and every ``train.checkpoint_every`` steps.
A run stops after ``train.epochs``, ``train.max_steps`` or ``train.time_budget_s``: the time budget counts
the training time of every session of the run (wall-clock, validation and checkpoints included) and is
checked after each step, so a new run always trains at least one step (and validates and saves it).
"""

from __future__ import annotations

from patchword.runs.config import TrainConfig

__all__ = ["RunLimits"]


class RunLimits:
    """What ``tc`` says about a run's length and its validations and checkpoints."""

    def __init__(self, tc: TrainConfig) -> None:
        self.tc = tc

    def reached(self, epoch: int, step: int, train_seconds: float) -> bool:
        """The epochs, ``max_steps`` or the time budget (``train_seconds``: every session's) are spent."""
        tc = self.tc
        return bool(
            epoch >= tc.epochs
            or (tc.max_steps and step >= tc.max_steps)
            or (tc.time_budget_s and train_seconds >= tc.time_budget_s)
        )

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
