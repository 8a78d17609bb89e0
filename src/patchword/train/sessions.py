"""What one training session of a run (its start, or a ``--resume``) records for the sessions after it: the
machine it trains on (counted with the run's times in ``last.pt``: :class:`~patchword.train.times.RunTimes`,
listed as ``train_sessions`` in ``summary.json``), and, on a resume, the results of the session before it
set aside as ``*.previous.json`` where the resume writes others over them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from patchword.config import config_diff
from patchword.device import describe_device
from patchword.runs.config import RunConfig
from patchword.runs.files import METRICS_JSON, SUMMARY_FILE
from patchword.runs.load import last_session_config
from patchword.runs.recorded import NEUTRAL_OVERRIDES

__all__ = ["evaluates_otherwise", "session_machine", "set_aside_results"]


def session_machine(device: torch.device | str, threads: int, world_size: int) -> dict[str, Any]:
    """Where a session trains: ``device``, ``device_name`` (the GPU's name, or the CPU model:
    :func:`~patchword.device.describe_device`), ``threads`` (``train.num_threads``, the intra-op threads its
    steps run with; 0: torch's setting, which they keep) and ``world_size`` (the processes)."""
    described = describe_device(device)
    return {
        "device": described["device"],
        "device_name": described["device_name"],
        "threads": threads or described["threads"],
        "world_size": world_size,
    }


def set_aside_results(run_dir: Path) -> None:
    """Rename summary.json and metrics.json to ``*.previous.json``: a resume that trains further does so
    before it trains (until it writes them again they would describe a run that has moved on: ``patchword
    report`` would show them, a sweep would take the run for finished), and one that evaluates the run
    otherwise before it writes its own (the earlier evaluation is kept, as a sweep keeps a suite file)."""
    for name in (SUMMARY_FILE, METRICS_JSON):
        path = run_dir / name
        if path.is_file():
            os.replace(path, path.with_suffix(".previous.json"))


def evaluates_otherwise(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether a resume of the finished run ``run_dir`` with ``cfg`` (its overrides applied) evaluates it
    with other settings than the session that wrote its results (``config.yaml`` with the overrides of the
    last resume in ``resumes.jsonl``: call it before this resume is recorded there): a setting differs
    besides those that change no figure (:data:`~patchword.runs.recorded.NEUTRAL_OVERRIDES`)."""
    return any(k not in NEUTRAL_OVERRIDES for k in config_diff(last_session_config(run_dir), cfg))
