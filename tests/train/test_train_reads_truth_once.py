"""A training run (and a ``--resume``) with ``eval.coco_extended`` reads the COCO ground truth once: the
config checks read it before any work, and the final evaluation scores ECCV Caption / CxC with that one
(before, ``evaluate_run`` was given none and the scoring read the files a second time)."""

from __future__ import annotations

import json

import patchword.runs.checks
from conftest import laps_args, write_laps_dataset
from patchword.cli import main


def test_a_training_run_scores_with_the_ground_truth_its_checks_read(tmp_path, monkeypatch):
    from patchword.eval import coco_extended

    paths = write_laps_dataset(tmp_path / "laps")
    loads, used = [], []
    monkeypatch.setattr(
        coco_extended.CocoGroundTruth, "load", classmethod(lambda cls, root=None: loads.append(1) or "gt")
    )

    def metrics(sims, **kwargs):
        truth = kwargs["ground_truth"]
        used.append(truth)
        if truth is None:  # as the real function does: reads the files itself
            coco_extended.CocoGroundTruth.load()
        return {"eccv_r1": {"i2t": 0.5, "t2i": 0.25}}

    monkeypatch.setattr(coco_extended, "coco_extended_metrics", metrics)
    # the tiny test split stands in for COCO 5K (4 images, 2 captions each)
    monkeypatch.setattr(patchword.runs.checks, "COCO_5K_IMAGES", 4)
    monkeypatch.setattr(patchword.runs.checks, "COCO_5K_CAPTIONS", 8)
    run = tmp_path / "runs" / "coco"
    argv = ["train", *laps_args(paths, "eval.coco_extended=true", "eval.split=test")]
    assert main([*argv, f"output_dir={run.parent}", f"name={run.name}"]) == 0
    assert loads == [1] and used == ["gt"]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["eccv_r1_i2t"], summary["eccv_r1_t2i"]) == (50.0, 25.0)

    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0
    assert loads == [1, 1] and used == ["gt", "gt"]  # the resume's checks read it once, and only they
