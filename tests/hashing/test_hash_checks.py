"""Values and data ``patchword hash train|eval|search`` must refuse, or notice, before they do any work:
every numeric config key out of its range (one line naming it, exit 2, nothing written), the same checks on
``hash eval``'s overrides, training sets without a contrastive batch, empty query files, and cached search
indexes built from other retrieval features."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main
from patchword.hashing import retrieval_report

pytestmark = pytest.mark.usefixtures("one_thread")

# TINY_HASH for files: the data.synthetic_* keys shape generated features only, so they are refused
FILES = [o for o in TINY_HASH if not o.startswith("data.synthetic_")]
# and for pre-split files, which decide the splits, the keys that split pairs too
PRE_SPLIT = [o for o in FILES if not o.startswith(("data.num_query=", "data.num_train="))]


@pytest.fixture(scope="module")
def run(hash_run) -> Path:
    """A trained 16-bit UCMFH run on tiny synthetic data (32-d image and text features)."""
    return hash_run


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("eval.ks=[0]", "eval.ks"),  # found only by the metrics, after training
        ("eval.ks=[]", "eval.ks"),
        ("data.num_query=0", "data.num_query"),
        ("data.num_train=1", "data.num_train"),  # one pair: every batch dropped, "steps 0", exit 0
        ("data.num_train=200", "data.num_train"),  # more than the 96 synthetic retrieval pairs
        ("data.synthetic_num_retrieval=0", "data.synthetic_num_retrieval"),
        ("data.synthetic_image_dim=0", "data.synthetic_image_dim"),
        ("model.eval_batch_size=0", "model.eval_batch_size"),
        ("model.nhead=0", "model.nhead"),  # ZeroDivisionError
        ("model.nhead=3", "model.nhead"),  # does not divide the 32-d features
        ("model.num_layers=0", "model.num_layers"),  # IndexError, after config.yaml was written
        ("model.num_layers=-1", "model.num_layers"),
        ("model.hidden=0", "model.hidden"),
        ("model.dim_feedforward=0", "model.dim_feedforward"),
        ("train.save_every=-1", "train.save_every"),
        ("train.hash_weight=-1", "train.hash_weight"),
        ("train.feature_weight=-0.5", "train.feature_weight"),
        ("train.weight_decay=-1", "train.weight_decay"),
        ("train.hashnet_alpha=-1", "train.hashnet_alpha"),
    ],
)
def test_hash_train_checks_every_numeric_key_before_anything_is_written(tmp_path, capsys, override, key):
    out = tmp_path / "runs"
    argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", "r", *TINY_HASH]
    assert main([*argv, override]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}:")
    assert not out.exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("eval.topk=0", "eval.topk"),  # printed "i2t_map@0": 0.0
        ("eval.topk=-5", "eval.topk"),  # printed a "map@-5" that was mAP@45, exit 0
        ("eval.ks=[0]", "eval.ks"),
        ("eval.ks=[]", "eval.ks"),
        ("model.eval_batch_size=0", "model.eval_batch_size"),
        ("data.num_query=0", "data.num_query"),
    ],
)
def test_hash_eval_checks_its_overrides_as_training_does(run, capsys, override, key):
    assert main(["eval", str(run), override]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}:")


@pytest.mark.parametrize("map_k", [0, -5])
def test_retrieval_report_refuses_a_map_cut_off_below_one(map_k):
    codes = np.sign(np.random.default_rng(0).standard_normal((6, 8))).astype(np.int8)
    ids = np.arange(6)
    with pytest.raises(ValueError, match=f"map_k must be >= 1.*got {map_k}"):
        retrieval_report(codes, codes, ids, ids, map_k=map_k, ks=[1])


def test_a_training_set_of_one_pair_is_refused_naming_the_keys(tmp_path, capsys, monkeypatch):
    """Defect: 120 pairs without labels, data.num_query=119: one training pair, every batch was dropped and
    the run reported steps 0 with exit 0."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.save("image.npy", rng.standard_normal((120, 32)).astype(np.float32))
    np.save("text.npy", rng.standard_normal((120, 32)).astype(np.float32))
    data = ["--data", "pairs", "--image", "image.npy", "--text", "text.npy"]
    argv = [
        "train",
        "--bits",
        "16",
        "--epochs",
        "1",
        "--output-dir",
        "runs",
        "--name",
        "r",
        *FILES,
        *data,
    ]
    assert main([*argv, "data.num_query=119", "data.num_train=5"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.num_query: data.num_query=119 of the 120 pairs of")
    assert "leaves 1 training pair(s) (data.num_train=5)" in line
    assert not (tmp_path / "runs").exists()
    assert main([*argv, "data.num_query=120"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: data.num_query: must lie in [1, 119]")


def test_a_split_file_with_one_training_pair_is_refused_naming_it(tmp_path, capsys):
    root = tmp_path / "sp"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name, rows in (("train", 1), ("query", 8), ("retrieval", 20)):
        np.savez(
            root / f"{name}.npz",
            image=rng.standard_normal((rows, 16)).astype(np.float32),
            text=rng.standard_normal((rows, 16)).astype(np.float32),
            label=np.ones((rows, 3), np.uint8),
        )
    argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(tmp_path / "runs"), "--name", "r"]
    assert main([*argv, *PRE_SPLIT, "--data", "splits", "--root", str(root)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {root / 'train.npz'}: 1 training pair(s)")
    assert not (tmp_path / "runs").exists()


def test_a_mat_file_is_split_under_the_checks_of_npy_pairs(tmp_path):
    """One check of the split sizes, made before the split for every format. A whole-set .mat file was
    checked after it: its errors named split_dataset's arguments (``num_query must be in [1, 39] for 40
    pairs, got 40``), and a pair-only file leaving one training pair was caught by a second check; both now
    read as for .npy pairs. A labelled set asked to train on one pair names data.num_train (it named
    data.num_query)."""
    from patchword.errors import ConfigError
    from patchword.hashing.build import build_hashing_dataset
    from patchword.hashing.config import HashDataConfig

    scipy_io = pytest.importorskip("scipy.io")
    rng = np.random.default_rng(0)
    image, text = (rng.standard_normal((40, 8)).astype(np.float32) for _ in range(2))
    labelled, pairs = tmp_path / "labelled.mat", tmp_path / "pairs.mat"
    scipy_io.savemat(
        labelled, {"IAll": image, "YAll": text, "LAll": np.eye(4, dtype=np.uint8)[np.arange(40) % 4]}
    )
    scipy_io.savemat(pairs, {"IAll": image, "YAll": text})

    def error(path: Path, **sizes) -> str:
        with pytest.raises(ConfigError) as err:
            build_hashing_dataset(HashDataConfig(format="mat", root=str(path), **sizes))
        return str(err.value)

    assert (
        error(labelled, num_query=40) == f"data.num_query: must lie in [1, 39] for the 40 pairs of {labelled}"
    )
    assert error(labelled, num_query=10, num_train=31) == (
        f"data.num_train: 31 exceeds the 30 retrieval pairs of {labelled} (n - data.num_query)"
    )
    assert error(pairs, num_query=39, num_train=5) == (
        f"data.num_query: data.num_query=39 of the 40 pairs of {pairs} leaves 1 training pair(s) "
        "(data.num_train=5); a contrastive batch needs at least 2"
    )
    assert error(labelled, num_query=10, num_train=1).startswith("data.num_train: ")
    data = build_hashing_dataset(HashDataConfig(format="mat", root=str(labelled), num_query=10, num_train=20))
    assert (len(data.train), len(data.query), len(data.retrieval)) == (20, 10, 30)


def test_hash_search_empty_query_file_is_one_line_naming_it(run, tmp_path, capsys):
    """Defect: a (0, d) --query ended in "torch.cat(): expected a non-empty list of Tensors"."""
    np.save(tmp_path / "none.npy", np.zeros((0, 32), np.float32))
    assert main(["search", str(run), "--modality", "image", "--query", str(tmp_path / "none.npy")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {tmp_path / 'none.npy'}: holds no query")


def _write_splits(root: Path, retrieval_seed: int) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(exist_ok=True)
    for name, rows in (("train", 40), ("query", 8), ("retrieval", 30)):
        if name == "retrieval":
            rng = np.random.default_rng(retrieval_seed)
        np.savez(
            root / f"{name}.npz",
            image=rng.standard_normal((rows, 16)).astype(np.float32),
            text=rng.standard_normal((rows, 16)).astype(np.float32),
            label=(rng.random((rows, 3)) < 0.5).astype(np.uint8),
        )


def test_hash_search_rebuilds_an_index_of_other_retrieval_features(tmp_path, capsys):
    """Defect: the cached index_text.npz was reused after the run's retrieval features changed (only its
    date against last.pt's was compared): the neighbours were those of the old features."""
    root = tmp_path / "sp"
    _write_splits(root, retrieval_seed=1)
    out = tmp_path / "runs"
    argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", "r", *PRE_SPLIT]
    assert main([*argv, "--data", "splits", "--root", str(root)]) == 0
    run = out / "r"
    search = ["search", str(run), "--modality", "image", "--query-index", "0", "1", "2", "--k", "6"]
    capsys.readouterr()
    assert main(search) == 0
    old = json.loads(capsys.readouterr().out)
    old_index = (run / "index_text.npz").read_bytes()
    assert main(search) == 0  # unchanged: the cached index is used as it is
    assert json.loads(capsys.readouterr().out) == old and (run / "index_text.npz").read_bytes() == old_index

    _write_splits(root, retrieval_seed=2)  # the run's retrieval file now holds other features
    assert main(search) == 0
    cached = json.loads(capsys.readouterr().out)
    assert main([*search, "--rebuild"]) == 0
    rebuilt = json.loads(capsys.readouterr().out)
    assert cached == rebuilt and rebuilt != old


def test_a_code_length_beyond_any_use_is_refused_before_training(tmp_path, capsys):
    """``--bits 100000000`` had no upper bound: the run allocated until the process was killed."""
    argv = ["train", "--bits", "100000000", "--epochs", "1", "--output-dir", str(tmp_path / "runs")]
    assert main([*argv, "--name", "r", *TINY_HASH]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: model.bits: must be at most 4096 (the code length; 16-128 is usual), got 100000000 "
        "(set by --bits)"
    )
    assert not (tmp_path / "runs").exists()
