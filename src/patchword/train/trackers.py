"""Experiment trackers: what a run logs to ``metrics.jsonl`` also goes to TensorBoard and Weights & Biases.

``train.report_to`` lists the trackers (``tensorboard``, ``wandb``; none by default). Every record the
trainer logs (the training scalars of a logged step: loss and its parts, the learning rate of each
parameter group, the gradient norm, the skipped steps, the seconds per step; every dev evaluation) goes to
each tracker under ``<split>/<name>`` at its optimiser step, and the resolved run config is logged once
(TensorBoard: hparams text; W&B: the run config). Only the process that writes the run directory logs
(rank 0 under torchrun). A resumed run appends to the same tracker run: TensorBoard writes into
``RUN/tensorboard``, W&B resumes the run whose id is kept in ``RUN/wandb_id.txt`` (``mode``
``train.wandb_mode``: offline by default, so nothing leaves the machine unless asked).
"""

from __future__ import annotations

import json
import logging
import numbers
import uuid
from pathlib import Path
from typing import Any, Protocol

from patchword.errors import MissingExtraError

__all__ = ["Tracker", "open_trackers", "import_wandb", "TRACKERS"]

_logger = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "wandb")
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_id.txt"


class Tracker(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics record as ``<split>/<name>`` (``step``, ``time``, ``split`` aside)."""
    split = record.get("split", "train")
    return {
        f"{split}/{key}": float(value)
        for key, value in record.items()
        if key not in ("split", "step", "time")
        and isinstance(value, numbers.Real)
        and not isinstance(value, bool)
    }


class TensorBoardTracker:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MissingExtraError(
                "train.report_to=tensorboard needs tensorboard: pip install 'patchword[tensorboard]'"
            ) from None
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for key, value in _scalars(record).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def import_wandb():
    """The ``wandb`` module, or the error naming the extra that installs it."""
    try:
        import wandb
    except ImportError:
        raise MissingExtraError("train.report_to=wandb needs wandb: pip install 'patchword[wandb]'") from None
    return wandb


class WandbTracker:
    def __init__(self, run_dir: Path, config: dict[str, Any], project: str, mode: str) -> None:
        wandb = import_wandb()
        id_file = run_dir / WANDB_ID_FILE
        if not id_file.is_file():
            from patchword.fileio import atomic_write_text

            atomic_write_text(id_file, uuid.uuid4().hex[:16])
        run_id = id_file.read_text().strip()
        self.run = wandb.init(
            project=project,
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=mode,
            config=config,
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(_scalars(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


def open_trackers(
    names: list[str], run_dir: Path, config: dict[str, Any], *, wandb_project: str, wandb_mode: str
) -> list[Tracker]:
    """The trackers ``names`` asks for (of :data:`TRACKERS`), opened on ``run_dir``."""
    trackers: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir, config))
        elif name == "wandb":
            trackers.append(WandbTracker(run_dir, config, wandb_project, wandb_mode))
        _logger.info("logging to %s", name)
    return trackers
