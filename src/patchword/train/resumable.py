"""What ``patchword train --resume RUN`` continues: the training state in the run's ``last.pt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchword.checkpoint import load_checkpoint
from patchword.errors import ConfigError, MissingFileError
from patchword.runs.files import BEST_CHECKPOINT, LAST_CHECKPOINT

__all__ = ["resumable_state"]


def resumable_state(run_dir: Path) -> dict[str, Any]:
    """``run_dir``'s last.pt, loaded on the CPU, when it holds a training to continue.

    Raises:
        MissingFileError: no last.pt (the run stopped before its first checkpoint, or only best.pt is
            left: each named as such).
        ConfigError: a last.pt of weights alone (``patchword import`` writes one: no optimiser state, no step
            ever trained), naming how to fine-tune them instead.
        DataError: a damaged last.pt (:func:`~patchword.checkpoint.load_checkpoint`).
    """
    last = run_dir / LAST_CHECKPOINT
    if not last.is_file() and (run_dir / BEST_CHECKPOINT).is_file():
        # not "stopped before its first checkpoint": rerunning the command that started it is refused too
        raise MissingFileError(
            f"{run_dir} has best.pt but no last.pt to resume from (removed, or a run killed while it wrote "
            f"its first last.pt): nothing to continue; evaluate its weights with `patchword eval {run_dir}`, "
            f"fine-tune them in a new run with train.init_from={run_dir / BEST_CHECKPOINT}, or train anew "
            "under another name="
        )
    if not last.is_file():
        raise MissingFileError(
            f"{run_dir} has no last.pt to resume from (it stopped before its first checkpoint): nothing "
            "to continue; run the command that started it again (it starts the run anew)"
        )
    state = load_checkpoint(last, map_location="cpu")
    if "optimizer" not in state:
        raise ConfigError(
            "--resume",
            f"{run_dir} holds imported weights, not a training to continue: fine-tune them in a new run "
            f"with train.init_from={run_dir / BEST_CHECKPOINT}",
        )
    return state
