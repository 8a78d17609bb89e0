"""A run's life around its training loop: a stop anywhere and a resume give the uninterrupted run's
validations, best.pt and summary; one command at a time owns a run directory; a signal before training or
during the final evaluation leaves the run clean and says so; times and budgets count every session; the
optimiser's factors are checked before anything is written.

Tiny synthetic runs (105 captions in batches of 16: 7 steps per epoch), one thread, in-process: a signal is
sent from inside the step it must stop, a kill is a ``BaseException`` raised where the kill would land.

Over 400 lines: one scenario per way a run's life can go wrong, sharing the uninterrupted runs they match.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
import types
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL_32, one_error_line
from patchword.checkpoint import atomic_save, load_checkpoint
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.errors import Interrupted, RunExistsError
from patchword.runs.claim import LOCK_FILE
from patchword.runs.config import RunConfig
from patchword.train import runner
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "data.num_train=21",  # 105 captions: 7 batches per epoch
    "data.num_dev=6",
    "data.num_test=6",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.lr=1e-3",
    "train.log_every=1",
    "train.num_threads=1",
    "eval.max_memory_mb=1",
]
# validations at 4 (eval_every), 7 (epoch end), 8 (eval_every) and 12 (the last step)
VALIDATED = ["train.max_steps=12", "train.eval_every=4", "train.checkpoint_every=3"]
SUMMARY_KEYS = ("best_dev_rsum", "rsum", "i2t_r1", "t2i_r1", "steps", "epochs_done")


class Killed(BaseException):
    """What ``kill -9`` does to the process at the point it is raised: nothing after it runs."""


def _config(root: Path, name: str, *extra: str) -> RunConfig:
    return apply_overrides(RunConfig(), _overrides(root, name, *extra))


def _overrides(root: Path, name: str, *extra: str) -> list[str]:
    """The overrides of :func:`_config` as a command line gives them."""
    return [*TINY, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}", *extra]


def _records(run: Path, split: str) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time"} for r in records if r["split"] == split]


def _summary(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    return {key: summary[key] for key in SUMMARY_KEYS}


def _assert_same_result(full: Path, run: Path) -> None:
    """The same validations (once each), best.pt, final weights and summary as the uninterrupted run."""
    assert _records(run, "dev") == _records(full, "dev")
    best, best_full = load_checkpoint(run / "best.pt"), load_checkpoint(full / "best.pt")
    assert best["step"] == best_full["step"] and best["metrics"] == best_full["metrics"]
    for name in ("best.pt", "last.pt"):
        weights, expected = load_checkpoint(run / name)["model"], load_checkpoint(full / name)["model"]
        assert all(torch.equal(weights[key], expected[key]) for key in expected), name
    assert _summary(run) == _summary(full)


def _signal_at(monkeypatch, step: int, signum: int = signal.SIGTERM):
    """``signum`` arrives during step ``step`` (the trainer stops right after it, last.pt written); returns
    the step method it wraps."""
    original = trainer_module.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.step == step - 1:  # counted once the step is done
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", step_then_signal)
    return original


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The uninterrupted runs the interrupted ones must equal."""
    root = tmp_path_factory.mktemp("lifecycle")
    train_run(_config(root, "full", *VALIDATED))
    return root


# ------------------------------------------------------------------------------ validations, once each


@pytest.mark.parametrize("step", [4, 7, 12], ids=["eval_every", "epoch_end", "last_step"])
def test_sigterm_on_a_validation_step_is_validated_on_resume_like_the_uninterrupted_run(
    root, step, monkeypatch
):
    """Defect: the signal was honoured before the step's validation and the checkpoint counted the step as
    done, so the resume never validated it (at the last step the final validation was skipped too)."""
    name = f"stopped_at_{step}"
    _signal_at(monkeypatch, step)
    with pytest.raises(trainer_module.TrainingInterrupted) as stopped:
        train_run(_config(root, name, *VALIDATED))
    assert stopped.value.step == step
    monkeypatch.undo()
    resume_run(root / name)
    _assert_same_result(root / "full", root / name)


def test_a_kill_during_the_validation_a_resume_owed_logs_it_once(root, monkeypatch):
    """SIGTERM at validation step 8, then the resume is killed after that validation's record was appended
    but before its checkpoint: the next resume validates step 8 again, and its record is logged once."""
    run = root / "killed_in_owed_validation"
    _signal_at(monkeypatch, 8)
    with pytest.raises(trainer_module.TrainingInterrupted):
        train_run(_config(root, run.name, *VALIDATED))
    monkeypatch.undo()

    def killed(self, averaged=False):
        raise Killed

    original = trainer_module.Trainer.validate

    def validate_then_die_saving(self, flag):
        self.save_last = types.MethodType(killed, self)
        return original(self, flag)

    monkeypatch.setattr(trainer_module.Trainer, "validate", validate_then_die_saving)
    with pytest.raises(Killed):
        resume_run(run)
    assert [r["step"] for r in _records(run, "dev")] == [4, 7, 8]  # logged, but last.pt still owes it
    monkeypatch.undo()
    resume_run(run)
    _assert_same_result(root / "full", run)


def test_a_checkpoint_an_older_version_wrote_at_an_epoch_end_resumes_like_the_uninterrupted_run(
    root, monkeypatch
):
    """Before validation_due, a checkpoint at an epoch's last step (an interval one, or SIGTERM's) kept
    the epoch unfinished (batch 7 of 7, scheduler not stepped); the resume rolls it over and validates."""
    run = root / "older_at_epoch_end"
    _signal_at(monkeypatch, 7)
    with pytest.raises(trainer_module.TrainingInterrupted):
        train_run(_config(root, run.name, *VALIDATED))
    monkeypatch.undo()
    state = load_checkpoint(run / "last.pt")
    assert (state["epoch"], state["batch_in_epoch"], state.pop("validation_due")) == (1, 0, True)
    state["epoch"], state["batch_in_epoch"] = 0, 7
    state["scheduler"]["last_epoch"] -= 1
    state["scheduler"]["_step_count"] -= 1
    atomic_save(state, run / "last.pt")
    resume_run(run)
    _assert_same_result(root / "full", run)


def test_an_eval_every_step_at_an_epoch_end_is_validated_once(root):
    """Defect: train.eval_every=7 with 7 steps per epoch validated steps 7 and 14 twice each. A dev
    record's epoch is the epoch its step belongs to, as a training record's (it was the epochs completed:
    (7, 1), (14, 2))."""
    train_run(_config(root, "eval_at_epoch_ends", "train.max_steps=16", "train.eval_every=7"))
    dev = _records(root / "eval_at_epoch_ends", "dev")
    assert [(r["step"], r["epoch"]) for r in dev] == [(7, 0), (14, 1), (16, 2)]


def test_a_kill_between_an_epoch_end_validation_record_and_its_checkpoint_logs_it_once(root, monkeypatch):
    """Defect: the interval checkpoint of step 14 (an epoch's end) was written before the epoch's
    validation; killed after that validation's record, the resume kept the record and validated 14 again."""
    steps = ["train.max_steps=16", "train.checkpoint_every=7"]
    train_run(_config(root, "interval_at_epoch_ends", *steps))
    original = trainer_module.Trainer.validate

    def killed(self, averaged=False):
        raise Killed

    def validate_then_die_saving(self, flag):
        if self.step == 14:
            self.save_last = types.MethodType(killed, self)
        return original(self, flag)

    monkeypatch.setattr(trainer_module.Trainer, "validate", validate_then_die_saving)
    run = root / "killed_at_14"
    with pytest.raises(Killed):
        train_run(_config(root, run.name, *steps))
    monkeypatch.undo()
    resume_run(run)
    assert [r["step"] for r in _records(run, "dev")] == [7, 14, 16]
    assert _records(run, "dev") == _records(root / "interval_at_epoch_ends", "dev")


# ------------------------------------------------------------------------------------ one owner at a time


def test_a_second_command_on_a_run_in_use_is_refused(root, monkeypatch, capsys):
    """Defect: no lock; a parallel --resume (or a second start of the name) wrote into the same run."""
    run = root / "in_use"
    refusals = []
    original = trainer_module.Trainer.save_last

    def save_then_try_again(self, averaged=False):
        original(self, averaged)
        if self.step == 3 and not refusals:
            with pytest.raises(RunExistsError) as refused:
                resume_run(run, ["train.max_steps=6"])
            refusals.append(str(refused.value))
            assert main(["train", "--resume", str(run)]) == 2
            refusals.append(one_error_line(capsys.readouterr().err))

    monkeypatch.setattr(trainer_module.Trainer, "save_last", save_then_try_again)
    train_run(_config(root, run.name, "train.max_steps=6", "train.checkpoint_every=3"))
    assert len(refusals) == 2
    for line in refusals:
        assert str(run) in line and "in use by another process" in line, line
    monkeypatch.undo()
    assert [r["step"] for r in _records(run, "train")] == list(range(1, 7))  # nothing written twice
    resume_run(run, ["train.max_steps=7"])  # the lock went with the command that held it


def test_a_run_held_by_another_process_is_refused_by_the_cli_in_one_line(root, capsys):
    run = root / "held"
    train_run(_config(root, run.name, "train.max_steps=2"))
    before = (run / "last.pt").read_bytes()
    with open(run / LOCK_FILE, "a") as other:  # what a second process's lock looks like
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["train", "--resume", str(run), "train.max_steps=4"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(run) in line and "in use by another process" in line, line
    assert (run / "last.pt").read_bytes() == before


def test_a_second_start_of_a_run_in_training_says_in_use_not_resume(root, capsys):
    """Old message: "already exists; ... continue it with patchword train --resume", which the lock then
    refuses as in use."""
    run = root / "held_start"
    train_run(_config(root, run.name, "train.max_steps=2"))
    with open(run / LOCK_FILE, "a") as other:  # the process that trains it now
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["train", *_overrides(root, run.name, "train.max_steps=2")]) == 2
        line = one_error_line(capsys.readouterr().err)
    assert str(run) in line and "in use by another process" in line and "continue it" not in line, line
    assert main(["train", *_overrides(root, run.name, "train.max_steps=2")]) == 2  # free: "already exists"
    assert "already exists" in one_error_line(capsys.readouterr().err)


def test_two_starts_of_one_name_leave_one_run_and_refuse_the_other(root, monkeypatch):
    """Defect: both starts passed the emptiness check before either created the directory, then both wrote
    into it. Here a second start runs while the first is between its check and its claim (it finishes),
    and a third while the first holds the new directory (before its config is written)."""
    cfg = _config(root, "raced", "train.max_steps=2")
    original_build, original_save = runner._build, runner.save_config
    events = []

    def build_while_another_starts(*args, **kwargs):
        built = original_build(*args, **kwargs)
        if not events:
            events.append("second")
            monkeypatch.setattr(runner, "_build", original_build)
            events.append(train_run(_config(root, "raced", "train.max_steps=3"))["steps"])
        return built

    monkeypatch.setattr(runner, "_build", build_while_another_starts)
    with pytest.raises(RunExistsError, match="already exists"):
        train_run(cfg)
    assert events == ["second", 3]
    assert load_checkpoint(root / "raced" / "last.pt")["step"] == 3 and _summary(root / "raced")["steps"] == 3

    def save_while_another_starts(config, path):
        with pytest.raises(RunExistsError, match="in use by another process"):
            train_run(_config(root, "raced_2", "train.max_steps=3"))
        events.append("third refused")
        original_save(config, path)

    monkeypatch.setattr(runner, "save_config", save_while_another_starts)
    assert train_run(_config(root, "raced_2", "train.max_steps=2"))["steps"] == 2
    assert events[-1] == "third refused"


# ----------------------------------------------------------------------- signals outside the training loop


def _send_sigterm_here() -> None:
    """SIGTERM to this process, unless its default action would kill it (and pytest with it)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        raise AssertionError("SIGTERM's default action here: the process dies where it stands")
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_right_after_the_run_directory_is_made_leaves_nothing(root, monkeypatch):
    """Defect: SIGTERM between creating the run directory and training killed the process with its
    config.yaml behind: the name could be neither rerun nor resumed."""
    original = runner.save_config

    def signalled_save(config, path):
        _send_sigterm_here()
        original(config, path)

    monkeypatch.setattr(runner, "save_config", signalled_save)
    with pytest.raises(Interrupted, match="SIGTERM received before training started") as stopped:
        train_run(_config(root, "early_sigterm", "train.max_steps=2"))
    assert stopped.value.signum == signal.SIGTERM
    assert not (root / "early_sigterm").exists()
    monkeypatch.undo()
    assert train_run(_config(root, "early_sigterm", "train.max_steps=2"))["steps"] == 2


def test_sigterm_during_the_final_evaluation_says_how_to_finish(root, monkeypatch):
    original = runner.evaluate_run

    def signalled_evaluation(*args, **kwargs):
        _send_sigterm_here()
        return original(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate_run", signalled_evaluation)
    run = root / "sigterm_in_evaluation"
    with pytest.raises(Interrupted, match="during the final evaluation") as stopped:
        train_run(_config(root, run.name, "train.max_steps=2"))
    assert f"--resume {run}" in str(stopped.value) and not (run / "summary.json").exists()
    monkeypatch.undo()
    assert resume_run(run)["steps"] == 2 and _summary(run)["steps"] == 2


def test_an_interrupted_resume_leaves_no_summary_of_the_run_it_moved_on_from(root, monkeypatch):
    """Defect: a finished 6-step run resumed for 12 steps and stopped at 9 still had the 6-step
    summary.json and metrics.json: report showed them, a sweep took the run for finished."""
    run = root / "extended"
    train_run(_config(root, run.name, "train.max_steps=6"))
    first = json.loads((run / "summary.json").read_text())
    _signal_at(monkeypatch, 9)
    with pytest.raises(trainer_module.TrainingInterrupted):
        resume_run(run, ["train.max_steps=12"])
    assert not (run / "summary.json").exists() and not (run / "metrics.json").exists()
    assert json.loads((run / "summary.previous.json").read_text()) == first
    monkeypatch.undo()
    assert resume_run(run, ["train.max_steps=12"])["steps"] == 12 and _summary(run)["steps"] == 12
    again = (run / "summary.json").read_bytes()
    resume_run(run, ["train.max_steps=12"])  # nothing to train: only evaluated again, nothing set aside
    assert json.loads((run / "summary.previous.json").read_text()) == first
    assert json.loads(again)["steps"] == 12


# --------------------------------------------------------------------------------- times across sessions


@pytest.fixture
def clock(monkeypatch):
    """The trainer's clock, advanced by hand: one second per training step (before the step runs)."""
    now = {"t": 1000.0}
    fake = types.SimpleNamespace(perf_counter=lambda: now["t"], time=time.time)
    monkeypatch.setattr(trainer_module, "time", fake)
    original = trainer_module.Trainer._train_step

    def timed_step(self, *args, **kwargs):
        now["t"] += 1.0
        original(self, *args, **kwargs)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", timed_step)
    return now


def test_step_seconds_after_a_resume_count_only_that_sessions_steps(root, clock, monkeypatch):
    """Defect: the first record after a resume divided the time since the Trainer was built (data loading
    included) by every step of the run: 101 s over 7 steps instead of 1 s."""
    run = root / "timed"
    train_run(_config(root, run.name, "train.max_steps=6"))
    original = trainer_module.Trainer.load_state_dict

    def slow_setup(self, state):
        original(self, state)
        clock["t"] += 100.0  # building the data and the model took 100 s before training went on

    monkeypatch.setattr(trainer_module.Trainer, "load_state_dict", slow_setup)
    resume_run(run, ["train.max_steps=9"])
    records = _records(run, "train")
    assert [r["step"] for r in records] == list(range(1, 10))
    assert [r["step_seconds"] for r in records] == [1.0] * 9


def test_the_time_budget_counts_every_session_of_the_run(root, clock, monkeypatch):
    """Defect: each resume restarted train.time_budget_s: a 4.5 s budget stopped at step 5 uninterrupted,
    at step 8 when stopped at step 3 and resumed."""
    budget = ["train.time_budget_s=4.5", "train.eval_every=2"]
    full = train_run(_config(root, "budget_full", *budget))
    assert full["steps"] == 5
    timed_step = _signal_at(monkeypatch, 3)
    with pytest.raises(trainer_module.TrainingInterrupted):
        train_run(_config(root, "budget_cut", *budget))
    monkeypatch.setattr(trainer_module.Trainer, "_train_step", timed_step)
    resumed = resume_run(root / "budget_cut")
    assert resumed["steps"] == 5 and resumed["train_seconds"] == full["train_seconds"] == 5.0
    assert _records(root / "budget_cut", "dev") == _records(root / "budget_full", "dev")


# ------------------------------------------------------------------------------------ optimiser factors


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["train.weight_decay=-1"], "train.weight_decay"),
        (["train.lr_decay=-1", "train.lr_milestone_steps=[2]"], "train.lr_decay"),
        (["train.lr_decay=0"], "train.lr_decay"),
        (["train.backbone_lr_mult=-0.1"], "train.backbone_lr_mult"),
        # an infinite margin made every loss NaN: every step skipped, exit 0
        (["train.margin=.inf"], "train.margin"),
        (["train.margin=-1"], "train.margin"),
        (["train.ratio_weight=-5"], "train.ratio_weight"),
        (["dist_timeout_s=.inf"], "dist_timeout_s"),
    ],
)
def test_optimiser_factors_out_of_range_are_one_line_before_anything_is_written(
    tmp_path, capsys, overrides, key
):
    """Defect: weight_decay=-1 failed inside AdamW after config.yaml was written, naming no key; a negative
    lr_decay trained with negative learning rates."""
    argv = ["train", *TINY, "train.max_steps=3", f"output_dir={tmp_path / 'runs'}", "name=bad", *overrides]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {key}:"), line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_dir_that_is_a_file_is_one_line_naming_the_key(tmp_path, capsys, below):
    """It was ``error: [Errno 20] Not a directory: '...'``, naming neither the key nor the cause."""
    (tmp_path / "runs").write_text("a file")
    output_dir = tmp_path / "runs" / below if below else tmp_path / "runs"
    assert main(["train", *TINY_MODEL_32, f"output_dir={output_dir}", "name=x"]) == 2
    line = one_error_line(capsys.readouterr().err)
    if below:
        assert (
            line
            == f"error: output_dir: {tmp_path / 'runs'} is a file: {output_dir} cannot be created under it"
        )
    else:
        assert line == f"error: output_dir: {output_dir} is a file: output_dir names the directory runs go in"
    assert (tmp_path / "runs").read_text() == "a file"


def test_a_run_name_that_is_a_file_is_one_line_saying_so(tmp_path, capsys):
    """It was ``error: [Errno 20] Not a directory: '...'``; ``patchword hash train`` said what is wrong (the
    same rules, :mod:`patchword.runs.claim`, serve both commands now)."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x").write_text("a file")
    assert main(["train", *TINY_MODEL_32, f"output_dir={tmp_path / 'runs'}", "name=x"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: {tmp_path / 'runs' / 'x'} is a file: choose another name= or output_dir="
    assert (tmp_path / "runs" / "x").read_text() == "a file"
