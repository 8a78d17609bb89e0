"""What a run reports beside recall: patch-selection quality on the synthetic scenes (in the summary and
in ``patchword eval``) and the compositional suite (``patchword eval RUN --suite compositional``)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY_MODEL_32
from patchword.cli import main
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "data.num_train=20",
    "data.num_dev=12",
    "data.num_test=12",
    *TINY_MODEL_32,
    "model.seps.variant=paper",
    "train.batch_size=16",
    "train.max_steps=2",
    "train.num_threads=1",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suites")
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(["train", *TINY, f"output_dir={tmp}", "name=r", f"data.cache_dir={tmp / 'cache'}"]) == 0
    return tmp / "r"


def test_summary_reports_selection_quality_per_branch(run):
    summary = json.loads((run / "summary.json").read_text())
    recall, chance = summary["selection_object_recall"], summary["selection_chance"]
    assert set(recall) == set(chance) == {"caption", "dense"}
    # K = ceil(16 * 0.5) = 8 of 16 patches kept: chance is exactly half of every image's patches
    assert chance == {"caption": 50.0, "dense": 50.0}
    assert all(0 <= v <= 100 for v in recall.values())
    evaluated = run / "eval_test.json"
    assert main(["eval", str(run), "--out", str(evaluated)]) == 0
    assert json.loads(evaluated.read_text())["selection_object_recall"] == recall  # the same checkpoint


def test_compositional_suite_writes_accuracies_per_kind(run, capsys):
    assert main(["eval", str(run), "--suite", "compositional"]) == 0
    result = json.loads((run / "eval_compositional.json").read_text())
    kinds = ("attribute_swap", "relation_swap", "object_replace", "count_change")
    assert set(result["n"]) == set(kinds) and sum(result["n"].values()) > 0
    for kind in kinds:
        assert result[kind] is None if result["n"][kind] == 0 else 0 <= result[kind] <= 100
    printed = capsys.readouterr()  # stdout: the record (| jq); the table and `written:` on stderr
    assert json.loads(printed.out) == result
    assert (
        "attribute_swap" in printed.err
        and "written: " in printed.err
        and "eval_compositional.json" in printed.err
    )
    assert main(["eval", str(run), "--suite", "compositional"]) == 2  # never overwritten silently


def test_patches_suite_probes_the_runs_image_encoder(tmp_path, capsys):
    from patchword.eval.patch_probe import synthetic_patch_probe
    from patchword.runs import load_run

    # 4-pixel patches: objects of the 32-pixel scenes cover whole patches (8-pixel patches never are half
    # object at this size, and the probes would have nothing to tell apart)
    args = [*TINY, "model.tiny_vit.patch_size=4", f"output_dir={tmp_path}", "name=r", "data.num_train=40"]
    assert main(["train", *args, f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    run = tmp_path / "r"
    capsys.readouterr()  # training's summary
    assert main(["eval", str(run), "--suite", "patches"]) == 0
    result = json.loads((run / "eval_patches.json").read_text())
    printed = capsys.readouterr()  # stdout: the record (| jq); the table and `written:` on stderr
    assert json.loads(printed.out) == result
    assert "patch-word grounding" in printed.err and "eval_patches.json" in printed.err
    for task, classes in (("object", 2), ("shape", 5), ("colour", 8)):
        assert 2 <= result[task]["classes"] <= classes and 0 <= result[task]["accuracy"] <= 100
        assert result[task]["balanced_chance"] == 100 / result[task]["classes"]
    assert result["images"] == {"train": 40, "test": 12} and result["scenes"] == "simple"
    assert all(0 <= result["grounding"][k] <= 100 for k in ("colour_auc", "shape_auc"))
    # the command is the library function on the run's own encoders and tokenizer
    loaded = load_run(run)
    dc = loaded.config.data
    direct = synthetic_patch_probe(
        loaded.model, dc.synthetic_config(), loaded.tokenizer, cache_dir=dc.cache_dir
    )
    assert direct["grounding"] == pytest.approx(result["grounding"])
    assert direct["object"] == result["object"]
    assert main(["eval", str(run), "--suite", "patches"]) == 2  # never overwritten silently
