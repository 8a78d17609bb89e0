"""A training run reads what it wrote once: the final evaluation hashes ``best.pt`` once (the checkpoint
rank 0 picks carries its SHA-256 into ``summary.json``; rank 0 hashed it twice under torchrun), and a
validation averages the processes' BatchNorm statistics once (its ``last.pt`` save averaged them again)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY_RUN_32
from patchword.config import apply_overrides
from patchword.distributed import Distributed
from patchword.fileio import file_sha256
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_run_hashes_best_pt_once_and_averages_batch_norm_once_a_validation(tmp_path, monkeypatch):
    """Defect: two averages a validation (before the evaluation, then in save_last); under torchrun, two
    hashes of best.pt on rank 0 (checkpoint_to_evaluate's, then the summary's)."""
    from patchword.train import agreement, runner, trainer

    events: list[str] = []
    averaged, evaluate = trainer.average_batch_norm_statistics, trainer.evaluate
    monkeypatch.setattr(
        trainer, "average_batch_norm_statistics", lambda *a: events.append("average") or averaged(*a)
    )
    monkeypatch.setattr(trainer, "evaluate", lambda *a, **k: events.append("validate") or evaluate(*a, **k))
    hashed = []
    for module in (agreement, runner):
        monkeypatch.setattr(module, "file_sha256", lambda path: hashed.append(path.name) or file_sha256(path))
    args = [*TINY_RUN_32, "train.max_steps=4", "train.eval_every=2", f"data.cache_dir={tmp_path / 'cache'}"]
    cfg = apply_overrides(RunConfig(), [*args, f"output_dir={tmp_path}", "name=r"])
    runner.train_run(cfg)
    assert events == ["average", "validate"] * 2  # validated at steps 2 and 4, each saved in last.pt
    assert hashed == ["best.pt"]
    run = tmp_path / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["checkpoint"] == "best.pt"
    assert summary["checkpoint_sha256"] == file_sha256(run / "best.pt")
    # the checkpoint to evaluate carries the digest rank 0 read (one process: its own)
    path, state, digest = agreement.checkpoint_to_evaluate(run, Distributed())
    assert (path.name, state["step"], digest) == ("best.pt", summary["checkpoint_step"], file_sha256(path))
