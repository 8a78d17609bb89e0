"""Review of resuming (findings 1, 7, 8): an interrupted session's message goes on with that session's own
overrides (shell-quoted; under torchrun as the launch it needs, from rank 0 only), a limit behind the step
``last.pt`` is at is refused, a limit reached at a step never validated validates it first, a finished run
resumed with unchanged settings is left as it is, and an unknown key on a resume is named as one.

Tiny synthetic runs (100 captions in batches of 16), one thread, in-process; a signal is sent from inside
the step it must stop.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.distributed import LaunchInfo
from patchword.errors import ConfigError, Interrupted
from patchword.runs.config import RunConfig
from patchword.train import runner
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(root: Path, name: str, *extra: str) -> RunConfig:
    overrides = [*TINY_RUN_32, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}"]
    return apply_overrides(RunConfig(), [*overrides, *extra])


def _signal_at(monkeypatch, step: int) -> None:
    """SIGTERM arrives during step ``step`` (the trainer stops right after it, last.pt written)."""
    original = trainer_module.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.step == step - 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", step_then_signal)


def _dev_steps(run: Path) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["split"] == "dev"]


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def extended(tmp_path_factory) -> tuple[Path, list[str], str]:
    """A 2-step run, extended by a resume to 6 steps (its cache moved to a path with a space) that SIGTERM
    stopped at step 4, a step no validation was due at: (run directory, that resume's overrides, the
    interruption's message)."""
    root = tmp_path_factory.mktemp("extended")
    train_run(_config(root, "ext", "train.max_steps=2"))
    run = root / "ext"
    overrides = ["train.max_steps=6", f"data.cache_dir={root / 'a cache'}"]
    with pytest.MonkeyPatch.context() as patched:
        _signal_at(patched, 4)
        with pytest.raises(trainer_module.TrainingInterrupted) as stopped:
            resume_run(run, overrides)
    assert stopped.value.step == 4 and _dev_steps(run) == [2]
    return run, overrides, str(stopped.value)


def test_an_interrupted_resume_says_to_go_on_with_its_own_overrides(extended):
    """Old hint: `patchword train --resume RUN`, which goes on with config.yaml's train.max_steps=2."""
    run, overrides, message = extended
    assert f"continue with `patchword train --resume {shlex.join([str(run), *overrides])}`" in message
    assert f"'data.cache_dir={run.parent / 'a cache'}'" in message  # shell-quoted: one word


def test_a_resume_interrupted_in_its_final_evaluation_says_to_evaluate_with_its_overrides(
    extended, tmp_path, monkeypatch
):
    import shutil

    run = Path(shutil.copytree(extended[0], tmp_path / "ext"))
    overrides = ["train.max_steps=5", f"data.cache_dir={tmp_path / 'c c'}"]

    def signalled_evaluation(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(runner, "evaluate_run", signalled_evaluation)
    with pytest.raises(Interrupted) as stopped:
        resume_run(run, overrides)
    how = f"`patchword train --resume {shlex.join([str(run), *overrides])}` evaluates it"
    assert "during the final evaluation" in str(stopped.value) and how in str(stopped.value)


def test_a_limit_behind_the_checkpoint_is_refused_and_nothing_is_written(extended, capsys):
    """Old code: `--resume RUN` (config.yaml's train.max_steps=2) "finished" a run at step 4 with its last
    step never validated, and rewrote its summary; `train.max_steps=3` did the same."""
    run, _, _ = extended
    before = _files(run)
    for extra in ([], ["train.max_steps=3"]):
        assert main(["train", "--resume", str(run), *extra]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("error: train.max_steps: "), line
        assert "is below step 4" in line and "train.max_steps=4 or more" in line
    assert _files(run) == before and not (run / "summary.json").exists()


def test_a_limit_reached_at_a_step_never_validated_validates_it_first(extended, tmp_path, caplog):
    """Old code: `--resume RUN train.max_steps=4` ended at step 4 without validating it (no dev record,
    no message), although a run's last step is always validated."""
    import shutil

    run = Path(shutil.copytree(extended[0], tmp_path / "ext"))
    caplog.set_level(logging.INFO, logger="patchword.train.resuming")
    summary = resume_run(run, ["train.max_steps=4"])
    said = [r.getMessage() for r in caplog.records if "never validated" in r.getMessage()]
    assert said == ["train.max_steps=4 is reached at step 4, which was never validated: validating it first"]
    assert _dev_steps(run) == [2, 4] and summary["steps"] == 4
    assert load_checkpoint(run / "last.pt")["validation_due"] is False


def test_a_resume_that_follows_the_hint_trains_to_the_sessions_limit(extended, tmp_path):
    import shutil

    run = Path(shutil.copytree(extended[0], tmp_path / "ext"))
    summary = resume_run(run, extended[1])
    assert summary["steps"] == 6 and _dev_steps(run) == [2, 6]


def test_the_epoch_limit_behind_the_checkpoint_is_refused_naming_the_epochs(tmp_path, monkeypatch):
    """The reviewer's case: an extended resume (train.epochs=3 of a 1-epoch run) stopped in epoch 3, then
    resumed with config.yaml's train.epochs=1."""
    train_run(_config(tmp_path, "ep", "train.epochs=1"))
    run = tmp_path / "ep"
    per_epoch = load_checkpoint(run / "last.pt")["step"]
    _signal_at(monkeypatch, 2 * per_epoch + 1)
    with pytest.raises(trainer_module.TrainingInterrupted):
        resume_run(run, ["train.epochs=3"])
    monkeypatch.undo()
    with pytest.raises(ConfigError) as refused:
        resume_run(run)
    assert refused.value.key == "train.epochs"
    assert f"is at step {2 * per_epoch + 1}, after 2 epoch(s) and 1 batch(es) of epoch 3" in str(
        refused.value
    )
    assert "give train.epochs=3 or more" in str(refused.value)


def test_a_finished_run_resumed_with_its_settings_is_left_byte_for_byte(trained_tiny_run, tmp_path, caplog):
    """Old code: the resume evaluated it again and rewrote summary.json (train_seconds grown by the idle
    session, other eval_seconds), recorded itself in resumes.jsonl."""
    import shutil

    run = Path(shutil.copytree(trained_tiny_run, tmp_path / "run"))
    before = _files(run)
    caplog.set_level(logging.INFO, logger="patchword.train.resuming")
    assert main(["train", "--resume", str(run), "progress=false"]) == 0
    assert _files(run) == before  # summary.json, metrics.json(l), last.pt: untouched; no resumes.jsonl
    said = [r.getMessage() for r in caplog.records if "nothing to do" in r.getMessage()]
    assert len(said) == 1 and f"`patchword eval {run}`" in said[0]
    # other evaluation settings: evaluated again, the earlier summary kept beside the new one
    assert main(["train", "--resume", str(run), "eval.split=dev"]) == 0
    assert (run / "summary.previous.json").read_bytes() == before["summary.json"]


def test_an_unknown_key_on_a_resume_is_named_as_unknown(trained_tiny_run, capsys):
    """Old message: "train.foo: cannot change on --resume (...)", a key that does not exist."""
    assert main(["train", "--resume", str(trained_tiny_run), "train.foo=1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: train.foo: unknown config key") and "cannot change" not in line


@pytest.mark.parametrize("rank", [0, 1])
def test_under_torchrun_rank_0_names_the_torchrun_command(tmp_path, monkeypatch, rank):
    """Old hint: `patchword train --resume RUN` from every rank of a 2-process launch (one that resumes
    a 2-process run in one process)."""
    import patchword.train.resuming as resuming

    monkeypatch.setattr(resuming, "launch_info", lambda: LaunchInfo(rank, 2, rank, "torchrun"))
    _signal_at(monkeypatch, 1)
    with pytest.raises(Interrupted) as stopped:
        train_run(_config(tmp_path, "tr", "train.max_steps=3"))
    message, run = str(stopped.value), tmp_path / "tr"
    if rank == 0:
        assert (
            f"continue with `torchrun --standalone --nproc_per_node=2 -m patchword train --resume {run}`"
            in (message)
        )
    else:
        assert "--resume" not in message and "rank 0" in message
