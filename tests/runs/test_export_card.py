"""What an export's model card and ``metrics.json`` say about the exported checkpoint: its own evaluation
(never another checkpoint's), its own training step, and the hash of the ``config.yaml`` beside it."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from conftest import TINY_RUN_32, one_error_line, tiny_hf_laps_overrides
from patchword.cli import main
from patchword.runs import config_hash, load_run
from patchword.runs.recorded import evaluation_of
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(root, name: str, *extra: str):
    args = [*TINY_RUN_32, "model.seps.variant=paper", f"data.cache_dir={root / 'c'}", "progress=false"]
    assert main(["train", *args, *extra, f"output_dir={root}", f"name={name}"]) == 0
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``run``: 6 steps, validated every step (its best.pt holds earlier weights); ``other``: another seed."""
    root = tmp_path_factory.mktemp("card")
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        run = _train(root, "run", "train.max_steps=6", "train.eval_every=1")
        other = _train(root, "other", "train.max_steps=2", "seed=1")
    return run, other


def _record(out) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_export_refuses_a_checkpoint_outside_the_run_instead_of_showing_the_runs_metrics(
    runs, tmp_path, capsys, monkeypatch
):
    """The card of ``export RUN OUT --checkpoint OTHER/best.pt`` showed RUN's summary.json (its best.pt's
    rSum) beside OTHER's weights, as "checkpoint best.pt of the run". An export pairs the weights with the
    run's config, vocabulary and evaluations, so another run's checkpoint is refused: one line, exit 2,
    nothing written."""
    run, other = runs
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--checkpoint", str(other / "best.pt")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--checkpoint" in line and str(other / "best.pt") in line and "not a file of" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    # nor does the library attribute the run's recorded evaluations to it
    assert evaluation_of(run, other / "best.pt") == ({}, None)
    # a relative name is the run's own file, even where the working directory holds one of that name
    monkeypatch.chdir(other)
    assert main(["export", str(run), str(out), "--checkpoint", "best.pt"]) == 0
    assert _record(out)["checkpoint"] == "best.pt" and _record(out)["metrics_source"] == "summary.json"
    exported = load_run(out).model.state_dict()
    own = torch.load(runs[0] / "best.pt", weights_only=True)["model"]
    assert all(torch.equal(exported[k], own[k]) for k in own)


def test_an_eval_file_of_another_runs_checkpoint_is_not_the_evaluation_of_the_runs_best_pt(runs, tmp_path):
    """``patchword eval RUN --checkpoint OTHER/best.pt`` writes RUN/eval_test.json with RUN's config hash;
    its checkpoint is also called best.pt, and evaluation_of matched by that name: RUN's best.pt was
    exported with OTHER's numbers."""
    run = shutil.copytree(runs[0], tmp_path / "run")
    other = runs[1]
    assert main(["eval", str(run), "--checkpoint", str(other / "best.pt")]) == 0
    foreign = json.loads((run / "eval_test.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert foreign["rsum"] != summary["rsum"]  # the two checkpoints score differently
    record, source = evaluation_of(run, run / "best.pt", "test")
    assert source == "summary.json" and record["rsum"] == summary["rsum"]
    # an evaluation of the run's own best.pt (named relative to the run directory it names) is found
    assert main(["eval", str(run), "--out", str(run / "eval_test.json"), "--force"]) == 0
    record, source = evaluation_of(run, run / "best.pt", "test")
    assert source == "eval_test.json" and record["rsum"] == pytest.approx(summary["rsum"])


def test_summary_json_does_not_describe_a_best_pt_holding_another_dev_rsum(runs, tmp_path):
    """A best.pt replaced by other weights with its date kept (``cp -p``) passed the date check and got
    the summary's numbers; the dev rSum best.pt records must be the summary's best_dev_rsum."""
    run = shutil.copytree(runs[0], tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    assert evaluation_of(run, run / "best.pt")[1] == "summary.json"
    state = torch.load(run / "best.pt", weights_only=True)
    state["metrics"]["rsum"] = summary["best_dev_rsum"] + 1.0
    torch.save(state, run / "best.pt")
    dated = (run / "summary.json").stat().st_mtime - 60
    os.utime(run / "best.pt", (dated, dated))
    assert evaluation_of(run, run / "best.pt") == ({}, None)


def test_the_card_gives_the_exported_checkpoints_step_not_the_runs(runs, tmp_path):
    """The card said ``steps: 6`` (the run's) for a best.pt saved at step 4."""
    run = runs[0]
    steps = json.loads((run / "summary.json").read_text())["steps"]
    best_step = torch.load(run / "best.pt", weights_only=True)["step"]
    assert best_step < steps == 6  # validated every step, the best dev rSum came before the last
    out = tmp_path / "best"
    assert main(["export", str(run), str(out)]) == 0
    assert (_record(out)["checkpoint_step"], _record(out)["run_steps"]) == (best_step, steps)
    card = (out / "README.md").read_text()
    assert f"* checkpoint `best.pt`: saved at training step {best_step} (the run trained 6 steps)" in card
    assert "steps: 6" not in card
    assert main(["export", str(run), str(tmp_path / "last"), "--checkpoint", "last.pt"]) == 0
    assert "`last.pt`: saved at training step 6" in (tmp_path / "last" / "README.md").read_text()


def test_a_bert_exports_recorded_config_hash_is_the_hash_of_its_config_yaml(tiny_hf, laps_dataset, tmp_path):
    """The export rewrites data.bert_vocab in its config.yaml but recorded the source run's hash: a user
    comparing config_hash(export) with metrics.json found them different. Now config_hash is the
    directory's own, and the source run's (which its evaluations name) is labelled as such."""
    args = [*tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), "train.max_steps=1"]
    assert main(["train", *args, f"output_dir={tmp_path / 'runs'}", "name=hf"]) == 0
    run, out = tmp_path / "runs" / "hf", tmp_path / "model"
    assert main(["export", str(run), str(out)]) == 0
    record = _record(out)
    assert config_hash(out) != config_hash(run)  # the vocabulary path was rewritten
    assert (record["config_hash"], record["source_config_hash"]) == (config_hash(out), config_hash(run))
    card = (out / "README.md").read_text()
    assert f"config hash `{config_hash(out)}` (this directory's `config.yaml`" in card
    assert f"the source run's, which its evaluations name: `{config_hash(run)}`" in card
