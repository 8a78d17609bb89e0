"""A new run's warm start (``train.init_from``) and its record, written when training starts.

The record is the first line of the run's ``metrics.jsonl`` (its ``split``:
:data:`~patchword.runs.origins.WARM_START_SPLIT`): the file's absolute path, its sha256 and per part of the
model how many tensors it supplied. The model card reads it
(:func:`~patchword.runs.origins.recorded_warm_start`) instead of counting against a file that may be gone,
or relative to another working directory, by then; a resume keeps it (its step is 0) and every
``summary.json`` repeats it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from patchword.checkpoint import warm_start, weights_file
from patchword.fileio import append_line, file_sha256
from patchword.runs.files import METRICS_FILE
from patchword.runs.origins import WARM_START_SPLIT, part_counts

__all__ = ["warm_start_run", "write_warm_start"]


def warm_start_run(model: torch.nn.Module, init_from: str) -> dict[str, Any]:
    """``warm_start(model, init_from)`` and its record: ``{"step": 0, "split": "warm_start", "init_from":
    absolute path, "tensors": {part: [loaded, total]}}`` (the model's tensors per state-dict prefix)."""
    report = warm_start(model, init_from)
    return {
        "step": 0,
        "split": WARM_START_SPLIT,
        "init_from": str(Path(init_from).absolute()),
        "tensors": part_counts(model.state_dict(), set(report["loaded"])),
    }


def write_warm_start(run_dir: Path, record: dict[str, Any]) -> None:
    """Append ``record`` with the sha256 of the weights file it names (None when it cannot be read now) to
    ``run_dir/metrics.jsonl``, before any step's record (rank 0; the file was just read in full once)."""
    try:
        digest: str | None = file_sha256(weights_file(record["init_from"]))
    except OSError:  # read a moment ago; gone or unreadable now: the counts still stand
        digest = None
    append_line(run_dir / METRICS_FILE, json.dumps({**record, "sha256": digest}))
