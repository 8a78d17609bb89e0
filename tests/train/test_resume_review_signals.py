"""A signal that arrives during a validation. In one process, during the dev evaluation: the evaluation ends
at once (a long validation must not outlast pre-emption's few seconds) and the run stops at that step with
the validation due in ``last.pt``; the resume runs it first. After the evaluation (while its records and
checkpoints are written): the run stops once the validation is saved. Either way the resumed run equals the
uninterrupted one, and the run never trains a step past the signal (the code of review finding 3 went on
for one more step; during the final validation it never looked and went on to the final evaluation).

The signal is sent from inside the validation (deterministic: no timing), tiny runs in-process.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN_32
from patchword.checkpoint import load_checkpoint
from patchword.config import apply_overrides
from patchword.runs.config import RunConfig
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(root: Path, name: str) -> RunConfig:
    overrides = [*TINY_RUN_32, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}"]
    return apply_overrides(RunConfig(), [*overrides, "train.max_steps=6", "train.eval_every=3"])


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """The uninterrupted run."""
    root = tmp_path_factory.mktemp("signals")
    train_run(_config(root, "full"))
    return root / "full"


def _signal_in_validation(monkeypatch, at_step: int, when: str) -> list[int]:
    """SIGTERM arrives in the validation of step ``at_step``: at the start of its dev evaluation
    (``when="evaluating"``) or as its dev record is logged (``"saving"``). Returns the steps whose dev
    evaluation ran to its end."""
    evaluate, log = trainer_module.evaluate, trainer_module.Trainer._log
    trainer: list = []
    finished: list[int] = []

    def signal_then_evaluate(*args, **kwargs):
        if when == "evaluating" and trainer[0].step == at_step:
            os.kill(os.getpid(), signal.SIGTERM)
        metrics = evaluate(*args, **kwargs)
        finished.append(trainer[0].step)
        return metrics

    def log_then_signal(self, record):
        trainer[:] = [self]
        log(self, record)
        if when == "saving" and record["split"] == "dev" and self.step == at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    original_init = trainer_module.Trainer.__init__

    def init_noting_the_trainer(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        trainer[:] = [self]

    monkeypatch.setattr(trainer_module.Trainer, "__init__", init_noting_the_trainer)
    monkeypatch.setattr(trainer_module, "evaluate", signal_then_evaluate)
    monkeypatch.setattr(trainer_module.Trainer, "_log", log_then_signal)
    return finished


def _records(run: Path, split: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in r.items() if k != "time"} for r in map(json.loads, lines) if r["split"] == split
    ]


@pytest.mark.parametrize("when", ["evaluating", "saving"])
@pytest.mark.parametrize("at_step", [3, 6], ids=["eval_every", "last_step"])
def test_a_signal_during_a_validation_stops_at_its_step_and_resumes_like_the_uninterrupted_run(
    full, tmp_path, monkeypatch, at_step, when
):
    """Old code: a signal during the evaluation waited for it to finish (all of it: a COCO 5K dev on the
    CPU takes minutes, pre-emption gives seconds) and saved the step as validated."""
    name = f"v{at_step}_{when}"
    finished = _signal_in_validation(monkeypatch, at_step, when)
    with pytest.raises(trainer_module.TrainingInterrupted) as stopped:
        train_run(_config(tmp_path, name))
    run = tmp_path / name
    assert stopped.value.step == at_step and stopped.value.signum == signal.SIGTERM
    state = load_checkpoint(run / "last.pt")
    assert state["step"] == at_step
    assert _records(run, "train")[-1]["step"] == at_step  # not one step past the signal
    dev_steps = [r["step"] for r in _records(run, "dev")]
    if when == "evaluating":  # ended at once: no record, the validation owed to the resume
        assert at_step not in finished and state["validation_due"] is True
        assert dev_steps == [s for s in (3,) if s < at_step]
    else:  # the evaluation was done: it is saved, then the run stops
        assert finished[-1] == at_step and state["validation_due"] is False
        assert dev_steps == [s for s in (3, 6) if s <= at_step]
    assert not (run / "summary.json").exists()
    monkeypatch.undo()
    summary = resume_run(run)
    assert summary["steps"] == 6
    assert _records(run, "dev") == _records(full, "dev")  # each validated once, with the same figures
    for checkpoint in ("best.pt", "last.pt"):
        weights, expected = (
            load_checkpoint(run / checkpoint)["model"],
            load_checkpoint(full / checkpoint)["model"],
        )
        assert all(torch.equal(weights[key], expected[key]) for key in expected), checkpoint
