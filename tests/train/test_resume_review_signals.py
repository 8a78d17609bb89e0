"""Review of training (finding 3): a signal that arrives during a validation stops the run once that
validation is saved, at the step it validated, not after one more training step; one during the final
validation stops the run too (the old loop forgot it and went on to the final evaluation).

The signal is sent from inside the dev evaluation (deterministic: no timing), tiny runs in-process.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from conftest import TINY_RUN_32
from patchword.checkpoint import load_checkpoint
from patchword.config import apply_overrides
from patchword.runs.config import RunConfig
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(root: Path, name: str, *extra: str) -> RunConfig:
    overrides = [*TINY_RUN_32, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}"]
    return apply_overrides(RunConfig(), [*overrides, "train.max_steps=6", "train.eval_every=3", *extra])


def _signal_in_validation(monkeypatch, at_step: int) -> None:
    """SIGTERM arrives while the dev evaluation of step ``at_step`` runs."""
    evaluate, validate = trainer_module.evaluate, trainer_module.Trainer.validate
    validating: list[int] = []  # the step each validation is of

    def validate_noting_its_step(self):
        validating.append(self.step)
        return validate(self)

    def evaluate_then_signal(*args, **kwargs):
        metrics = evaluate(*args, **kwargs)
        if validating[-1] == at_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    monkeypatch.setattr(trainer_module.Trainer, "validate", validate_noting_its_step)
    monkeypatch.setattr(trainer_module, "evaluate", evaluate_then_signal)


def _records(run: Path, split: str) -> list[int]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["split"] == split]


@pytest.mark.parametrize("at_step", [3, 6], ids=["eval_every", "last_step"])
def test_a_signal_during_a_validation_stops_at_the_validated_step(tmp_path, monkeypatch, at_step):
    """Old code: the flag was looked at after the next step (stopped at 4, one step trained after the
    signal); during the last step's validation it was never looked at: the run went on to its final
    evaluation and exited 0."""
    name = f"v{at_step}"
    _signal_in_validation(monkeypatch, at_step)
    with pytest.raises(trainer_module.TrainingInterrupted) as stopped:
        train_run(_config(tmp_path, name))
    run = tmp_path / name
    assert stopped.value.step == at_step and stopped.value.signum == signal.SIGTERM
    state = load_checkpoint(run / "last.pt")
    assert state["step"] == at_step and state["validation_due"] is False  # the validation is saved
    assert _records(run, "train")[-1] == at_step and _records(run, "dev")[-1] == at_step
    assert not (run / "summary.json").exists()
    monkeypatch.undo()
    summary = resume_run(run)
    assert summary["steps"] == 6 and _records(run, "dev") == [3, 6]  # each validated once
