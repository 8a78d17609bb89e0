"""Every checkpoint resumes exactly: a run stopped at any checkpoint and resumed ends bit for bit where the
uninterrupted run ends, with the same logged losses.

A kill can come right after any of the four kinds of checkpoint ``last.pt`` is written at: after a
validation (``train.eval_every``), on the step interval (``train.checkpoint_every``), on SIGTERM / SIGINT,
and at the end of a run that is later continued with more steps. The validation and interval cases are
taken in-process: the uninterrupted run copies its whole run directory right after each save, which is
exactly what a kill at that moment leaves behind; one case is a real SIGKILL of a ``patchword train``
subprocess, stalled where it is killed (``tests/stall_support.py``). Same machine, same thread count: the
arithmetic is the same, so equality is exact (float32).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL_32, TINY_REGION_MODEL, TINY_TGDT, tiny_hf_laps_overrides
from patchword.checkpoint import load_checkpoint
from patchword.config import apply_overrides
from patchword.runs.config import RunConfig
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run
from stall_support import run_until_stalled, stalled_command

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 12  # 7 batches per epoch: the runs cross into epoch 1 (hardest negatives)
SCHEDULE = [
    f"train.max_steps={STEPS}",
    "train.eval_every=4",  # validation checkpoints at 4 and 8
    "train.checkpoint_every=3",  # interval checkpoints at 3, 6 and 9
    "train.log_every=1",
    "train.num_threads=1",
    "eval.max_memory_mb=1",
]
TINY = [
    "data.num_train=21",  # 105 captions: batches of 16 and a last one of 9
    "data.num_dev=6",
    "data.num_test=6",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.lr=1e-3",
    *SCHEDULE,
]
REGIONS = [
    *TINY_REGION_MODEL,
    "data.num_train=21",
    "data.num_dev=6",
    "data.num_test=6",
    "train.batch_size=16",
    "train.lr=1e-3",
    "train.align_warmup_epochs=0",
    *SCHEDULE,
]
# The demo's setting: the shipped pretrained encoders (two optimiser groups: the backbones at lr x 0.1).
PRETRAINED = [
    "data.num_train=21",
    "data.num_dev=6",
    "data.num_test=6",
    "model.embed_dim=128",
    "model.tiny_pretrained=synthetic-64",
    "data.vocab_path=synthetic-64",
    "model.seps.variant=paper",
    "train.batch_size=16",
    *SCHEDULE,
]
# Matchers and options a resume must carry: random draws inside the model (Gumbel noise), the shipped
# encoders, a warm start, a global warm-up, every matcher family.
CASES = {
    "seps_paper_gumbel": [*TINY, "model.seps.variant=paper", "model.seps.gumbel=true"],
    "seps_pretrained": PRETRAINED,
    "seps_init_from": [*TINY, "model.seps.variant=code", "train.init_from={source}"],
    "seps_global_warmup": [*TINY, "train.global_warmup_steps=5"],
    "laps": [*TINY, "model.matcher=laps"],
    "vse": [*TINY, "model.matcher=vse"],
    "clip_infonce": [*TINY, "model.matcher=clip", "train.loss=infonce"],
    "scan": [*REGIONS, "model.matcher=scan"],
    "naaf": [*REGIONS, "model.matcher=naaf", "model.naaf.min_samples=20"],
    "tgdt": [*REGIONS, *TINY_TGDT],  # with the transformers' dropout: random draws inside the model
}
SNAPSHOTS = {"interval": 9, "validation": 8}


def _config(root: Path, case: str, name: str, *extra: str) -> RunConfig:
    source = root / "source" / "last.pt"
    args = [a.format(source=source) for a in CASES[case]]
    return apply_overrides(
        RunConfig(), [*args, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}", *extra]
    )


def _losses(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["split"] == "train"]


def _assert_same_run(a: Path, b: Path) -> None:
    """Bit-equal final weights and optimiser state, and the same loss at every step, logged once."""
    assert _losses(a) == _losses(b) and [s for s, _ in _losses(a)] == list(range(1, STEPS + 1))
    ca, cb = load_checkpoint(a / "last.pt"), load_checkpoint(b / "last.pt")
    assert ca["step"] == cb["step"] == STEPS
    for key, value in ca["model"].items():
        assert torch.equal(value, cb["model"][key]), key
    for index, state in ca["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, cb["optimizer"]["state"][index][key]), (index, key)
    assert ca["optimizer"]["param_groups"] == cb["optimizer"]["param_groups"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A finished run to warm-start from (``train.init_from``)."""
    root = tmp_path_factory.mktemp("resume")
    source = apply_overrides(
        RunConfig(),
        [*TINY, "model.matcher=vse", "train.max_steps=2", f"output_dir={root}", "name=source"],
    )
    source.data.cache_dir = str(root / "cache")
    train_run(source)
    return root


@pytest.fixture(scope="module")
def uninterrupted(root):
    """case -> (the uninterrupted run, {kind: copy of its run directory right after that checkpoint})."""
    runs = {}
    original = trainer_module.Trainer.save_last

    for case in CASES:
        copies: dict[str, Path] = {}

        def save_last_and_copy(self, averaged=False, case=case, copies=copies):
            original(self, averaged)
            for kind, step in SNAPSHOTS.items():
                if self.step == step and kind not in copies:
                    copies[kind] = root / f"{case}_{kind}"
                    shutil.copytree(self.run_dir, copies[kind])

        trainer_module.Trainer.save_last = save_last_and_copy
        try:
            train_run(_config(root, case, case))
        finally:
            trainer_module.Trainer.save_last = original
        assert set(copies) == set(SNAPSHOTS), copies
        runs[case] = (root / case, copies)
    return runs


@pytest.mark.parametrize("kind", list(SNAPSHOTS))
@pytest.mark.parametrize("case", list(CASES))
def test_a_run_killed_after_a_checkpoint_resumes_bit_for_bit(uninterrupted, case, kind):
    full, copies = uninterrupted[case]
    killed = copies[kind]
    assert load_checkpoint(killed / "last.pt")["step"] == SNAPSHOTS[kind]
    resume_run(killed)
    _assert_same_run(full, killed)


@pytest.mark.parametrize("case", ["seps_paper_gumbel", "seps_pretrained", "naaf"])
def test_a_run_stopped_by_sigterm_resumes_bit_for_bit(root, uninterrupted, case, monkeypatch):
    original = trainer_module.Trainer._train_step

    def step_then_signal(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.step == 4:  # during step 5 (0-based 4): the trainer stops after it, with last.pt
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer_module.Trainer, "_train_step", step_then_signal)
    with pytest.raises(trainer_module.TrainingInterrupted) as stopped:
        train_run(_config(root, case, f"{case}_sigterm"))
    assert stopped.value.step == 5 and stopped.value.signum == signal.SIGTERM
    monkeypatch.setattr(trainer_module.Trainer, "_train_step", original)
    resume_run(root / f"{case}_sigterm")
    _assert_same_run(uninterrupted[case][0], root / f"{case}_sigterm")


@pytest.mark.parametrize("case", ["seps_paper_gumbel", "seps_pretrained"])
def test_a_finished_run_continued_with_more_steps_equals_the_longer_run(root, uninterrupted, case):
    run = root / f"{case}_short"
    train_run(_config(root, case, f"{case}_short", "train.max_steps=6"))
    resume_run(run, [f"train.max_steps={STEPS}"])
    _assert_same_run(uninterrupted[case][0], run)


def test_a_sigkilled_train_process_resumes_bit_for_bit(root, uninterrupted, tmp_path):
    """A real ``kill -9`` of ``patchword train`` right after it logged step 5, between the validation
    checkpoint of step 4 and the interval one of step 6: the command stalls there until it is killed
    (tests/stall_support.py), so the kill never races the run's end."""
    case, name = "seps_paper_gumbel", "sigkilled"
    args = [a.format(source="") for a in CASES[case]]
    argv = ["train", *args, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}"]
    marker = tmp_path / "stalled.json"
    cmd = stalled_command(marker, {"at": "train_log", "step": 5}, argv)
    assert run_until_stalled(cmd, marker, tmp_path / "train.log") == {"step": 5, "checkpoint_step": 4}
    assert load_checkpoint(root / name / "last.pt")["step"] == 4
    assert [step for step, _ in _losses(root / name)] == [1, 2, 3, 4, 5]
    resume_run(root / name)
    _assert_same_run(uninterrupted[case][0], root / name)


def test_metrics_after_the_checkpoint_are_dropped_once_redone(tmp_path):
    from patchword.train.resuming import drop_metrics_after

    lines = [json.dumps({"split": "train", "step": s, "loss": float(s)}) for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"split": "tr')  # killed mid-write
    assert drop_metrics_after(tmp_path, 3) == 3
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
    ]
    assert drop_metrics_after(tmp_path, 3) == 0


def test_a_run_on_hugging_face_backbones_resumes_bit_for_bit(tiny_hf, laps_dataset, tmp_path):
    """Pretrained backbones train at lr x backbone_lr_mult: the resumed model must have the same two
    optimiser groups (it is rebuilt from backbones.json, not from the pretrained weights)."""
    args = [
        *tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path),
        "data.max_dense_len=48",
        "train.checkpoint_every=2",
        "train.eval_every=0",
        "train.log_every=1",
        f"output_dir={tmp_path / 'runs'}",
    ]
    train_run(apply_overrides(RunConfig(), [*args, "name=full", "train.max_steps=6"]))
    train_run(apply_overrides(RunConfig(), [*args, "name=cut", "train.max_steps=3"]))
    groups = load_checkpoint(tmp_path / "runs" / "cut" / "last.pt")["optimizer"]["param_groups"]
    assert [g["name"] for g in groups] == ["head", "backbone"]
    resume_run(tmp_path / "runs" / "cut", ["train.max_steps=6"])
    full, cut = tmp_path / "runs" / "full", tmp_path / "runs" / "cut"
    assert _losses(full) == _losses(cut) and len(_losses(full)) == 6
    a, b = load_checkpoint(full / "last.pt"), load_checkpoint(cut / "last.pt")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_train_seconds_count_every_session_of_a_resumed_run(tmp_path):
    """summary.json's train_seconds is the training time of all the run's sessions, as last.pt records it:
    f715cbc recorded only the last session's (a finished run resumed went from 14.79 s to 3.7e-05 s, an
    extension counted only itself)."""
    cfg = apply_overrides(
        RunConfig(),
        [*TINY, "model.matcher=vse", "train.max_steps=3", f"output_dir={tmp_path}", "name=timed"],
    )
    cfg.data.cache_dir = str(tmp_path / "cache")
    train_run(cfg)
    run = tmp_path / "timed"

    def recorded() -> tuple[float, float]:
        summary = json.loads((run / "summary.json").read_text())["train_seconds"]
        return summary, load_checkpoint(run / "last.pt")["train_seconds"]

    first, saved = recorded()
    assert first > 0 and first == saved
    resume_run(run)  # already finished: nothing to train, the time is kept
    again, saved = recorded()
    assert again >= first and saved == first
    resume_run(run, ["train.max_steps=5"])  # an extension adds its own time to the earlier sessions'
    longer, saved = recorded()
    assert longer >= again and longer == saved
    assert load_checkpoint(run / "last.pt")["step"] == 5
