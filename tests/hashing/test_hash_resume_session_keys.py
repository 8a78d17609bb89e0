"""A resume goes on with the resumable keys of the session that wrote last.pt, not config.yaml's (which is
never rewritten): a resume with ``train.epochs=N`` that was stopped, then continued with the printed
``patchword hash train --resume RUN``, trained to config.yaml's epochs (or was refused when those were
fewer than trained). And a one-session run's summary gives its training time and the session's as of one
moment (``train_seconds`` was below ``session_train_seconds``)."""

from __future__ import annotations

import itertools
import json
import signal
import types
from pathlib import Path

import pytest
import yaml

import patchword.hashing.trainer as trainer_module
from conftest import TINY_HASH
from patchword.checkpoint import load_checkpoint
from patchword.cli.hash import main
from patchword.hashing.runner import resume_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(out: Path, *extra: str) -> int:
    return main(["train", "--bits", "16", "--output-dir", str(out), "--name", "r", *TINY_HASH, *extra])


def _sigterm_at_step(monkeypatch, step: int) -> None:
    """SIGTERM arrives while the loss of step ``step`` (1-based, counted from now) is computed; the
    trainer's handler saves last.pt and stops (``hash train`` exits 128 + 15)."""
    original = trainer_module.HashTrainer._loss
    calls = itertools.count(1)

    def loss_then_signal(self, idx):
        out = original(self, idx)
        if next(calls) == step:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.default_int_handler)
            signal.raise_signal(signal.SIGTERM)
        return out

    monkeypatch.setattr(trainer_module.HashTrainer, "_loss", loss_then_signal)


@pytest.mark.parametrize(
    ("first", "resumed", "stop_at"),
    [(2, 6, 3), (8, 3, 2)],  # TINY_HASH: 2 steps an epoch
    ids=["resumed-past-config-yaml", "resumed-short-of-config-yaml"],
)
def test_the_printed_resume_of_a_stopped_resume_goes_on_to_its_epochs(
    tmp_path, capsys, monkeypatch, first, resumed, stop_at
):
    """Defect: config.yaml epochs 2, a resume to 6 stopped in epoch 4: the plain --resume was refused (2 <
    3 trained); config.yaml epochs 8, a resume to 3 stopped in epoch 2: the plain --resume trained to 8."""
    out = tmp_path / "runs"
    run = out / "r"
    if first < resumed:  # config.yaml's run finished, then a resume to more epochs was stopped
        assert _train(out, "--epochs", str(first)) == 0
    else:  # config.yaml's run was stopped early, resumed to fewer epochs, and stopped again
        with monkeypatch.context() as m:
            _sigterm_at_step(m, 1)
            assert _train(out, "--epochs", str(first), "train.save_every=1") == 128 + signal.SIGTERM
    with monkeypatch.context() as m:
        _sigterm_at_step(m, stop_at)
        argv = ["train", "--resume", str(run), f"train.epochs={resumed}"]
        assert main(argv) == 128 + signal.SIGTERM
    assert f"continue with `patchword hash train --resume {run}`" in capsys.readouterr().err
    assert resume_config(run).train.epochs == resumed  # last.pt's session, not config.yaml's
    assert main(["train", "--resume", str(run)]) == 0  # the command the stop printed
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == resumed
    assert summary["checkpoint"]["finished"] is True
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["epochs"] == first  # never rewritten
    # an override still wins over the session's value
    assert resume_config(run, ["train.epochs=9"]).train.epochs == 9


def test_a_resume_keeps_the_session_s_other_resumable_keys(tmp_path, capsys, monkeypatch):
    """``train.save_every`` and ``eval.ks`` of a stopped resume stay its own on the plain resume."""
    out = tmp_path / "runs"
    run = out / "r"
    assert _train(out, "--epochs", "1") == 0
    with monkeypatch.context() as m:
        _sigterm_at_step(m, 1)
        argv = ["train", "--resume", str(run), "train.epochs=3", "train.save_every=1", "eval.ks=[2]"]
        assert main(argv) == 128 + signal.SIGTERM
    capsys.readouterr()
    cfg = resume_config(run)
    assert (cfg.train.epochs, cfg.train.save_every, cfg.eval.ks) == (3, 1, [2])
    assert main(["train", "--resume", str(run)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == 3 and "i2t_p@2" in summary and "i2t_p@5" not in summary


def test_a_one_session_run_reports_its_times_as_of_one_moment(tmp_path, capsys, monkeypatch):
    """Defect: train_seconds came from the last save, session_train_seconds from a later reading of the
    clock: a one-session run's summary said the run trained less than its only session."""
    ticks = itertools.count()  # every reading of the clock is one second later
    clock = types.SimpleNamespace(perf_counter=lambda: float(next(ticks)))
    monkeypatch.setattr(trainer_module, "time", clock)
    out = tmp_path / "runs"
    assert _train(out, "--epochs", "2") == 0
    summary = json.loads(capsys.readouterr().out)
    saved = load_checkpoint(out / "r" / "last.pt")["train_seconds"]
    assert summary["train_seconds"] == summary["session_train_seconds"] == saved > 0
