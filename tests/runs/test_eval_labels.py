"""What ``patchword eval`` records and refuses says what ran (reviewer's findings on runs for a paper): the
compositional suite's dense text, a ``precision`` evaluation does not read, the dtype an fp64 evaluation ran
in, the synthetic train split as a test split, overrides after ``--ensemble`` and the fields its members
share, and the documented import example (benchmarks/official_seps_checkpoint.py) evaluated end to end."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.runs.ensemble import shared_split
from patchword.train.process import torch_threads
from project_paths import BENCHMARKS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny SEPS runs (seeds 0 and 1, two steps each) sharing their synthetic data."""
    root = tmp_path_factory.mktemp("runs")
    args = [*TINY_RUN_32, "train.max_steps=2", "progress=false", f"data.cache_dir={root / 'cache'}"]
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        for seed in (0, 1):
            assert main(["train", *args, f"seed={seed}", f"output_dir={root}", f"name=r{seed}"]) == 0
    return root / "r0", root / "r1"


def test_a_suite_file_scored_without_dense_text_says_so(two_runs, tmp_path, capsys):
    """SEPS on SugarCrepe files (no dense text) was scored in its sparse mode with one log WARNING; the
    JSON and the printed table read like any other."""
    run = two_runs[0]
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), np.uint8)).save(tmp_path / f"{i}.png")
    triples = [
        {"filename": "0.png", "caption": "a red circle", "negative_caption": "a blue circle"},
        {"filename": "1.png", "caption": "a small square", "negative_caption": "a large square"},
    ]
    (tmp_path / "swap_obj.json").write_text(json.dumps(triples))
    out = tmp_path / "sugar.json"
    assert main(["eval", str(run), "--suite-file", str(tmp_path / "swap_obj.json"), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["dense_text"] == "none"
    printed = capsys.readouterr().err  # the table is on stderr: stdout is the record (| jq)
    assert "dense text: none: the matcher reads dense text but none was given" in printed
    out = tmp_path / "synthetic.json"
    assert main(["eval", str(run), "--suite", "compositional", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["dense_text"] == "image-tied"
    assert "dense text: image-tied (each image's own dense caption)" in capsys.readouterr().err


@pytest.mark.parametrize("precision", ["amp_bf16", "amp_fp16", "bf16"])
def test_a_precision_evaluation_does_not_read_is_refused(two_runs, tmp_path, capsys, precision):
    """Accepted and ignored: the record listed precision=amp_bf16 beside eval_precision fp32."""
    out = tmp_path / "e.json"
    assert main(["eval", str(two_runs[0]), f"precision={precision}", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    why = f"(precision={precision}: evaluation runs no autocast"
    assert line.startswith(f"error: precision: does not apply to an evaluation {why}")
    assert "eval.precision chooses the scoring's matrix products" in line and not out.exists()


def test_an_fp64_evaluation_records_the_dtype_its_model_ran_in(two_runs, tmp_path):
    run = two_runs[0]
    assert main(["eval", str(run), "precision=fp64", "--out", str(tmp_path / "fp64.json")]) == 0
    assert main(["eval", str(run), "--out", str(tmp_path / "fp32.json")]) == 0
    fp64, fp32 = (json.loads((tmp_path / f"{p}.json").read_text()) for p in ("fp64", "fp32"))
    assert (fp64["model_dtype"], fp64["eval_precision"]) == ("float64", "fp32")
    assert (fp32["model_dtype"], fp32["eval_precision"]) == ("float32", "fp32")


def test_the_synthetic_train_split_is_evaluated_as_a_test_split(two_runs, tmp_path):
    """error: not enough values to unpack (expected 2, got 0): the oracle of the train split, whose fits
    matrix is never built."""
    out = tmp_path / "train.json"
    assert main(["eval", str(two_runs[0]), "data.test_split=train", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["split_use"] == "training" and record["images"] == 20 and record["rsum"] > 0
    assert record["oracle_rsum"] is None  # no bound without the split's fits matrix


def test_overrides_after_ensemble_apply(two_runs, tmp_path):
    """error: run directory eval.max_memory_mb=64 does not exist: --ensemble took every argument."""
    a, b = two_runs
    out = tmp_path / "ens.json"
    argv = ["eval", str(a), "--out", str(out), "--ensemble", str(b), "eval.max_memory_mb=64"]
    assert main(argv) == 0
    record = json.loads(out.read_text())
    assert record["overrides"] == ["eval.max_memory_mb=64"] and len(record["ensemble"]) == 2


def test_an_ensemble_record_has_the_fields_its_members_share(two_runs, tmp_path):
    """The ensemble's record lacked images, captions, known_captions, eval_precision and dense_pairing."""
    a, b = two_runs
    out = tmp_path / "ens.json"
    assert main(["eval", str(a), "eval.max_memory_mb=64", "--out", str(out), "--ensemble", str(b)]) == 0
    record = json.loads(out.read_text())
    member = record["ensemble"][0]
    for key in ("images", "captions", "known_captions", "eval_precision", "dense_pairing", "model_dtype"):
        assert key in record and record[key] == member[key] == record["ensemble"][1][key], key
    assert (record["images"], record["captions"], record["eval_precision"]) == (8, 40, "fp32")


def test_an_ensemble_with_a_member_selected_on_the_test_split_is_not_held_out(two_runs, tmp_path):
    """The record took member 0's split_use (None: held out) when the other member had chosen its
    checkpoint on the same test captions (data.dev_split=test)."""
    root = two_runs[0].parent
    args = [*TINY_RUN_32, "train.max_steps=2", "progress=false", f"data.cache_dir={root / 'cache'}"]
    argv = ["train", *args, "seed=2", "data.dev_split=test", f"output_dir={tmp_path}", "name=selected"]
    assert main(argv) == 0
    out = tmp_path / "ens.json"
    assert main(["eval", str(two_runs[0]), "--out", str(out), "--ensemble", str(tmp_path / "selected")]) == 0
    record = json.loads(out.read_text())
    assert [m["split_use"] for m in record["ensemble"]] == [None, "model selection"]
    assert (record["split"], record["data_split"], record["split_use"]) == ("test", "test", "model selection")


def test_shared_split_names_every_members_split_and_the_least_held_out_use():
    held, chosen, trained = (
        {"split": "test", "data_split": name, "split_use": use}
        for name, use in (("test", None), ("test5k", "model selection"), ("test", "training"))
    )
    assert shared_split([held, held]) == held
    assert shared_split([held, chosen]) == {
        "split": "test",
        "data_split": "test / test5k",
        "split_use": "model selection",
    }
    assert shared_split([chosen, trained, held])["split_use"] == "training"


def test_ensemble_followed_by_overrides_only_is_refused(two_runs, capsys):
    assert main(["eval", str(two_runs[0]), "--ensemble", "eval.max_memory_mb=64"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == "error: --ensemble: names no run directory (eval.max_memory_mb=64: overrides, not runs)"


def test_suite_file_followed_by_overrides_only_is_refused(two_runs, capsys):
    """--suite-file takes every argument after it, as --ensemble does: an override there was read as a
    suite file that does not exist."""
    assert main(["eval", str(two_runs[0]), "--suite-file", "eval.max_memory_mb=64"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line == "error: --suite-file: names no suite file (eval.max_memory_mb=64: overrides, not suite files)"
    )


def test_the_documented_import_example_evaluates(tmp_path, monkeypatch):
    """docs/models.md's worked example: the script wrote the dev split as a copy of the test split, and
    eval refuses a test split sharing images with dev."""
    spec = importlib.util.spec_from_file_location(
        "official_example", BENCHMARKS / "official_seps_checkpoint.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    official = tmp_path / "official"
    monkeypatch.setattr(sys, "argv", ["official_seps_checkpoint.py", "--out", str(official)])
    script.main()
    data = official / "data"
    run = tmp_path / "runs" / "imported"
    argv = ["import", str(official / "model_best.pth"), "--out", str(run), "--family", "seps"]
    argv += ["--hf-vision", str(official / "hf" / "vit"), "--hf-text", str(official / "hf" / "bert")]
    argv += [f"data.root={data}", f"data.image_root={data / 'images'}"]
    argv += [f"data.dense_train={data / 'train.jsonl'}", f"data.dense_test={data / 'test.jsonl'}"]
    assert main(argv) == 0
    assert main(["eval", str(run), "progress=false"]) == 0
    record = json.loads((run / "eval_test.json").read_text())
    # the figure docs/models.md quotes: the test split is the one the script always wrote
    assert (record["images"], round(record["rsum"], 1)) == (12, 243.3)
    ids = {split: set((data / f"{split}_ids.txt").read_text().split()) for split in ("train", "dev", "test")}
    assert not ids["dev"] & ids["test"] and not ids["dev"] & ids["train"] and len(ids["dev"]) == 8
    assert not (data / "dev.jsonl").exists()  # the SEPS release has no dev dense captions
