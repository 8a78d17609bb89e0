"""The training times of a run over every session (a resume adds its own to those ``last.pt`` kept).

``train_seconds`` is the wall-clock time in :meth:`~patchword.train.trainer.Trainer.fit`; of it,
``step_time_seconds`` the training steps themselves (waiting for the batch, forward, backward, optimiser
step; not a loader's start-up at an epoch's start), ``validation_seconds`` the dev evaluations and
``checkpoint_seconds`` the writes of ``last.pt`` / ``best.pt``. ``train.time_budget_s`` counts
``train_seconds``. ``train_sessions`` lists where each session that trained a step ran (device, its name,
the threads its steps ran with, processes: :func:`~patchword.train.sessions.session_machine`) and how many
timed steps it took: the times add up sessions that may have run on different machines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SESSIONS", "TIME_KEYS", "RunTimes"]

#: What :attr:`RunTimes.totals` adds up over every session (``last.pt`` keeps them as ``"times"``).
TIME_KEYS = ("steps", "timed_steps", "validation", "checkpoint")
#: The entry of :attr:`RunTimes.totals` (so of ``last.pt``'s ``"times"``) listing the run's sessions.
SESSIONS = "sessions"


class RunTimes:
    """The times of a run's sessions, read from ``clock`` (seconds, monotonic: ``time.perf_counter``).

    Attributes:
        before: ``train_seconds`` of the sessions before this one (from the checkpoint a resume loads).
        session_start: when this session's fit began (None: not yet).
        totals: seconds of every session in the training steps (``"steps"``, over ``"timed_steps"`` of
            them: a checkpoint of an older version records none of its steps), the validations and the
            checkpoint writes; :data:`SESSIONS`: each session's machine and its ``timed_steps``.
        session: this session's entry of them (None: :meth:`begin_session` not called).
        step_begun: when the present step began waiting for its batch.
        saved: the times in the ``last.pt`` written last (None: none written in this session).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.before = 0.0
        self.session_start: float | None = None
        self.totals: dict[str, Any] = {**dict.fromkeys(TIME_KEYS, 0.0), SESSIONS: []}
        self.session: dict[str, Any] | None = None
        self.step_begun = clock()
        self.saved: dict[str, Any] | None = None

    @property
    def train_seconds(self) -> float:
        """Seconds spent in ``fit`` over every session of the run (resumes add theirs)."""
        running = 0.0 if self.session_start is None else self.clock() - self.session_start
        return self.before + running

    def step_time(self) -> float:
        """Seconds in training steps over every session, the present step's so far included."""
        return self.totals["steps"] + (self.clock() - self.step_begun)

    def begin_session(self, machine: dict[str, Any]) -> None:
        """This session trains on ``machine`` (:func:`~patchword.train.sessions.session_machine`): its
        steps are counted in an entry of its own, after those of the sessions before it."""
        self.session = {**machine, "timed_steps": 0}
        self.totals[SESSIONS].append(self.session)

    def end_step(self) -> None:
        """The present step ends here (what follows it, a validation or a checkpoint, is not its time)."""
        self.totals["steps"] = self.step_time()
        self.totals["timed_steps"] += 1
        if self.session is not None:
            self.session["timed_steps"] += 1

    def report(self) -> dict[str, Any]:
        """``train_seconds`` and its parts (the module docstring), every session's, and the sessions that
        trained (a resume of a finished run takes no step: it ran on no training machine)."""
        return {
            "train_seconds": self.train_seconds,
            "step_time_seconds": self.totals["steps"],
            "timed_steps": int(self.totals["timed_steps"]),
            "validation_seconds": self.totals["validation"],
            "checkpoint_seconds": self.totals["checkpoint"],
            "train_sessions": [dict(s) for s in self.totals[SESSIONS] if s.get("timed_steps") != 0],
        }

    def load(self, state: dict[str, Any]) -> None:
        """The times of the sessions before this one, from a ``last.pt``'s ``state``."""
        # checkpoints written before train_seconds was kept hold none: their sessions count 0
        self.before = float(state.get("train_seconds", 0.0))
        # and those before the times were kept none (their steps are not timed steps)
        times = state.get("times", {})
        self.totals = {key: float(times.get(key, 0.0)) for key in TIME_KEYS}
        earlier = times.get(SESSIONS)
        if not isinstance(earlier, list):  # an older version's: one session of unknown machine and steps
            earlier = [{"timed_steps": None}] if self.before > 0 else []
        kept = [dict(s) for s in earlier if isinstance(s, dict)]
        self.totals[SESSIONS] = [*kept, *([self.session] if self.session else [])]
