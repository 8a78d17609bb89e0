"""The life of a ``patchword hash train`` run directory: stopped by SIGTERM / SIGINT (last.pt written, exit
128 + signal, a resume equal to the uninterrupted run), never written into by a new run, locked while it
trains, removed when a start fails before its first checkpoint and started again when one was killed before
it, cleared of what killed writes left, its training time counted over every session, progress logged per
epoch, and evaluations that say which checkpoint they describe."""

from __future__ import annotations

import json
import logging
import re
import signal
import types
from pathlib import Path

import pytest
import torch

import patchword.hashing.trainer as trainer_module
from conftest import TINY_HASH, one_error_line
from patchword.checkpoint import load_checkpoint
from patchword.cli.hash import main
from patchword.locks import exclusive_lock
from patchword.runs.claim import RunKind

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS_PER_EPOCH = 2  # TINY_HASH: 64 training pairs in batches of 32


@pytest.fixture
def clock(monkeypatch):
    """The trainer's clock advances one second per step and stands still otherwise, so training times
    are exact and an interrupted run's equal an uninterrupted one's."""
    now = {"t": 0.0}
    original = trainer_module.HashTrainer._loss

    def timed_loss(self, idx):
        now["t"] += 1.0
        return original(self, idx)

    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(perf_counter=lambda: now["t"]))
    monkeypatch.setattr(trainer_module.HashTrainer, "_loss", timed_loss)
    return now


def _signal_during_step(monkeypatch, step: int, signum: int) -> dict:
    """``signum`` arrives during step ``step`` (1-based, counted from now): while its loss is computed.
    Returns the trigger; ``trigger["step"] = None`` disarms it. Never lets a signal's default action hit
    pytest: the code under test must have its own handler installed."""
    original = trainer_module.HashTrainer._loss
    trigger = {"step": step, "calls": 0}

    def loss_then_signal(self, idx):
        trigger["calls"] += 1
        out = original(self, idx)
        if trigger["calls"] == trigger["step"]:
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                raise AssertionError(f"{signal.Signals(signum).name} has its default action during training")
            signal.raise_signal(signum)
        return out

    monkeypatch.setattr(trainer_module.HashTrainer, "_loss", loss_then_signal)
    return trigger


def _train(out: Path, name: str, *extra: str) -> int:
    return main(["train", "--bits", "16", "--output-dir", str(out), "--name", name, *TINY_HASH, *extra])


def _records(run: Path, split: str = "train") -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def _assert_same_run(full: Path, run: Path) -> None:
    a, b = load_checkpoint(full / "last.pt"), load_checkpoint(run / "last.pt")
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"])
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for index, moments in a["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), (index, key)
    assert _records(run) == _records(full)  # losses and elapsed_s (the clock counts steps) alike
    assert (run / "eval.json").read_text() == (full / "eval.json").read_text()


@pytest.mark.parametrize(
    ("step", "signum"),
    [(3, signal.SIGTERM), (4, signal.SIGTERM), (5, signal.SIGINT)],
    ids=["sigterm-mid-epoch", "sigterm-epoch-end", "sigint-mid-epoch"],
)
def test_a_signal_saves_last_pt_and_the_resume_equals_the_uninterrupted_run(
    tmp_path, capsys, monkeypatch, clock, step, signum
):
    """Defect: SIGTERM killed `hash train` on the spot (exit 143, no message) with only config.yaml and
    metrics.jsonl behind (save_every=1000: no last.pt), and `--resume` said there was no last.pt."""
    out = tmp_path / "runs"
    assert _train(out, "full", "--epochs", "4", "train.save_every=1000") == 0
    trigger = _signal_during_step(monkeypatch, step, signum)
    capsys.readouterr()
    assert _train(out, "cut", "--epochs", "4", "train.save_every=1000") == 128 + signum
    cut = out / "cut"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    name = signal.Signals(signum).name
    assert line.startswith(f"interrupted: {name} received: stopped at step {step} (")
    assert line.endswith(f"continue with `patchword hash train --resume {cut}`")
    assert load_checkpoint(cut / "last.pt")["step"] == step
    assert not (cut / "eval.json").exists()

    # the evaluation of the stopped run says which weights it describes
    assert main(["eval", str(cut)]) == 0
    checkpoint = json.loads(capsys.readouterr().out)["checkpoint"]
    assert checkpoint == {
        "file": "last.pt",
        "epoch": step // STEPS_PER_EPOCH,
        "step": step,
        "finished": False,
    }

    trigger["step"] = None
    assert main(["train", "--resume", str(cut)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_seconds"] == 8.0 and summary["session_train_seconds"] == 8.0 - step
    _assert_same_run(out / "full", cut)


def test_train_seconds_count_every_session_and_say_which(tmp_path, capsys, clock):
    """Defect: after a resume, the summary's train_seconds and the records' elapsed_s counted the last
    session only (60 epochs uninterrupted: 3.33 s; 58 + a resume to 60: 0.13 s)."""
    out = tmp_path / "runs"
    assert _train(out, "full", "--epochs", "4") == 0
    assert json.loads(capsys.readouterr().out)["train_seconds"] == 8.0
    assert _train(out, "cut", "--epochs", "2", "train.save_every=1") == 0
    saved = load_checkpoint(out / "cut" / "last.pt").get("train_seconds")
    capsys.readouterr()
    assert main(["train", "--resume", str(out / "cut"), "--epochs", "4"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["train_seconds"] == 8.0  # every session (was 4.0: this one)
    assert [r["elapsed_s"] for r in _records(out / "cut")] == [2.0, 4.0, 6.0, 8.0]  # was [2, 4, 2, 4]
    assert resumed["session_train_seconds"] == 4.0  # this one, labelled so
    assert saved == 4.0  # what the resume added its time to
    assert load_checkpoint(out / "cut" / "last.pt")["train_seconds"] == 8.0
    assert _records(out / "cut") == _records(out / "full")


def test_a_new_run_never_writes_into_a_directory_that_holds_one(tmp_path, capsys):
    """Defect: a fresh `hash train` into a killed run's directory (config.yaml + metrics.jsonl, no last.pt)
    rewrote config.yaml and appended a second run's records to metrics.jsonl. What a start writes before its
    first checkpoint is removed now (below); anything more stops the start, untouched."""
    out = tmp_path / "runs"
    assert _train(out, "r", "--epochs", "1") == 0
    run = out / "r"
    for name in ("last.pt", "model.safetensors", "config.json", "eval.json"):
        (run / name).unlink()  # what a kill before the first checkpoint leaves: config.yaml, metrics.jsonl
    (run / "notes.txt").write_text("not the run's")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    assert _train(out, "r", "--epochs", "2") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {run} already holds a run that stopped before its first checkpoint")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before

    assert _train(out, "done", "--epochs", "1") == 0
    capsys.readouterr()
    assert _train(out, "done", "--epochs", "1") == 2
    assert f"continue it with `patchword hash train --resume {out / 'done'}`" in one_error_line(
        capsys.readouterr().err
    )


class Killed(BaseException):
    """What ``kill -9`` does to the process at the point it is raised: nothing after it runs."""


def test_a_start_killed_before_its_first_checkpoint_is_started_again(tmp_path, capsys, monkeypatch, caplog):
    """Defect: a start killed outright (the OOM killer: no cleanup) during its first checkpoint write left
    config.yaml, metrics.jsonl and the checkpoint's temporary file; the same command was then refused
    ("nothing to --resume; remove it") and --resume found no last.pt."""

    def kill_while_saving(state, path):
        Path(path).parent.joinpath(f".{Path(path).name}.k3j9x1ab.tmp").write_bytes(b"half a checkpoint")
        raise Killed

    out, run = tmp_path / "runs", tmp_path / "runs" / "r"
    with monkeypatch.context() as patched:
        patched.setattr(trainer_module, "atomic_save", kill_while_saving)
        patched.setattr(RunKind, "remove_failed_start", lambda *args: None)  # what a kill never reaches
        with pytest.raises(Killed):
            _train(out, "r", "--epochs", "2", "train.save_every=1000")
    assert sorted(p.name for p in run.iterdir()) == [
        ".last.pt.k3j9x1ab.tmp",
        ".lock",
        "config.yaml",
        "metrics.jsonl",
    ]
    assert [r["epoch"] for r in _records(run)] == [1, 2]
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="patchword.hashing.rundir"):
        assert _train(out, "r", "--epochs", "2", "train.save_every=1000") == 0
    assert any("a start killed before its first checkpoint left" in r.getMessage() for r in caplog.records)
    assert ".last.pt.k3j9x1ab.tmp" not in {p.name for p in run.iterdir()}
    assert [r["epoch"] for r in _records(run)] == [1, 2]  # the killed start's records are gone


def test_a_resume_removes_what_killed_writes_left_and_repairs_a_torn_resume_log(tmp_path, capsys):
    """Defects: a ``.last.pt.XXXX.tmp`` left by a kill during a write stayed for good; a resume's record
    was glued onto the torn last line of resumes.jsonl (unreadable once another record followed)."""
    out = tmp_path / "runs"
    assert _train(out, "r", "--epochs", "1") == 0
    run = out / "r"
    stale = [run / ".last.pt.a1b2c3d4.tmp", run / ".eval.json.zz99yy88.tmp"]
    foreign = run / ".notes.txt.a1b2c3d4.tmp"  # not the temporary file of anything the run writes
    for path in [*stale, foreign]:
        path.write_bytes(b"left by a kill")
    first = {"time": "2026-11-27T00:00:00", "epoch": 1, "step": 2, "overrides": []}
    (run / "resumes.jsonl").write_text(json.dumps(first) + '\n{"time": "2026-11-')  # torn by a kill
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 0
    assert not any(p.exists() for p in stale) and foreign.exists()
    records = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert records[0] == first and len(records) == 2 and records[1]["overrides"] == ["train.epochs=2"]


def test_each_epoch_logs_a_progress_line_at_most_every_few_seconds(tmp_path, caplog, clock):
    """Defect: `hash train` printed nothing until its final summary, however many epochs it trained. One
    line per epoch, thinned to one every LOG_EVERY_S seconds (the clock: 2 s an epoch), the first and the
    last epoch always."""
    with caplog.at_level(logging.INFO, logger="patchword.hashing.trainer"):
        assert _train(tmp_path / "runs", "r", "--epochs", "6") == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == [
        "epoch 1/6 step 2",
        "epoch 4/6 step 8",
        "epoch 6/6 step 12",
    ]
    assert re.fullmatch(
        r"epoch 1/6 step 2: loss [\d.]+, loss_feature [\d.]+, loss_hash [\d.]+; 2\.0 s", lines[0]
    )
    assert trainer_module.LOG_EVERY_S == 5.0


def test_a_run_being_trained_is_locked(tmp_path, capsys):
    """A second `hash train --resume` of a run another process trains is refused before it writes."""
    out = tmp_path / "runs"
    assert _train(out, "r", "--epochs", "1") == 0
    run = out / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    with exclusive_lock(run / ".lock", "held by the test"):
        assert main(["train", "--resume", str(run), "--epochs", "2"]) == 2
    assert "is in use by another process" in one_error_line(capsys.readouterr().err)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_second_start_of_a_run_in_training_says_in_use_not_resume(tmp_path, capsys):
    """It said "already holds a run; continue it with `patchword hash train --resume`", which the lock then
    refused as in use (as ``patchword train`` did before; the same rules serve both commands now)."""
    out = tmp_path / "runs"
    assert _train(out, "r", "--epochs", "1") == 0
    run = out / "r"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    with exclusive_lock(run / ".lock", "held by the test"):  # the process that trains it now
        assert _train(out, "r", "--epochs", "1") == 2
        line = one_error_line(capsys.readouterr().err)
    assert str(run) in line and "is in use by another process" in line and "continue it" not in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert _train(out, "r", "--epochs", "1") == 2  # free: "already holds a run; continue it with ..."
    assert "continue it with `patchword hash train --resume" in one_error_line(capsys.readouterr().err)


def test_a_start_that_fails_before_its_first_checkpoint_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A half-made run directory (config.yaml, no last.pt) could be neither resumed nor started again."""

    def failing(self, idx):
        raise RuntimeError("a bug in the first step")

    monkeypatch.setattr(trainer_module.HashTrainer, "_loss", failing)
    out = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="a bug in the first step"):
        _train(out, "r", "--epochs", "1")
    assert not (out / "r").exists()
    monkeypatch.undo()
    assert _train(out, "r", "--epochs", "1") == 0


def test_eval_says_which_checkpoint_it_evaluated(tmp_path, capsys):
    """Defect: `hash eval` (stdout and --out) did not say which weights it evaluated."""
    out = tmp_path / "runs"
    assert _train(out, "r", "--epochs", "2") == 0
    capsys.readouterr()
    assert main(["eval", str(out / "r"), "--out", str(tmp_path / "e.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "e.json").read_text())
    assert printed["checkpoint"] == {"file": "last.pt", "epoch": 2, "step": 4, "finished": True}
    assert json.loads((out / "r" / "eval.json").read_text())["checkpoint"] == printed["checkpoint"]
