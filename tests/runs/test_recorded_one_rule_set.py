"""One rule set decides whether an ``eval_*.json`` describes a run's checkpoint and, where it does not, why
(:func:`patchword.runs.recorded._why_unused`), from hand-made run directories (no training).

Before, ``evaluation_of`` applied its own copy of the rules and ``unused_evaluations`` another: a record
whose ``overrides`` is one string (``"progress=false"``) was iterated character by character by the first
(so not used) and wrapped as one override by the second (so not reported either): the row read NOT
EVALUATED and said no why. And the report looked every checkpoint up twice: each ``eval_*.json`` read
again, a checkpoint hashed again.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

import patchword.runs.recorded
from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.entries import collect
from patchword.runs.load import config_hash
from patchword.runs.recorded import evaluation_of, file_sha256


def _run(directory: Path) -> Path:
    """A run directory with a config.yaml and a best.pt (its default checkpoint)."""
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": 0}))
    torch.save({"model": {}, "step": 3}, directory / "best.pt")
    return directory


def _evaluation(run: Path, **extra) -> dict:
    """An ``eval_test.json`` of the run's best.pt with its present config (``extra`` replaces fields)."""
    record = {key: 50.0 for key in RECALL_KEYS} | {"rsum": 300.0, "split": "test", "images": 5}
    record |= {
        "run_dir": str(run),
        "checkpoint": str(run / "best.pt"),
        "checkpoint_sha256": file_sha256(run / "best.pt"),
        "config_hash": config_hash(run),
        "overrides": [],
    }
    record |= extra
    (run / "eval_test.json").write_text(json.dumps(record))
    return record


def test_one_neutral_override_written_as_a_string_is_the_runs_evaluation(tmp_path):
    """Before: neither used (``evaluation_of``: ``({}, None)``) nor named as unused (the row said only
    "not evaluated")."""
    run = _run(tmp_path / "one_string")
    record = _evaluation(run, overrides="progress=false")
    assert evaluation_of(run, run / "best.pt") == (record, "eval_test.json")
    (entry,) = collect([run])
    assert entry.summaries[0]["rsum"] == 300.0 and entry.unused == [[]]


def test_one_override_that_changes_the_measure_written_as_a_string_is_named(tmp_path):
    run = _run(tmp_path / "changing")
    _evaluation(run, overrides="data.max_caption_len=20")
    assert evaluation_of(run, run / "best.pt") == ({}, None)
    (entry,) = collect([run])
    why = "made with overrides that change what it measures (data.max_caption_len=20)"
    assert entry.unused == [[("eval_test.json", why)]]


def test_overrides_recorded_in_another_form_are_not_trusted_and_say_so(tmp_path):
    """A mapping of overrides: before, not used and not named either."""
    run = _run(tmp_path / "mapping")
    _evaluation(run, overrides={"data.max_caption_len": 20})
    assert evaluation_of(run, run / "best.pt") == ({}, None)
    (entry,) = collect([run])
    assert entry.unused == [[("eval_test.json", "records its overrides as dict, not a list")]]


def test_the_report_hashes_a_runs_checkpoint_once_to_say_why_its_evaluation_is_not_used(
    tmp_path, monkeypatch
):
    """An evaluation of other weights: before, best.pt was hashed twice (the lookup of the evaluation,
    then again to say why it is not used) and config.yaml hashed twice."""
    run = _run(tmp_path / "other_weights")
    _evaluation(run, checkpoint_sha256="0" * 64)
    hashed, configs = [], []
    real_sha, real_config = patchword.runs.recorded.file_sha256, patchword.runs.recorded.config_hash
    monkeypatch.setattr(patchword.runs.recorded, "file_sha256", lambda p: hashed.append(p) or real_sha(p))
    monkeypatch.setattr(patchword.runs.recorded, "config_hash", lambda d: configs.append(d) or real_config(d))
    (entry,) = collect([run])
    assert entry.unused == [[("eval_test.json", "of other weights than best.pt holds now")]]
    assert hashed == [run / "best.pt"]
    # one lookup answers the recall records and the compositional suite's (none here)
    assert len(configs) == 1
