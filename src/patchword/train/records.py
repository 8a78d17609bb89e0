"""The trainer's records: what a logged training step's and a dev evaluation's records hold, and where they
go (the trainer's history; from the process that writes the run directory, ``metrics.jsonl`` and the
trackers of ``train.report_to``)."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from patchword.data.pipeline import EncodedSplit
from patchword.fileio import append_line
from patchword.runs.config import RunConfig
from patchword.train.optimiser import Optimiser
from patchword.train.trackers import Tracker, open_trackers

__all__ = ["RecordLog", "dev_record", "fit_summary", "train_record"]


def train_record(
    step: int,
    epoch: int,
    losses: list[float],
    optim: Optimiser,
    grad_norm: float | None,
    skipped_steps: int,
    step_seconds: float,
    now: float,
) -> dict[str, Any]:
    """The record of training step ``step`` (counted from 1) of ``epoch``: ``losses`` [loss, align, ratio]
    of the global batch, the optimiser's learning rates, the gradient norm and skipped steps
    (:meth:`Optimiser.read_with` reads them with the losses in one copy), the step time per step since the
    previous record and the wall-clock time ``now``."""
    loss, align, ratio = losses
    return {
        "split": "train",
        "step": step,
        "epoch": epoch,  # the epoch the step belongs to (0-based), as in dev records
        # the loss and its weighted parts, which add up to it (ShardLoss.forward)
        "loss": loss,
        "align": align,
        "ratio": ratio,
        **optim.learning_rates(),  # lr, lr_<group name>
        "grad_norm": grad_norm,
        "skipped_steps": skipped_steps,
        "step_seconds": step_seconds,
        "time": now,
    }


def dev_record(
    metrics: dict[str, float], step: int, epoch: int, batch_in_epoch: int, now: float, dev: EncodedSplit
) -> dict[str, Any]:
    """The record of the dev evaluation after ``step`` steps; ``epoch`` and ``batch_in_epoch`` are the
    trainer's position after it, the record's epoch the one the validated step belongs to, as in training
    records (after an epoch's last step the position has moved on to the next). ``images`` and
    ``captions`` say what it scored: ``dev``, the first ``train.eval_max_images`` dev images when that
    cuts the split (its figures are not the whole dev split's, which ``patchword eval`` scores)."""
    epoch = epoch - 1 if batch_in_epoch == 0 and step > 0 else epoch
    scored = {"images": dev.num_images, "captions": dev.num_captions}
    return {"split": "dev", "step": step, "epoch": epoch, **scored, **metrics, "time": now}


def fit_summary(
    best_rsum: float,
    steps: int,
    epochs_done: int,
    skipped_steps: int,
    times: dict[str, float],
    dev_images: int,
) -> dict[str, Any]:
    """What a fit reports (``summary.json`` repeats it): the best dev rSum and the dev images it was
    measured on (``dev_images``: ``train.eval_max_images`` may cut the split), the steps and epochs done,
    the steps skipped and the training ``times`` (:meth:`~patchword.train.times.RunTimes.report`)."""
    validated = math.isfinite(best_rsum)
    return {
        # None before any validation (a resumed run that never validated): JSON has no -Infinity
        "best_dev_rsum": best_rsum if validated else None,
        "best_dev_images": dev_images if validated else None,
        "steps": steps,
        "epochs_done": epochs_done,
        "skipped_steps": skipped_steps,
        **times,
    }


class RecordLog:
    """Where the records go: :attr:`history` (every process's), and where ``writes`` (rank 0) the run's
    ``metrics.jsonl`` and the trackers, open while :meth:`tracking` runs."""

    def __init__(self, run_dir: Path, writes: bool) -> None:
        self.run_dir, self.writes = run_dir, writes
        self.history: list[dict[str, Any]] = []
        self.trackers: list[Tracker] = []

    @contextlib.contextmanager
    def tracking(self, cfg: RunConfig) -> Iterator[None]:
        """The trackers of ``train.report_to`` open during the block (closed after it, whatever happens)."""
        tc = cfg.train
        if self.writes and tc.report_to:
            self.trackers = open_trackers(
                list(tc.report_to),
                self.run_dir,
                asdict(cfg),
                wandb_project=tc.wandb_project,
                wandb_mode=tc.wandb_mode,
            )
        try:
            yield
        finally:
            for tracker in self.trackers:
                tracker.close()
            self.trackers = []

    def log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        if self.writes:
            append_line(self.run_dir / "metrics.jsonl", json.dumps(record))
            for tracker in self.trackers:
                tracker.log(record)
