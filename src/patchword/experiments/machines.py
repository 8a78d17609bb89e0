"""Where a ``patchword report`` row's times were measured: the machine of each run's evaluation (its scoring
time and memory: the ``"cost"`` its record holds) and the machine of each of its training sessions (its
training time and steps/s: the ``"train_sessions"`` training records, one per session that trained a step,
see :class:`patchword.train.times.RunTimes`). A final evaluation runs with other threads than training
(``train.num_threads`` holds for the steps only), and a resumed run's sessions may run on other devices
or threads: neither is labelled with the other's machine, and a row whose runs (or sessions) differ reads
``MIXED``, its times never averaged as one machine's.

Functions take the report's rows (``patchword.experiments.entries.Entry``: ``summaries``, one record per
run, ``{}`` for none) without importing them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from patchword.errors import DataError
from patchword.experiments.fields import NUMBER, TEXT, check_fields
from patchword.experiments.rows import one_or_mixed_of

__all__ = [
    "SESSION_FIELDS",
    "check_sessions",
    "machine_of",
    "mixed_machines",
    "mixed_training",
    "run_machines",
    "train_machine_of",
]

#: The fields of a training session (``summary.json``'s ``train_sessions``) the report reads.
SESSION_FIELDS = {
    "device": TEXT,
    "device_name": TEXT,
    "threads": NUMBER,
    "world_size": NUMBER,
    "timed_steps": NUMBER,
}


def _machine(fields: Any) -> str:
    """A machine in words from a record's ``device``, ``device_name``, ``threads`` and ``world_size``: the
    device's name (a GPU's, or the CPU model), on a CPU the thread count, and the number of processes when
    several shared the work; "unknown" where it is not recorded (a file written before it was)."""
    if not isinstance(fields, dict) or not fields.get("device_name"):
        return "unknown"
    processes = fields.get("world_size") or 1
    several = f", {processes:g} processes" if processes > 1 else ""
    if str(fields.get("device", "cpu")).startswith("cpu"):
        threads = fields.get("threads", "?")
        shown = f"{threads:g}" if isinstance(threads, (int, float)) else str(threads)
        return f"{fields['device_name']}, {shown} thread{'' if threads == 1 else 's'}{several}"
    return str(fields["device_name"]) + several


def run_machines(entry) -> dict[str, int]:
    """Evaluation machine -> how many of the row's runs were evaluated on it."""
    return Counter(_machine(summary.get("cost")) for summary in entry.summaries)


def mixed_machines(entry) -> bool:
    """Whether the row's runs were evaluated on different machines (a recorded cost and none count as
    different): their times and memory are never averaged into one figure."""
    return len(run_machines(entry)) > 1


def machine_of(entry) -> str:
    """Where a row's evaluation times were measured (see :func:`_machine`; "unknown" for a row without
    runs); a row whose runs were evaluated on different machines: ``MIXED:`` and each machine with its run
    count."""
    return one_or_mixed_of(run_machines(entry), "unknown")


def check_sessions(record: dict[str, Any], where: str) -> None:
    """``record``'s ``train_sessions`` (when present) is a list of objects with :data:`SESSION_FIELDS`.

    Raises:
        DataError: naming ``where``, the session and the field.
    """

    for i, session in enumerate(record.get("train_sessions") or [], start=1):
        if not isinstance(session, dict):
            raise DataError(f"{where}: train_sessions item {i} is not an object")
        check_fields(session, SESSION_FIELDS, f"{where}: train_sessions item {i}")


def _train_machines(entry) -> dict[str, int]:
    """Training machine -> how many sessions of the row's runs trained on it: a record without
    ``train_sessions`` but with a training time (written before sessions were recorded) counts one unknown
    session, one without either (an imported checkpoint, a ``patchword eval`` record) none."""
    counts: Counter[str] = Counter()
    for summary in entry.summaries:
        sessions = summary.get("train_sessions")
        if not isinstance(sessions, list):
            sessions = [{}] if summary.get("train_seconds") is not None else []
        counts.update(_machine(session) for session in sessions)
    return counts


def mixed_training(entry) -> bool:
    """Whether the row's training sessions ran on different machines (threads, devices; a run resumed with
    ``train.num_threads=2``): its steps/s is a blend that describes none of them."""
    return len(_train_machines(entry)) > 1


def train_machine_of(entry) -> str:
    """Where the row's training ran (see :func:`_machine`): one machine, ``MIXED:`` and each machine with
    its session count, or "" for a row that records no training."""
    return one_or_mixed_of(_train_machines(entry), "", "session")
