"""What ``hash eval`` / ``hash search`` evaluate and how they label it: the run's own split (a re-split put
training pairs in the query set), the data block, cut-offs past the database, the query rows of a search;
and pair data that cannot give the ``data.num_train`` asked for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.hashing import HashRunConfig, train_hashing

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ["--bits", "16", "--epochs", "1", "model.hidden=32", "model.dim_feedforward=32", "model.num_layers=1"]
MODEL += ["train.batch_size=16", "eval.ks=[1,5]"]


def _pairs(tmp_path: Path, rows: int = 60) -> list[str]:
    """``--data pairs`` flags of ``rows`` random 16-d pairs (no labels: pair relevance)."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "image.npy", rng.standard_normal((rows, 16)).astype(np.float32))
    np.save(tmp_path / "text.npy", rng.standard_normal((rows, 16)).astype(np.float32))
    return ["--data", "pairs", "--image", str(tmp_path / "image.npy"), "--text", str(tmp_path / "text.npy")]


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory) -> Path:
    """A 16-bit run on 60 pairs: 20 query (= retrieval) pairs, 40 training pairs (split_seed 0)."""
    tmp = tmp_path_factory.mktemp("pairs")
    argv = ["train", *MODEL, "--output-dir", str(tmp / "runs"), "--name", "p", *_pairs(tmp)]
    assert main([*argv, "data.num_query=20", "data.num_train=40"]) == 0
    return tmp / "runs" / "p"


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("data.split_seed=1", "(0 -> 1): it re-splits the run's pairs, so its query set may hold pairs"),
        ("data.num_query=30", "(20 -> 30): it re-splits the run's pairs"),
        ("data.num_train=10", "(40 -> 10): the training split is the run's own"),
    ],
)
def test_hash_eval_refuses_a_resplit_of_a_trained_run(pair_run, tmp_path, capsys, override, why):
    """Defect: ``hash eval RUN data.split_seed=1`` re-split the pairs (13 of 20 query pairs were training
    pairs in the reviewer's run) and reported the numbers as the run's."""
    report = tmp_path / "e.json"
    assert main(["eval", str(pair_run), "--out", str(report), override]) == 2
    key = override.split("=")[0]
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {key}: cannot change on hash eval of a trained run {why}")
    assert not report.exists()


@pytest.mark.parametrize(
    "override", ["data.synthetic_seed=1", "data.synthetic_num_retrieval=80", "data.num_query=8"]
)
def test_hash_eval_refuses_another_synthetic_set(hash_run, capsys, override):
    """Defect: ``data.synthetic_*`` / ``data.num_query`` on a synthetic run evaluated another set."""
    assert main(["eval", str(hash_run), override]) == 2
    key = override.split("=")[0]
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {key}: cannot change on hash eval of a trained run"
    )


def test_hash_eval_output_has_the_data_block(pair_run, capsys):
    """The run's own split (a key at its own value is no re-split) and what was evaluated, as hash train's
    summary says it."""
    assert main(["eval", str(pair_run), "data.split_seed=0", "data.num_query=20"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert (data["query"], data["retrieval"], data["train"], data["split_seed"]) == (20, 20, 40, 0)
    assert data["source"].endswith("image.npy + " + str(pair_run.parent.parent / "text.npy"))
    assert data["protocol"] == "pair"
    assert data == json.loads((pair_run / "eval.json").read_text())["data"]


def test_cutoffs_past_the_database_are_labelled_with_the_cutoff_used(hash_run, capsys):
    """Defect: with 96 retrieval items, eval.ks=[1,5,96,200] printed i2t_p@200 (equal to p@96) and
    eval.topk=500 a "map@500" that was mAP@96."""
    assert main(["eval", str(hash_run), "eval.ks=[1,5,96,200]", "eval.topk=500"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert {"i2t_map@96", "t2i_map@96", "i2t_p@96", "i2t_r@96"} <= set(metrics)
    assert not {"i2t_map@500", "i2t_p@200", "t2i_r@200"} & set(metrics)
    assert metrics["capped_cutoffs"] == {
        "retrieval_items": 96,
        "eval.topk": {"500": 96},
        "eval.ks": {"200": 96},
    }
    assert (
        "cut-offs past the 96 retrieval items are reported at 96: eval.topk=500, eval.ks=200" in captured.err
    )
    assert main(["eval", str(hash_run)]) == 0  # the defaults fit: nothing capped
    assert "capped_cutoffs" not in json.loads(capsys.readouterr().out)


def test_hash_search_labels_results_with_the_query_rows(hash_run, capsys):
    """Defect: ``--query-index 3 7`` labelled its results "query": 0 and 1 (list positions)."""
    assert main(["search", str(hash_run), "--modality", "image", "--query-index", "3", "7", "--k", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["query"], r["query_id"]) for r in out["results"]] == [(3, 3), (7, 7)]
    assert out["queries"] == "query.image rows"


def test_pair_data_refuse_a_num_train_they_cannot_give(tmp_path, capsys):
    """Defect: 60 pairs, num_query=50, num_train=40 trained on 10 pairs without a word (labelled data
    refused it)."""
    out = tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), *_pairs(tmp_path), "data.num_query=50"]
    assert main([*argv, "--name", "a", "data.num_train=40"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.num_train: 40 exceeds the 10 pairs of")
    assert "that data.num_query=50 leaves to train on" in line
    assert not out.exists()
    image, text = tmp_path / "image.npy", tmp_path / "text.npy"
    base = [o for o in TINY_HASH if not o.startswith("data.synthetic_")]
    pairs = ["data.format=pairs", f"data.image={image}", f"data.text={text}", f"output_dir={out}", "name=b"]
    cfg = apply_overrides(HashRunConfig(), [*base, *pairs, "data.num_query=50", "data.num_train=40"])
    with pytest.raises(ConfigError, match=r"^data\.num_train: 40 exceeds the 10 pairs"):
        train_hashing(cfg)  # in code: a value other than the default was set
    # the default (2000) is "up to": capped to the 10 pairs left, with a warning
    # (a batch of at most the 10 pairs: a larger one is refused)
    assert main([*argv, "--name", "c", "train.batch_size=8"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["data"]["train"] == 10
    assert "data.num_train=2000 (not given) capped to the 10 pairs of" in captured.err
