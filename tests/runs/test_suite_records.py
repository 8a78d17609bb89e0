"""The suites' records (``eval_compositional.json``, ``eval_patches.json``) carry what a recall record
carries to say what they measured (run, checkpoint path, step and digest, config hash, overrides, and the
suite files read), and :func:`~patchword.runs.recorded.suite_evaluation_of` trusts one only for the
checkpoint holding those bytes, with the run's present config and no overrides but neutral ones."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.runs import recorded
from patchword.runs.recorded import IDENTITY_FIELDS, evaluation_of, suite_evaluation_of
from patchword.runs.suites import evaluate_patch_suite, evaluate_suite
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")

#: What a recall record (eval_<split>.json) says about what it measured, under the same names.
IDENTITY = (
    "run_dir",
    "checkpoint",
    "checkpoint_step",
    "checkpoint_sha256",
    "config_hash",
    "overrides",
    "patchword_version",
    "time",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step run validated every step (best.pt and last.pt: two checkpoints), with its recall
    evaluation (eval_test.json) and both suites of best.pt."""
    root = tmp_path_factory.mktemp("suites")
    args = [*TINY_RUN_32, "model.seps.variant=paper", f"data.cache_dir={root / 'c'}", "progress=false"]
    run, steps = root / "r", ["train.max_steps=4", "train.eval_every=1", f"output_dir={root}", "name=r"]
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(["train", *args, *steps]) == 0
        assert main(["eval", str(run)]) == 0
        evaluate_suite(run, overrides=["progress=false"])
        evaluate_patch_suite(run)
    return run


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the trained run each test may change."""
    return shutil.copytree(trained, tmp_path / "r")


def _json(path) -> dict:
    return json.loads(path.read_text())


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_suite_records_carry_the_recall_records_identity_fields(trained):
    """They recorded the checkpoint's path and the config hash only: not its bytes, not the overrides."""
    recall = _json(trained / "eval_test.json")
    best = trained / "best.pt"
    for name in ("eval_compositional.json", "eval_patches.json"):
        record = _json(trained / name)
        assert set(IDENTITY) <= set(recall) and set(IDENTITY) <= set(record), name
        for key in ("run_dir", "checkpoint", "checkpoint_step", "checkpoint_sha256", "config_hash"):
            assert record[key] == recall[key], (name, key)
        assert record["checkpoint_sha256"] == _sha256(best)
        assert record["suite_files"] == []  # the synthetic suite / the patch probes read no files
    assert _json(trained / "eval_compositional.json")["overrides"] == ["progress=false"]
    assert _json(trained / "eval_patches.json")["overrides"] == []
    # what a reader of the figures skips: every identity field written, and no figure
    assert set(IDENTITY) | {"suite_files"} == IDENTITY_FIELDS
    compositional = _json(trained / "eval_compositional.json")
    assert set(compositional) - IDENTITY_FIELDS == {
        *compositional["n"],
        "n",
        "suite",
        "source",
        "image_root",
    } | {
        "matcher",
        "dense_text",
        "eval_seconds",
    }
    assert compositional["dense_text"] == "image-tied"  # SEPS, each synthetic image's own dense caption


def test_the_suite_record_of_the_best_checkpoint_is_found(trained):
    best = trained / "best.pt"
    record, name = suite_evaluation_of(trained, best, "compositional")
    assert name == "eval_compositional.json" and record == _json(trained / name)
    record, name = suite_evaluation_of(trained, "best.pt", "patches")  # a name in the run, as --checkpoint
    assert name == "eval_patches.json" and record["suite"] == "patches"
    # a suite record is no recall evaluation, nor a recall record a suite's
    assert evaluation_of(trained, best)[1] == "eval_test.json"
    assert suite_evaluation_of(trained, best, "other") == ({}, None)


def test_a_suite_of_another_checkpoint_is_not_the_runs_result(run):
    """The reviewer's case: ``--checkpoint last.pt`` wrote eval_compositional.json, which report and sweep
    then showed as the run's (best.pt) result."""
    assert _sha256(run / "last.pt") != _sha256(run / "best.pt")
    evaluate_suite(run, "last.pt", force=True)
    assert suite_evaluation_of(run, run / "best.pt", "compositional") == ({}, None)
    record, name = suite_evaluation_of(run, run / "last.pt", "compositional")
    assert name == "eval_compositional.json" and record["checkpoint_sha256"] == _sha256(run / "last.pt")


def test_a_suite_of_bytes_the_checkpoint_no_longer_holds_is_not_its_result(run):
    """Other weights copied over best.pt with its date kept: the suite record of best.pt is newer than the
    file, but of the bytes it held before."""
    shutil.copy2(run / "last.pt", run / "best.pt")
    (run / "eval_patches.json").touch()
    assert suite_evaluation_of(run, run / "best.pt", "patches") == ({}, None)


def test_a_suite_under_overrides_is_not_the_runs_result(run):
    """``data.synthetic_seed=3`` scores other scenes: not the run's result; a neutral override is."""
    evaluate_suite(run, overrides=["data.synthetic_seed=3"], force=True)
    assert _json(run / "eval_compositional.json")["overrides"] == ["data.synthetic_seed=3"]
    assert suite_evaluation_of(run, run / "best.pt", "compositional") == ({}, None)
    evaluate_suite(run, overrides=["eval.max_memory_mb=64"], out=run / "eval_compositional_2.json")
    assert suite_evaluation_of(run, run / "best.pt", "compositional")[1] == "eval_compositional_2.json"


def test_the_newest_trusted_record_wins_and_a_changed_config_or_checkpoint_drops_it(run):
    evaluate_suite(run, out=run / "eval_compositional_again.json")
    assert suite_evaluation_of(run, run / "best.pt", "compositional")[1] == "eval_compositional_again.json"
    with (run / "config.yaml").open("a") as f:
        f.write("\n# edited\n")
    assert suite_evaluation_of(run, run / "best.pt", "compositional") == ({}, None)


def test_a_suite_record_without_the_identity_fields_is_not_trusted(run):
    """Older versions wrote neither the digest nor the overrides: such a record proves nothing, whatever its
    date (evaluation_of's date fallback is for recall records only)."""
    for key in ("checkpoint_sha256", "overrides", "suite_files", "run_dir"):
        for name in ("eval_compositional.json", "eval_patches.json"):
            record = _json(run / name)
            kept = record.pop(key)
            (run / name).write_text(json.dumps(record))
            assert suite_evaluation_of(run, run / "best.pt", name[5:-5]) == ({}, None), key
            (run / name).write_text(json.dumps({**record, key: kept}))
        assert suite_evaluation_of(run, run / "best.pt", "patches")[1] == "eval_patches.json"


def test_a_checkpoint_outside_the_run_has_no_suite_record(run, tmp_path):
    outside = shutil.copy(run / "best.pt", tmp_path / "best.pt")
    assert suite_evaluation_of(run, outside, "compositional") == ({}, None)


def _suite_files(directory):
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), np.uint8)).save(directory / f"{i}.jpg")
    rows = [
        {"filename": "0.jpg", "caption": "a red circle", "negative_caption": "a blue circle"},
        {"filename": "1.jpg", "caption": "a large square", "negative_caption": "a small square"},
    ]
    (directory / "replace_att.json").write_text(json.dumps(rows))
    return [directory / "replace_att.json"]


def test_suite_files_are_recorded_with_their_digests_and_chosen_by_them(run, tmp_path):
    files = _suite_files(tmp_path)
    evaluate_suite(run, suite_files=files, image_root=tmp_path, force=True)
    record = _json(run / "eval_compositional.json")
    assert record["suite_files"] == [{"path": str(files[0]), "sha256": _sha256(files[0])}]
    assert record["image_root"] == str(tmp_path) and record["overrides"] == []
    best = run / "best.pt"
    assert suite_evaluation_of(run, best, "compositional")[1] == "eval_compositional.json"  # any source
    assert suite_evaluation_of(run, best, "compositional", suite_files=files)[1] == "eval_compositional.json"
    # the run's own synthetic suite (what sweep --suite scores) is another measurement
    assert suite_evaluation_of(run, best, "compositional", suite_files=[]) == ({}, None)
    files[0].write_text(files[0].read_text().replace("red", "green"))  # the file now holds other triples
    assert suite_evaluation_of(run, best, "compositional", suite_files=files) == ({}, None)


def test_the_checkpoint_is_hashed_once_per_lookup(run, monkeypatch):
    calls = []
    real = recorded.file_sha256
    monkeypatch.setattr(recorded, "file_sha256", lambda path: calls.append(path) or real(path))
    evaluate_suite(run, out=run / "eval_compositional_b.json")
    calls.clear()
    assert suite_evaluation_of(run, run / "best.pt", "compositional")[0]
    assert len(calls) == 1
