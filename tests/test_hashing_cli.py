"""``patchword hash train|eval|search`` in-process on tiny synthetic data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from patchword.hashing.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = [
    "data.num_train=64",
    "data.num_query=16",
    "data.synthetic_num_retrieval=96",
    "data.synthetic_image_dim=32",
    "data.synthetic_text_dim=32",
    "model.hidden=32",
    "model.dim_feedforward=32",
    "model.num_layers=1",
    "train.batch_size=32",
    "eval.ks=[1,5]",
]


def test_cli_train_eval_search(tmp_path, capsys):
    out = tmp_path / "runs"
    assert (
        main(["train", "--bits", "16", "--epochs", "2", "--output-dir", str(out), "--name", "r", *TINY]) == 0
    )
    run = out / "r"
    summary = json.loads(capsys.readouterr().out)
    assert summary["bits"] == 16 and 0 <= summary["i2t_map@50"] <= 1 and summary["steps"] == 4
    for name in ("config.yaml", "metrics.jsonl", "last.pt", "model.safetensors", "config.json", "eval.json"):
        assert (run / name).is_file(), name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records] == ["train", "train", "test"]

    # a second train into the same run refuses to overwrite; --resume continues to more epochs
    assert (
        main(["train", "--bits", "16", "--epochs", "2", "--output-dir", str(out), "--name", "r", *TINY]) == 2
    )
    assert (
        main(
            [
                "train",
                "--resume",
                "--bits",
                "16",
                "--epochs",
                "3",
                "--output-dir",
                str(out),
                "--name",
                "r",
                *TINY,
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["epochs"] == 3

    assert (
        main(["eval", str(run), "--pr-plot", str(tmp_path / "pr.png"), "--out", str(tmp_path / "e.json")])
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics == json.loads((tmp_path / "e.json").read_text())
    assert metrics == json.loads((run / "eval.json").read_text())  # deterministic re-evaluation
    assert (tmp_path / "pr.png").stat().st_size > 1000

    assert main(["search", str(run), "--modality", "image", "--query-index", "0", "3", "--k", "4"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["database"] == "retrieval.text" and len(res["results"]) == 2
    first = res["results"][0]
    assert len(first["indices"]) == 4 and first["distances"] == sorted(first["distances"])
    assert (run / "index_text.npz").is_file()

    np.save(tmp_path / "q.npy", np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32))
    assert (
        main(["search", str(run), "--modality", "text", "--query", str(tmp_path / "q.npy"), "--k", "2"]) == 0
    )
    assert len(json.loads(capsys.readouterr().out)["results"]) == 3


def test_cli_user_errors(tmp_path):
    assert main(["train", "--output-dir", str(tmp_path), "nope.key=1"]) == 2
    assert main(["eval", str(tmp_path / "missing")]) == 2
    # unequal feature dimensions: the feature-level term is undefined, said clearly (codes-only works)
    assert (
        main(["train", "--output-dir", str(tmp_path), "--name", "u", *TINY, "data.synthetic_text_dim=24"])
        == 2
    )
    assert (
        main(
            [
                "train",
                "--output-dir",
                str(tmp_path),
                "--name",
                "u",
                "--epochs",
                "1",
                *TINY,
                "data.synthetic_text_dim=24",
                "train.feature_weight=0",
            ]
        )
        == 0
    )
    np.save(tmp_path / "img.npy", np.ones((5, 4), dtype=np.float32))
    np.save(tmp_path / "txt.npy", np.ones((4, 4), dtype=np.float32))
    assert (
        main(
            [
                "train",
                "--data",
                "pairs",
                "--image",
                str(tmp_path / "img.npy"),
                "--text",
                str(tmp_path / "txt.npy"),
                "--output-dir",
                str(tmp_path),
            ]
        )
        == 2
    )


def test_train_hashing_leaves_the_thread_count_alone(tmp_path):
    """The library trainer used to call torch.set_num_threads(train.num_threads) and leave it changed."""
    import torch

    from patchword.config import load_config
    from patchword.hashing import HashRunConfig, train_hashing

    overrides = [*TINY, "train.epochs=1", "train.num_threads=3", f"output_dir={tmp_path}", "name=t"]
    before = torch.get_num_threads()
    train_hashing(load_config(HashRunConfig, None, overrides))
    assert torch.get_num_threads() == before != 3
    # the CLI applies train.num_threads for the run and restores the caller's count afterwards
    assert main(["train", "--output-dir", str(tmp_path), "--name", "c", *overrides[:-2]]) == 0
    assert torch.get_num_threads() == before


def test_resume_keeps_the_runs_settings_and_a_missing_run_is_an_error(tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["--output-dir", str(out), "--name", "r", *TINY]
    assert main(["train", "--bits", "16", "--epochs", "1", *args]) == 0
    config = (out / "r" / "config.yaml").read_bytes()
    capsys.readouterr()
    # another code length on resume: refused naming the key, the run's config untouched
    assert main(["train", "--resume", "--bits", "32", "--epochs", "2", *args]) == 2
    assert "model.bits" in capsys.readouterr().err
    assert (out / "r" / "config.yaml").read_bytes() == config
    # a typo'd run name does not start a new run
    assert main(["train", "--resume", "--bits", "16", "--output-dir", str(out), "--name", "typo", *TINY]) == 2
    assert "has no last.pt" in capsys.readouterr().err and not (out / "typo").exists()
    assert (
        main(["train", "--bits", "16", "--device", "cuda:7", "--output-dir", str(out), "--name", "g", *TINY])
        == 2
    )
    assert "device" in capsys.readouterr().err and not (out / "g").exists()
