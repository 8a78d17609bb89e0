"""``patchword export RUN OUT``: a self-contained model directory that ``load_run`` and ``create_model`` read
back bit for bit, offline, with a model card generated from the run."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY_MODEL_32, one_error_line, tiny_hf_laps_overrides
from patchword import create_model
from patchword.cli import main
from patchword.runs import load_run
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    args = [
        *TINY_MODEL_32,
        "model.seps.variant=paper",
        "data.num_train=20",
        "data.num_dev=8",
        "data.num_test=8",
    ]
    args += [
        "train.batch_size=16",
        "train.max_steps=2",
        "train.num_threads=1",
        f"data.cache_dir={root / 'c'}",
    ]
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(["train", *args, f"output_dir={root}", "name=run"]) == 0
    return root / "run"


def test_an_exported_model_loads_bit_for_bit_and_scores_as_the_run(trained, tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["export", str(trained), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.yaml",
        "metrics.json",
        "model.safetensors",
        "vocab.json",
    ]
    run = load_run(trained)
    assert _same(load_run(out).model, run.model)  # no checkpoints in the directory: its safetensors
    assert _same(create_model(str(out)), run.model)
    # the model card says what it is and what it scored, with the protocol
    card = (out / "README.md").read_text()
    summary = json.loads((trained / "summary.json").read_text())
    assert "`seps`" in card and "variant `paper`" in card and "leak-free" in card
    assert f"{summary['rsum']:.1f}" in card and "| test | 8 | 40 |" in card
    best_step = torch.load(trained / "best.pt", weights_only=True)["step"]
    assert f"`best.pt`: saved at training step {best_step} (the run trained {summary['steps']} steps)" in card
    # the exported directory evaluates like the run (same weights, same data section)
    capsys.readouterr()
    assert main(["eval", str(out), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["rsum"] == pytest.approx(summary["rsum"])
    # never overwritten
    assert main(["export", str(trained), str(out)]) == 2
    assert "exists" in one_error_line(capsys.readouterr().err)


def test_a_hugging_face_run_exports_its_bert_vocabulary(tiny_hf, laps_dataset, tmp_path):
    """The export carries the BERT vocabulary: it loads with the original backbone directories gone."""
    import shutil

    bert, vit = tiny_hf
    args = [
        *tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path),
        "train.max_steps=1",
        f"output_dir={tmp_path / 'runs'}",
        "name=hf",
    ]
    assert main(["train", *args]) == 0
    run_dir = tmp_path / "runs" / "hf"
    before = load_run(run_dir)
    assert main(["export", str(run_dir), str(tmp_path / "model")]) == 0
    shutil.rmtree(bert)
    shutil.rmtree(vit)
    (tmp_path / "vocab20.txt").unlink()
    exported = load_run(tmp_path / "model")
    assert _same(exported.model, before.model)
    ids, lens = exported.tokenize(["w1 w2 w3"])
    assert torch.equal(ids, before.tokenize(["w1 w2 w3"])[0])


def test_an_export_card_reports_the_evaluation_of_the_exported_checkpoint(trained, tmp_path, capsys):
    """f715cbc labelled summary.json's row (an evaluation of best.pt) "checkpoint last.pt" when last.pt was
    exported. Now: no evaluation of last.pt -> none shown, with the command that measures it; after
    ``patchword eval --checkpoint last.pt`` -> that evaluation; best.pt -> summary.json's."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    summary = json.loads((run / "summary.json").read_text())
    assert main(["export", str(run), str(tmp_path / "last1"), "--checkpoint", "last.pt"]) == 0
    record = json.loads((tmp_path / "last1" / "metrics.json").read_text())
    assert record["checkpoint"] == "last.pt" and record["metrics"] == {} and record["metrics_source"] is None
    card = (tmp_path / "last1" / "README.md").read_text()
    assert "No evaluation of checkpoint `last.pt`" in card and f"{summary['rsum']:.1f}" not in card
    assert f"`last.pt`: saved at training step {summary['steps']}" in card  # its own step, the run's last
    # evaluate last.pt, then export it again: the card is that evaluation
    assert main(["eval", str(run), "--checkpoint", "last.pt", "--out", str(run / "eval_test.json")]) == 0
    measured = json.loads((run / "eval_test.json").read_text())
    assert main(["export", str(run), str(tmp_path / "last2"), "--checkpoint", "last.pt"]) == 0
    record = json.loads((tmp_path / "last2" / "metrics.json").read_text())
    assert record["metrics_source"] == "eval_test.json" and record["metrics"]["rsum"] == measured["rsum"]
    assert f"{measured['rsum']:.1f}" in (tmp_path / "last2" / "README.md").read_text()
    # the default (best.pt) is what training evaluated
    assert main(["export", str(run), str(tmp_path / "best")]) == 0
    record = json.loads((tmp_path / "best" / "metrics.json").read_text())
    assert record["metrics_source"] == "summary.json" and record["metrics"]["rsum"] == summary["rsum"]


def test_report_and_export_find_the_evaluation_of_a_run_without_a_summary(trained, tmp_path):
    """A run without summary.json (an imported checkpoint) evaluated by ``patchword eval``: f715cbc's export
    wrote "No evaluation recorded" and its report an empty row."""
    import shutil

    from patchword.experiments.report import collect

    run = tmp_path / "imported"
    shutil.copytree(trained, run)
    for name in ("summary.json", "metrics.json"):
        (run / name).unlink(missing_ok=True)
    assert main(["eval", str(run)]) == 0
    measured = json.loads((run / "eval_test.json").read_text())
    (entry,) = collect([run])
    assert entry.value("rsum") == (pytest.approx(measured["rsum"]), None)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert record["metrics_source"] == "eval_test.json" and record["metrics"]["rsum"] == measured["rsum"]


def test_an_export_gets_the_permissions_of_a_run_directory(trained, tmp_path):
    """f715cbc's export (and import) directories were private (0700, from mkdtemp) while runs are 0755."""
    import stat

    assert main(["export", str(trained), str(tmp_path / "shared")]) == 0
    mode = stat.S_IMODE((tmp_path / "shared").stat().st_mode)
    assert mode == stat.S_IMODE(trained.stat().st_mode)  # what mkdir gives a run (0755 under umask 022)
