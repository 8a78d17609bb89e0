"""The training times of a run over every session (a resume adds its own to those ``last.pt`` kept).

``train_seconds`` is the wall-clock time in :meth:`~patchword.train.trainer.Trainer.fit`; of it,
``step_time_seconds`` the training steps themselves (waiting for the batch, forward, backward, optimiser
step; not a loader's start-up at an epoch's start), ``validation_seconds`` the dev evaluations and
``checkpoint_seconds`` the writes of ``last.pt`` / ``best.pt``. ``train.time_budget_s`` counts
``train_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TIME_KEYS", "RunTimes"]

#: What :attr:`RunTimes.totals` adds up over every session (``last.pt`` keeps them as ``"times"``).
TIME_KEYS = ("steps", "timed_steps", "validation", "checkpoint")


class RunTimes:
    """The times of a run's sessions, read from ``clock`` (seconds, monotonic: ``time.perf_counter``).

    Attributes:
        before: ``train_seconds`` of the sessions before this one (from the checkpoint a resume loads).
        session_start: when this session's fit began (None: not yet).
        totals: seconds of every session in the training steps (``"steps"``, over ``"timed_steps"`` of
            them: a checkpoint of an older version records none of its steps), the validations and the
            checkpoint writes.
        step_begun: when the present step began waiting for its batch.
        saved: the times in the ``last.pt`` written last (None: none written in this session).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.before = 0.0
        self.session_start: float | None = None
        self.totals: dict[str, float] = dict.fromkeys(TIME_KEYS, 0.0)
        self.step_begun = clock()
        self.saved: dict[str, float] | None = None

    @property
    def train_seconds(self) -> float:
        """Seconds spent in ``fit`` over every session of the run (resumes add theirs)."""
        running = 0.0 if self.session_start is None else self.clock() - self.session_start
        return self.before + running

    def step_time(self) -> float:
        """Seconds in training steps over every session, the present step's so far included."""
        return self.totals["steps"] + (self.clock() - self.step_begun)

    def end_step(self) -> None:
        """The present step ends here (what follows it, a validation or a checkpoint, is not its time)."""
        self.totals["steps"] = self.step_time()
        self.totals["timed_steps"] += 1

    def report(self) -> dict[str, float]:
        """``train_seconds`` and its parts (the module docstring), every session's."""
        return {
            "train_seconds": self.train_seconds,
            "step_time_seconds": self.totals["steps"],
            "timed_steps": int(self.totals["timed_steps"]),
            "validation_seconds": self.totals["validation"],
            "checkpoint_seconds": self.totals["checkpoint"],
        }

    def load(self, state: dict[str, Any]) -> None:
        """The times of the sessions before this one, from a ``last.pt``'s ``state``."""
        # checkpoints written before train_seconds was kept hold none: their sessions count 0
        self.before = float(state.get("train_seconds", 0.0))
        # and those before the times were kept none (their steps are not timed steps)
        self.totals = {key: float(state.get("times", {}).get(key, 0.0)) for key in TIME_KEYS}
