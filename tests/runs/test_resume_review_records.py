"""Review of a run's records (findings 2 and 4): dev records and the summary's best dev rSum say the dev
images they were measured on (``train.eval_max_images`` cuts the dev split, and its rSum is not the whole
split's), the training curve's label says them, and a run without dense text records no dense pairing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY_RUN_32
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(tmp_path: Path, name: str, *extra: str) -> Path:
    args = [*TINY_RUN_32, "train.max_steps=2", f"output_dir={tmp_path}", f"name={name}", *extra]
    assert main(["train", *args, f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    return tmp_path / name


def _dev(run: Path) -> list[dict]:
    return [
        r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "dev"
    ]


def test_dev_records_and_the_summary_say_the_dev_images_they_scored(tmp_path, capsys):
    """Old records: rSum on the first 4 of 8 dev images, with nothing saying so; summary.json put that
    best_dev_rsum beside the whole split's figures of an evaluation with eval.split=dev."""
    run = _train(tmp_path, "cut", "train.eval_max_images=4", "eval.split=dev")
    assert [(r["images"], r["captions"]) for r in _dev(run)] == [(4, 20)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_dev_images"] == 4 and summary["images"] == 8  # the final evaluation: all 8
    assert '"best_dev_images": 4' in capsys.readouterr().out
    whole = _train(tmp_path, "whole")
    assert [(r["images"], r["captions"]) for r in _dev(whole)] == [(8, 40)]
    assert json.loads((whole / "summary.json").read_text())["best_dev_images"] == 8


def test_the_curve_label_says_the_dev_images():
    pytest.importorskip("matplotlib")
    from patchword.experiments.plots import dev_label

    assert dev_label([{"step": 2, "rsum": 1.0, "images": 300}] * 2) == "dev rSum (300 images)"
    assert dev_label([{"step": 2, "rsum": 1.0}]) == "dev rSum"  # records written before they said it
    assert dev_label([{"images": 300}, {"images": 1000}]) == "dev rSum"


def test_a_run_without_dense_text_records_no_dense_pairing(tmp_path):
    """Old summary: "dense_pairing": "image" for a run that read no dense text (data.dense=false)."""
    run = _train(tmp_path, "sparse", "data.dense=false")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dense_pairing"] is None and summary["leaky"] is False
    dense = json.loads((_train(tmp_path, "dense") / "summary.json").read_text())
    assert dense["dense_pairing"] == "image"
