"""``patchword eval`` reads each member's config and checks its ``eval`` settings once, and scores ECCV
Caption / CxC with the ground truth the checks read, not reading the files a second time."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

import patchword.runs
import patchword.runs.evaluate
import patchword.runs.load
from patchword.cli import main
from patchword.runs.checks import check_eval_settings
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _counting(monkeypatch, module, name: str) -> list:
    calls, real = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_an_ensemble_reads_and_checks_each_members_config_once(trained_tiny_run, tmp_path, monkeypatch):
    """Before: run_dir's config.yaml was read six times (twice more by every load) and its eval settings
    checked twice; now once each per member."""
    # a second member with the same weights in other bytes, the repeated-member refusal lifted (it reads
    # checkpoints, not configs; tests/runs/test_evaluation_records.py tests it)
    other = tmp_path / "other"
    shutil.copytree(trained_tiny_run, other)
    state = torch.load(other / "best.pt", weights_only=False)
    torch.save({**state, "copied": True}, other / "best.pt")
    monkeypatch.setattr(patchword.runs.evaluate, "refuse_repeated_members", lambda checkpoints: None)
    reads = _counting(monkeypatch, patchword.runs, "read_run_config")
    monkeypatch.setattr(patchword.runs.load, "read_run_config", patchword.runs.read_run_config)
    checks = _counting(monkeypatch, patchword.runs.evaluate, "check_eval_settings")
    out = tmp_path / "e.json"
    assert main(["eval", str(trained_tiny_run), "--ensemble", str(other), "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["ensemble"]) == 2
    assert reads == [trained_tiny_run, other]
    assert len(checks) == 2


def test_the_coco_ground_truth_the_checks_read_is_the_one_the_scoring_uses(monkeypatch):
    from patchword.eval import coco_extended

    loads = []
    monkeypatch.setattr(
        coco_extended.CocoGroundTruth, "load", classmethod(lambda cls: loads.append(1) or "gt")
    )
    cfg = RunConfig()
    cfg.data.dataset, cfg.eval.coco_extended = "karpathy", True
    device = torch.device("cpu")
    assert check_eval_settings(cfg, device) == "gt" and len(loads) == 1
    assert check_eval_settings(cfg, device, "gt") == "gt" and len(loads) == 1  # another member: not again
    cfg.eval.coco_extended = False
    assert check_eval_settings(cfg, device, "gt") == "gt" and check_eval_settings(cfg, device) is None
    used = []

    def metrics(sims, **kwargs):
        used.append(kwargs["ground_truth"])
        return {"eccv_r1": {"i2t": 0.5, "t2i": 0.25}}

    monkeypatch.setattr(coco_extended, "coco_extended_metrics", metrics)
    cfg.eval.coco_extended = True
    split, raw = SimpleNamespace(txt2img=torch.zeros(2, dtype=torch.long)), SimpleNamespace(image_ids=[1])
    sims = torch.zeros(1, 2)
    got = patchword.runs.evaluate.extra_metrics(cfg, None, split, raw, sims, device, "gt")
    assert got == {"eccv_r1_i2t": 50.0, "eccv_r1_t2i": 25.0} and used == ["gt"] and len(loads) == 1


def test_a_run_config_is_parsed_once(trained_tiny_run, monkeypatch):
    """Before: ``read_run_config`` parsed config.yaml twice (its checks, then ``load_config``)."""
    import patchword.readers

    parses = _counting(monkeypatch, patchword.runs.load, "read_yaml_mapping")
    monkeypatch.setattr(patchword.readers, "read_yaml_mapping", patchword.runs.load.read_yaml_mapping)
    config = patchword.runs.read_run_config(trained_tiny_run, ["eval.split=dev"])
    assert parses == [trained_tiny_run / "config.yaml"]
    from patchword.config import load_config

    expected = load_config(RunConfig, trained_tiny_run / "config.yaml", ["eval.split=dev"])
    assert config.eval.split == "dev" and config == expected
