"""What training records and prints: step times without validation or checkpoints, the loss parts that add
up to the loss, one meaning of ``epoch``, skipped steps under amp_fp16, the checkpoint the test figures
describe, a time budget spent before the first step, strict JSON and the resume's log line.

Tiny synthetic runs (100 captions in batches of 16: 7 steps per epoch), one thread, in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import shutil
import types
from pathlib import Path

import pytest

from conftest import TINY_RUN_32
from patchword.checkpoint import atomic_save, load_checkpoint
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.losses import HingeLoss
from patchword.runs.config import RunConfig
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _overrides(root: Path, name: str, *extra: str) -> list[str]:
    return [*TINY_RUN_32, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}", *extra]


def _config(root: Path, name: str, *extra: str) -> RunConfig:
    return apply_overrides(RunConfig(), _overrides(root, name, *extra))


def _records(run: Path, split: str | None = None) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if split is None or r["split"] == split]


def _strict(text: str):
    """``text`` parsed as strict JSON: -Infinity / NaN refused."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def printed_run(tmp_path_factory):
    """A 9-step run through the CLI (validations at 4, 7 = the first epoch's end, 8 and 9): its run
    directory and what it printed."""
    root = tmp_path_factory.mktemp("records")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", *_overrides(root, "run", "train.max_steps=9", "train.eval_every=4")]) == 0
    return root / "run", json.loads(out.getvalue())


def test_the_summary_and_stdout_name_the_checkpoint_the_test_figures_describe(printed_run):
    """Defect: summary.json and the training stdout did not say which checkpoint (best.pt / last.pt) the
    test figures describe, nor its step; eval_*.json do."""
    run, printed = printed_run
    summary = json.loads((run / "summary.json").read_text())
    best = load_checkpoint(run / "best.pt")
    dev = _records(run, "dev")
    assert summary["checkpoint"] == printed["checkpoint"] == "best.pt"
    assert summary["checkpoint_step"] == printed["checkpoint_step"] == best["step"]
    assert best["step"] == next(r["step"] for r in dev if r["rsum"] == max(d["rsum"] for d in dev))


def test_the_logged_loss_parts_add_up_to_the_loss(printed_run):
    """Defect: ``align`` was the warm-up-weighted term and ``ratio`` the unweighted one: with
    train.ratio_weight=2 the loss was align + 2 * ratio."""
    run, _ = printed_run
    train = _records(run, "train")
    assert len(train) == 9
    for record in train:
        assert record["loss"] == pytest.approx(record["align"] + record["ratio"], rel=1e-6, abs=1e-6)
    assert train[0]["ratio"] == pytest.approx(0.5)  # the constant 0.25 of seps-tiny-32, weighted by 2


def test_epoch_is_the_epoch_a_step_belongs_to_in_train_and_dev_records(printed_run):
    """Defect: a dev record's epoch counted the epochs completed (step 7, the first epoch's last step:
    epoch 1) while the training record of the same step said epoch 0."""
    run, _ = printed_run
    train = {r["step"]: r["epoch"] for r in _records(run, "train")}
    assert train == {**dict.fromkeys(range(1, 8), 0), 8: 1, 9: 1}
    assert [(r["step"], r["epoch"]) for r in _records(run, "dev")] == [(4, 0), (7, 0), (8, 1), (9, 1)]
    assert json.loads((run / "summary.json").read_text())["epochs_done"] == 1  # completed epochs


@pytest.fixture
def clock(monkeypatch):
    """The trainer's clock, advanced by hand: 1 s per training step, 100 s per validation, 10 s per
    checkpoint write and 50 s per loader start-up (before its first batch)."""
    now = {"t": 1000.0}
    monkeypatch.setattr(
        trainer_module, "time", types.SimpleNamespace(perf_counter=lambda: now["t"], time=lambda: 0.0)
    )

    def advancing(method, seconds):
        def wrapper(*args, **kwargs):
            now["t"] += seconds
            return method(*args, **kwargs)

        return wrapper

    trainer = trainer_module.Trainer
    monkeypatch.setattr(trainer, "_train_step", advancing(trainer._train_step, 1.0))
    monkeypatch.setattr(trainer_module, "evaluate", advancing(trainer_module.evaluate, 100.0))
    monkeypatch.setattr(trainer_module, "atomic_save", advancing(trainer_module.atomic_save, 10.0))
    original_loader = trainer._loader

    def slow_start(self, batches):
        now["t"] += 50.0
        yield from original_loader(self, batches)

    monkeypatch.setattr(trainer, "_loader", slow_start)
    return now


def test_step_times_leave_out_validation_checkpoints_and_loader_start_ups(tmp_path, clock):
    """Defect: step_seconds, train_seconds and train_steps_per_s counted the validations, checkpoint writes
    and loader start-ups between the steps: the record after a validation said 101+ s per step."""
    summary = train_run(_config(tmp_path, "timed", "train.max_steps=9", "train.eval_every=3"))
    train = _records(tmp_path / "timed", "train")
    assert [r["step_seconds"] for r in train] == [1.0] * 9
    # validations at 3, 6, 7 (the epoch's end) and 9; best.pt writes at each improvement
    assert summary["step_time_seconds"] == 9.0 and summary["train_steps_per_s"] == 1.0
    assert summary["validation_seconds"] == 400.0
    assert summary["checkpoint_seconds"] % 10.0 == 0 and summary["checkpoint_seconds"] >= 40.0
    # the wall-clock time: steps, validations, checkpoints (all but the last.pt the figures are saved in)
    # and the two loader start-ups
    assert summary["train_seconds"] == 9.0 + 400.0 + summary["checkpoint_seconds"] + 100.0
    assert load_checkpoint(tmp_path / "timed" / "last.pt")["train_seconds"] == summary["train_seconds"]


def _nan_at_step(monkeypatch, step: int) -> None:
    """The alignment loss of training step ``step`` (counted from 1) is NaN."""
    calls = {"n": 0}
    original = HingeLoss.forward

    def nan_once(self, *args, **kwargs):
        calls["n"] += 1
        out = original(self, *args, **kwargs)
        return out * float("nan") if calls["n"] == step else out

    monkeypatch.setattr(HingeLoss, "forward", nan_once)


@pytest.mark.parametrize("precision", ["fp32", "amp_fp16"])
def test_a_non_finite_loss_is_logged_and_warned_of_at_the_same_step(tmp_path, monkeypatch, caplog, precision):
    """Defects: the warning named step N-1 for the record of step N; under amp_fp16 the record of a
    logging step with a non-finite loss was never written (fp32 logs it with NaN)."""
    _nan_at_step(monkeypatch, 2)
    caplog.set_level(logging.WARNING, logger="patchword.train.trainer")
    summary = train_run(_config(tmp_path, "nan", "train.max_steps=3", f"precision={precision}"))
    train = _records(tmp_path / "nan", "train")
    assert [r["step"] for r in train] == [1, 2, 3]
    assert math.isnan(train[1]["loss"]) and all(math.isfinite(r["loss"]) for r in (train[0], train[2]))
    warned = [r.getMessage() for r in caplog.records if "non-finite loss" in r.getMessage()]
    assert warned == [f"non-finite loss at step 2: step skipped ({train[1]['skipped_steps']} so far)"]
    assert summary["skipped_steps"] == train[-1]["skipped_steps"] >= 1


def test_steps_the_fp16_gradient_scaler_skips_are_counted(tmp_path):
    """Defect: under amp_fp16 the steps GradScaler skipped for inf / NaN gradients (its first steps, while
    the scale backs off from 65536) were not counted in skipped_steps. Clipped, the gradient norm of such
    a step is not finite."""
    summary = train_run(_config(tmp_path, "fp16", "train.max_steps=4", "precision=amp_fp16"))
    train = _records(tmp_path / "fp16", "train")
    counted = 0
    for record in train:
        counted += not math.isfinite(record["grad_norm"])
        assert record["skipped_steps"] == counted, record
    assert counted >= 1 and summary["skipped_steps"] == counted


def test_a_time_budget_spent_before_the_first_step_still_trains_one_and_can_resume(tmp_path):
    """Defect: train.time_budget_s=0.000001 exited 0 with 0 steps, the test metrics of untrained weights,
    ``"best_dev_rsum": -Infinity`` (not JSON), no best.pt / last.pt, and a resume hint that failed."""
    run = tmp_path / "budget"
    summary = train_run(_config(tmp_path, "budget", "train.time_budget_s=0.000001"))
    assert summary["steps"] == 1 and summary["checkpoint"] == "best.pt" and summary["checkpoint_step"] == 1
    assert (run / "best.pt").is_file() and load_checkpoint(run / "last.pt")["step"] == 1
    assert _strict((run / "summary.json").read_text())["best_dev_rsum"] == summary["best_dev_rsum"]
    resumed = resume_run(run, ["train.time_budget_s=0", "train.max_steps=3"])
    assert resumed["steps"] == 3 and [r["step"] for r in _records(run, "train")] == [1, 2, 3]


def test_a_summary_without_any_validation_is_strict_json(tmp_path):
    """Defect: a run whose last.pt holds no validation (best dev rSum -inf) wrote
    ``"best_dev_rsum": -Infinity`` into summary.json."""
    run = tmp_path / "never"
    train_run(_config(tmp_path, "never", "train.max_steps=2"))
    state = load_checkpoint(run / "last.pt")
    state["best_rsum"] = -math.inf
    atomic_save(state, run / "last.pt")
    (run / "best.pt").unlink()
    summary = resume_run(run)  # finished already: evaluated again, nothing trained
    written = _strict((run / "summary.json").read_text())
    assert written["best_dev_rsum"] is None and summary["best_dev_rsum"] is None
    assert written["checkpoint"] == "last.pt" and written["checkpoint_step"] == 2


def test_the_resume_says_which_steps_it_redoes(tmp_path, caplog):
    """Defect: the log said "3 metrics records of step 2 on dropped" for the records of steps 3-4."""
    run = tmp_path / "redo"
    train_run(_config(tmp_path, "redo", "train.max_steps=2"))
    shutil.copy(run / "last.pt", tmp_path / "step2.pt")
    resume_run(run, ["train.max_steps=4"])
    shutil.copy(tmp_path / "step2.pt", run / "last.pt")  # back to step 2: steps 3 and 4 are redone
    caplog.set_level(logging.INFO, logger="patchword.train.runner")
    resume_run(run, ["train.max_steps=4"])
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert said == ["3 metrics record(s) of steps 3-4 dropped (last.pt is at step 2): redone now"]
    assert [(r["split"], r["step"]) for r in _records(run)] == [
        ("train", 1),
        ("train", 2),
        ("dev", 2),
        ("train", 3),
        ("train", 4),
        ("dev", 4),
    ]
