"""What ``hash eval`` / ``hash train --resume`` / ``hash search`` did silently (old code):

* an imported official checkpoint was evaluated on the synthetic stand-in of its config.yaml;
* an ``official_fused`` evaluation did not record ``model.eval_batch_size``, which changes its numbers;
* a corrected labels file for the run's own features was refused as if the features had changed;
* ``--resume RUN train.epochs=N`` below the epochs trained trained nothing, exit 0, and wrote records;
* ``--resume`` of a run killed before its first checkpoint did not say how to start it again;
* ``hash search --k 500`` on a 96-item database returned 96 results without a word;
* ``hash train``'s summary named relative data paths where ``hash eval``'s named absolute ones.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main
from patchword.testing.official_ucmfh import official_ucmfh_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--bits", "8", "--epochs", "1", "model.hidden=16", "model.dim_feedforward=16", "model.nhead=2"]
SMALL += ["model.num_layers=1", "train.batch_size=8", "data.num_query=10", "data.num_train=20", "eval.ks=[1]"]
STAND_IN = ["data.num_train=8", "data.num_query=8", "data.synthetic_num_retrieval=16", "eval.ks=[1]"]


def _imported(tmp_path: Path) -> Path:
    from patchword.cli import main as patchword

    path = tmp_path / "mirflickr_hash_16.pth"
    torch.save(official_ucmfh_checkpoint(16, 16, layers=1, ffn_dim=32, hidden=32, seed=1), path)
    assert patchword(["import", str(path), "--out", str(tmp_path / "imp")]) == 0
    return tmp_path / "imp"


def test_an_imported_checkpoint_is_evaluated_on_data_given_only(tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="patchword.imports.ucmfh"):
        imp = _imported(tmp_path)
    assert any(
        "holds no features: evaluate it with `patchword hash eval" in r.getMessage()
        and "data.format=splits data.root=DIR" in r.getMessage()
        for r in caplog.records
    )
    capsys.readouterr()
    assert main(["eval", str(imp), *STAND_IN]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: data.format: {imp} is an imported checkpoint without data of its own (its config.yaml has "
        "synthetic stand-in features): set data.format=splits data.root=DIR (the official train / query / "
        "retrieval files), or data.format=pairs data.image=IMG.npy data.text=TXT.npy [data.labels=LAB.npy] "
        "(data.format=synthetic evaluates the stand-in on purpose)"
    )
    # hash search says what blocks it first: the fused codes, before any data are read
    assert main(["search", str(imp), "--modality", "image", "--query-index", "0"]) == 2
    assert "search needs a unimodal model" in one_error_line(capsys.readouterr().err)
    assert main(["eval", str(imp), "data.format=synthetic", *STAND_IN]) == 0  # the stand-in on purpose
    capsys.readouterr()
    # the official split files
    rng = np.random.default_rng(0)
    root = tmp_path / "splits"
    root.mkdir()
    for name, n in (("train", 8), ("query", 4), ("retrieval", 12)):
        feats = {m: rng.standard_normal((n, 16)).astype(np.float32) for m in ("image", "text")}
        np.savez(root / f"{name}.npz", **feats, label=np.eye(3, dtype=np.uint8)[np.arange(n) % 3])
    assert main(["eval", str(imp), "data.format=splits", f"data.root={root}", "eval.ks=[1]"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["source"] == str(root)


def test_a_resume_of_an_imported_checkpoint_without_data_is_refused(tmp_path, capsys):
    """Old code fine-tuned it on the synthetic stand-in of its config.yaml (a resume takes no data keys)."""
    imp = _imported(tmp_path)
    before = sorted(p.name for p in imp.iterdir())
    capsys.readouterr()
    assert main(["train", "--resume", str(imp), "train.epochs=1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: data.format: {imp} is an imported checkpoint without data of its own")
    assert "a resume would train it on them: import it again with its data (data.format=splits" in line
    assert sorted(p.name for p in imp.iterdir()) == before


def test_an_official_fused_evaluation_records_its_block_size(hash_run, tmp_path, capsys):
    """Its blocks' pairs attend to each other: the size changed mAP from 0.4071 to 0.3264 unrecorded."""
    imp = _imported(tmp_path)
    capsys.readouterr()
    assert main(["eval", str(imp), "data.format=synthetic", *STAND_IN]) == 0
    assert json.loads(capsys.readouterr().out)["eval_batch_size"] == 128
    assert main(["eval", str(imp), "data.format=synthetic", *STAND_IN, "model.eval_batch_size=1"]) == 0
    blocks_of_one = json.loads(capsys.readouterr().out)
    assert (blocks_of_one["fusion"], blocks_of_one["eval_batch_size"]) == ("official_fused", 1)
    # a unimodal model encodes each sample alone: no block size to record
    assert main(["eval", str(hash_run)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["fusion"] == "unimodal" and "eval_batch_size" not in metrics


def _pairs(folder: Path, labels: np.ndarray | None = None) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(folder / "img.npy", rng.standard_normal((40, 8)).astype(np.float32))
    np.save(folder / "txt.npy", rng.standard_normal((40, 8)).astype(np.float32))
    argv = ["--data", "pairs", "--image", str(folder / "img.npy"), "--text", str(folder / "txt.npy")]
    if labels is not None:
        np.save(folder / "lab.npy", labels)
        argv += ["--labels", str(folder / "lab.npy")]
    return argv


def test_corrected_labels_are_evaluated_and_recorded_added_or_dropped_ones_refused(tmp_path, capsys):
    labels = np.eye(4, dtype=np.uint8)[np.arange(40) % 4]
    argv = ["train", *SMALL, "--output-dir", str(tmp_path / "runs"), "--name", "r"]
    assert main([*argv, *_pairs(tmp_path / "d", labels)]) == 0
    run = tmp_path / "runs" / "r"
    before = json.loads(capsys.readouterr().out)
    fixed = tmp_path / "fixed.npy"
    np.save(fixed, np.eye(4, dtype=np.uint8)[np.arange(40) % 3])  # other labels of the same 40 rows
    assert main(["eval", str(run), f"data.labels={fixed}"]) == 0
    after = json.loads(capsys.readouterr().out)
    record = after["data"]["labels_other_than_run"]
    assert record["file"] == str(fixed) and len(record["sha256"]) == 64
    assert record["run_sha256"] == before["data"]["fingerprint"]["sha256"]["data.labels"]
    assert record["sha256"] == after["data"]["fingerprint"]["sha256"]["data.labels"] != record["run_sha256"]
    assert after["data"]["query"] == before["data"]["query"]  # the run's split, scored with other labels
    # other labels do not open the run's own pairs to a re-split
    assert main(["eval", str(run), f"data.labels={fixed}", "data.split_seed=1"]) == 2
    assert "data.split_seed: cannot change on hash eval" in one_error_line(capsys.readouterr().err)
    assert main(["eval", str(run), "data.labels="]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: data.labels: is empty, but {run} trained on labelled pairs (sha256 "
    )
    # a run of pairs without labels: labels would make the retrieval set another
    argv = ["train", *SMALL, "--output-dir", str(tmp_path / "runs"), "--name", "p"]
    assert main([*argv, *_pairs(tmp_path / "p")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "runs" / "p"), f"data.labels={fixed}"]) == 2
    assert "trained on pairs without labels: with labels the split is another" in one_error_line(
        capsys.readouterr().err
    )


def _train(out: Path, *extra: str) -> int:
    return main(["train", "--bits", "16", "--output-dir", str(out), "--name", "r", *TINY_HASH, *extra])


def test_a_resume_to_fewer_epochs_than_trained_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "runs"
    assert _train(out, "--epochs", "2") == 0
    run = out / "r"
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.epochs=1"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: train.epochs: 1 but {run} already trained 2 epoch(s) (last.pt): a resume trains up to "
        "train.epochs, so nothing would be trained; give train.epochs=3 or more to train on, or evaluate the "
        f"run with `patchword hash eval {run}`"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files  # no resume record
    assert main(["train", "--resume", str(run), "eval.topk=5"]) == 0  # as many: evaluated again


def test_a_resume_of_a_run_killed_before_its_first_checkpoint_says_to_start_it_again(
    hash_run, tmp_path, capsys
):
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(hash_run / "config.yaml", killed / "config.yaml")  # what a SIGKILL before last.pt leaves
    (killed / "metrics.jsonl").write_text("")
    assert main(["train", "--resume", str(killed)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {killed} has no last.pt to resume from (it stopped before its first checkpoint: killed "
        "before train.save_every epochs, or the end, wrote one): nothing to continue; run the command that "
        "started it again, without --resume (it starts the run anew)"
    )
    assert main(["train", "--resume", str(tmp_path / "none")]) == 2
    assert "no such run directory" in one_error_line(capsys.readouterr().err)


def test_search_says_when_k_exceeds_the_database(hash_run, tmp_path, capsys):
    out = tmp_path / "res.json"
    args = [
        "search",
        str(hash_run),
        "--modality",
        "image",
        "--query-index",
        "0",
        "--k",
        "500",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: --k 500 is more than the 96 items of the database (retrieval.text): 96 results per query"
    ]
    assert len(json.loads(out.read_text())["results"][0]["indices"]) == 96
    assert main([*args[:-3], "5"]) == 0  # within the database: nothing to say
    assert "note: " not in capsys.readouterr().err


def test_train_and_eval_name_the_data_source_alike(tmp_path, capsys, monkeypatch):
    _pairs(tmp_path / "d")
    monkeypatch.chdir(tmp_path)
    argv = ["train", *SMALL, "--output-dir", "runs", "--name", "r", "--data", "pairs"]
    assert main([*argv, "--image", "d/img.npy", "--text", "d/txt.npy"]) == 0
    trained = json.loads(capsys.readouterr().out)["data"]["source"]
    assert trained == f"{tmp_path / 'd' / 'img.npy'} + {tmp_path / 'd' / 'txt.npy'}"
    assert main(["eval", "runs/r"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["source"] == trained
