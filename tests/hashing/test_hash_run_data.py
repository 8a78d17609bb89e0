"""The data of a trained hashing run: its config.yaml names them by absolute paths, its last.pt records
their rows and sha256, so ``hash eval`` / ``hash train --resume`` tell the run's data (moved, copied) from
changed data (rows added, contents replaced); a non-finite loss and metrics without relevant items are
said in one line / strict JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import one_error_line
from patchword.checkpoint import atomic_save, load_checkpoint
from patchword.cli.hash import main
from patchword.hashing.build import build_hashing_model
from patchword.hashing.config import HashEvalConfig, HashModelConfig
from patchword.hashing.dataset import HashDataset, HashSplit
from patchword.hashing.evaluate import evaluate_hashing

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--bits", "8", "--epochs", "1", "model.hidden=16", "model.dim_feedforward=16", "model.nhead=2"]
SMALL += ["model.num_layers=1", "train.batch_size=8", "data.num_query=10", "data.num_train=20", "eval.ks=[1]"]


def _save(folder: Path, rows: int = 40, seed: int = 0, scale: float = 1.0, labels=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    np.save(folder / "img.npy", (scale * rng.standard_normal((rows, 8))).astype(np.float32))
    np.save(folder / "txt.npy", (scale * rng.standard_normal((rows, 8))).astype(np.float32))
    if labels is not None:
        np.save(folder / "lab.npy", labels)


def _train(tmp_path: Path, folder: Path, *extra: str) -> Path:
    argv = ["train", *SMALL, "--output-dir", str(tmp_path / "runs"), "--name", "r", "--data", "pairs"]
    argv += ["--image", str(folder / "img.npy"), "--text", str(folder / "txt.npy"), *extra]
    assert main(argv) == 0
    return tmp_path / "runs" / "r"


def _paths(folder: Path) -> list[str]:
    return [f"data.image={folder / 'img.npy'}", f"data.text={folder / 'txt.npy'}"]


@pytest.fixture
def run(tmp_path, capsys) -> Path:
    """A run trained on 40 pairs of tmp/d (10 query pairs, 20 training pairs, split seed 0)."""
    _save(tmp_path / "d")
    run = _train(tmp_path, tmp_path / "d")
    capsys.readouterr()
    return run


@pytest.mark.parametrize("change", ["rows_added", "contents"])
def test_eval_refuses_changed_data_of_the_run(run, tmp_path, capsys, change):
    """Defect: a row added to the run's files re-shuffled its seed-0 split (training pairs in the query set)
    and same-shape new contents gave another mAP, both evaluated silently as the run's."""
    _save(tmp_path / "d", rows=41) if change == "rows_added" else _save(tmp_path / "d", seed=5)
    out = tmp_path / "e.json"
    assert main(["eval", str(run), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: data.image: data.image ({tmp_path / 'd' / 'img.npy'}), data.text (")
    assert f"changed since {run} trained on it" in line and "query set" in line
    assert "or evaluate other data on purpose" in line
    assert not out.exists()
    # hash search refuses it as well, saying what it would do instead (old code: "evaluate other data")
    search = ["search", str(run), "--modality", "image", "--query-index", "0", "--k", "2"]
    assert main(search) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"changed since {run} trained on it" in line and "or search other data on purpose" in line


def test_eval_refuses_a_resplit_of_a_copy_of_the_runs_data(run, tmp_path, capsys):
    """Defect: the re-split guard compared paths: the run's files copied elsewhere were re-split freely."""
    shutil.copytree(tmp_path / "d", tmp_path / "copy")
    assert main(["eval", str(run), *_paths(tmp_path / "copy"), "data.split_seed=1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.split_seed: cannot change on hash eval of a trained run (0 -> 1)")


def test_eval_says_when_it_read_other_data_than_the_runs(run, tmp_path, capsys):
    """A copy of the run's data is its data; other data given on purpose are marked so in the data block."""
    shutil.copytree(tmp_path / "d", tmp_path / "copy")
    assert main(["eval", str(run), *_paths(tmp_path / "copy")]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert "same_data_as_run" not in data and data["fingerprint"]["rows"] == 40
    _save(tmp_path / "other", rows=30, seed=3)
    assert main(["eval", str(run), *_paths(tmp_path / "other")]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["same_data_as_run"] is False and data["fingerprint"]["rows"] == 30


def test_resume_refuses_changed_data_and_takes_moved_data(run, tmp_path, capsys):
    """Defect: ``--resume`` trained on whatever the files held then (no bit-for-bit resume), and refused
    ``data.image=NEW`` for the same data moved."""
    _save(tmp_path / "d", seed=5)
    assert main(["train", "--resume", str(run), "train.epochs=2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: data.image: data.image ({tmp_path / 'd' / 'img.npy'}), data.text (")
    assert "differ(s) from the data" in line and "a resumed run trains on its own data" in line
    _save(tmp_path / "d")  # the run's data again, then moved
    (tmp_path / "d").rename(tmp_path / "moved")
    assert main(["train", "--resume", str(run), "train.epochs=2", *_paths(tmp_path / "moved")]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == 2
    # the next resume reads the data where the last one found them (recorded in last.pt)
    assert main(["train", "--resume", str(run), "train.epochs=3"]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == 3


def test_eval_and_search_read_the_data_where_the_last_resume_found_them(tmp_path, capsys):
    """Defect: config.yaml is never rewritten, so after ``--resume ... data.image=NEW`` every ``hash eval``
    needed ``data.image=NEW`` again (the old place: "does not exist"), and ``hash search``, which takes no
    overrides, could not run at all. They read last.pt's record, as the next resume does."""
    _save(tmp_path / "d")
    run = _train(tmp_path, tmp_path / "d", "model.fusion=unimodal")
    assert main(["eval", str(run), "--out", str(tmp_path / "before.json")]) == 0
    (tmp_path / "d").rename(tmp_path / "moved")
    assert main(["train", "--resume", str(run), "train.epochs=2", *_paths(tmp_path / "moved")]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data["fingerprint"]["rows"] == 40 and "same_data_as_run" not in data
    search = ["search", str(run), "--modality", "image", "--query-index", "0", "--k", "2"]
    assert main(search) == 0
    assert len(json.loads(capsys.readouterr().out)["results"][0]["indices"]) == 2
    # the run's data, for the re-split refusal too: a split seed other than the run's is refused
    assert main(["eval", str(run), "data.split_seed=1"]) == 2
    assert "cannot change on hash eval of a trained run" in one_error_line(capsys.readouterr().err)
    # once gone from there too, the error names last.pt, where the place was read
    (tmp_path / "moved").rename(tmp_path / "gone")
    assert main(["eval", str(run)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: data.image: {tmp_path / 'moved' / 'img.npy'} does not exist (from {run / 'last.pt'}); "
        "point data.image=NEW at it"
    )


def test_a_missing_data_file_names_its_key_and_the_runs_config(run, tmp_path, capsys):
    """Defect: ``error: .npy file dm/img.npy does not exist`` named neither data.image nor the run."""
    (tmp_path / "d").rename(tmp_path / "moved")
    for argv in (["eval", str(run)], ["train", "--resume", str(run), "train.epochs=2"]):
        assert main(argv) == 2
        assert one_error_line(capsys.readouterr().err) == (
            f"error: data.image: {tmp_path / 'd' / 'img.npy'} does not exist (from {run / 'config.yaml'}); "
            "point data.image=NEW at it"
        )


def test_the_run_records_absolute_data_paths(tmp_path, monkeypatch, capsys):
    """Defect: config.yaml kept the paths as typed: from another folder eval read nothing."""
    _save(tmp_path / "d")
    monkeypatch.chdir(tmp_path)
    argv = ["train", *SMALL, "--output-dir", "runs", "--name", "r", "--data", "pairs"]
    assert main([*argv, "--image", "d/img.npy", "--text", "d/txt.npy"]) == 0
    saved = yaml.safe_load((tmp_path / "runs" / "r" / "config.yaml").read_text())["data"]
    assert (saved["image"], saved["text"]) == (
        str(tmp_path / "d" / "img.npy"),
        str(tmp_path / "d" / "txt.npy"),
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "r")]) == 0


def test_a_run_without_a_fingerprint_keeps_the_old_behaviour(run, tmp_path, capsys):
    """A last.pt saved before the fingerprint existed: eval trusts the run's paths; a resume cannot check
    moved data, so it refuses them."""
    state = load_checkpoint(run / "last.pt", map_location="cpu")
    del state["data_fingerprint"]
    atomic_save(state, run / "last.pt")
    _save(tmp_path / "d", seed=5)
    assert main(["eval", str(run)]) == 0
    capsys.readouterr()
    shutil.copytree(tmp_path / "d", tmp_path / "moved")
    assert main(["train", "--resume", str(run), "train.epochs=2", *_paths(tmp_path / "moved")]) == 2
    assert "records no fingerprint of its data" in one_error_line(capsys.readouterr().err)


def test_a_non_finite_loss_is_one_line(tmp_path, capsys):
    """Defect: features of magnitude 1e30 (finite) ended in a FloatingPointError traceback (exit 1)."""
    _save(tmp_path / "d", scale=1e30)
    argv = ["train", *SMALL, "--output-dir", str(tmp_path / "runs"), "--name", "r", "--data", "pairs"]
    argv += ["--image", str(tmp_path / "d" / "img.npy"), "--text", str(tmp_path / "d" / "txt.npy")]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: non-finite loss in epoch 1 (steps 1-2): normalise the features")
    assert "lower train.lr_encoder / train.lr_heads" in line and line.endswith("no checkpoint was kept")
    assert not (tmp_path / "runs" / "r").exists()


def test_metrics_without_relevant_items_are_strict_json():
    """Defect: queries none of which had a relevant item printed a bare NaN recall (not JSON), and the
    count of such queries was computed but never reported."""
    rng = np.random.default_rng(0)

    def split(n, label):
        labels = np.zeros((n, 2), np.uint8)
        labels[:, label] = 1
        feats = [rng.standard_normal((n, 8)).astype(np.float32) for _ in range(2)]
        return HashSplit(*feats, labels, np.arange(n))

    # the queries' label is nobody's in the database
    data = HashDataset(split(6, 1), split(3, 0), split(6, 1))
    model = build_hashing_model(
        HashModelConfig(bits=8, hidden=16, dim_feedforward=16, nhead=2, num_layers=1), 8, 8
    )
    metrics = evaluate_hashing(model, data, HashEvalConfig(ks=[1], topk=5))

    def refuse(name):
        raise ValueError(f"bare {name} in the JSON")

    metrics = json.loads(json.dumps(metrics), parse_constant=refuse)
    assert metrics["i2t_r@1"] is None and metrics["t2i_r@1"] is None
    assert metrics["i2t_queries_without_relevant"] == metrics["t2i_queries_without_relevant"] == 3
