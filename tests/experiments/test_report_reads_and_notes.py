"""What ``patchword report`` reads of a run, and the notes of its published-vs-measured table (review S):

* a run's ``eval_*.json`` files were each read twice (once for its recall evaluation, once for its
  compositional suite record) and its checkpoint hashed twice; now once each;
* a COCO 1K published row not measured (``eval.coco_1k`` not set) still got the usual NOT LIKE FOR LIKE
  notes (another number of test images...): a row that measured nothing now gets none.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
import yaml

from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.entries import collect
from patchword.experiments.report import _tables
from patchword.runs.load import config_hash
from patchword.runs.recorded import file_sha256

SUITE = {"attribute_swap": 60.0, "relation_swap": 70.0, "object_replace": 55.0, "count_change": 40.0}


def _summary(images: int = 1000) -> dict:
    recalls = {key: 50.0 for key in RECALL_KEYS} | {"rsum": 300.0}
    return {**recalls, "split": "test", "images": images, "captions": 5 * images, "leaky": False}


def _run(directory: Path, summary: dict | None = None, config: dict | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": 0, **(config or {})}))
    if summary is not None:
        (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def _identity(run: Path) -> dict:
    """What an evaluation record says of the checkpoint it scored (``evaluation_identity``)."""
    return {
        "run_dir": str(run),
        "checkpoint": str(run / "best.pt"),
        "checkpoint_sha256": file_sha256(run / "best.pt"),
        "config_hash": config_hash(run),
        "overrides": [],
    }


def _evaluated_run(tmp_path: Path) -> Path:
    """A run without a training summary (an import evaluated with ``patchword eval``): an
    ``eval_test.json`` and an ``eval_compositional.json`` of its ``best.pt``."""
    run = _run(tmp_path / "imp")
    torch.save({"model": {}, "step": 3}, run / "best.pt")
    (run / "eval_test.json").write_text(json.dumps(_summary() | _identity(run)))
    suite = {**SUITE, "n": dict.fromkeys(SUITE, 20), "suite": "compositional", "suite_files": []}
    (run / "eval_compositional.json").write_text(json.dumps(suite | _identity(run)))
    return run


def _counted(monkeypatch) -> tuple[Counter, Counter]:
    """(file name -> JSON reads, file name -> sha256 computations) from now on."""
    import patchword.readers as readers
    import patchword.runs.recorded as recorded

    reads, hashes = Counter(), Counter()
    read_text, sha256 = readers._read_text, recorded.file_sha256

    def counted_read(path, *args, **kwargs):
        reads[Path(path).name] += 1
        return read_text(path, *args, **kwargs)

    def counted_sha256(path):
        hashes[Path(path).name] += 1
        return sha256(path)

    monkeypatch.setattr(readers, "_read_text", counted_read)
    monkeypatch.setattr(recorded, "file_sha256", counted_sha256)
    return reads, hashes


def test_a_runs_evaluation_files_are_read_once_and_its_checkpoint_hashed_once(tmp_path, monkeypatch):
    run = _evaluated_run(tmp_path)
    reads, hashes = _counted(monkeypatch)
    (entry,) = collect([run])
    assert entry.sources == [str(run / "eval_test.json")]
    assert entry.summaries[0]["rsum"] == 300.0
    assert entry.compositional[0]["relation_swap"] == 70.0 and entry.stale == []
    eval_reads = {name: n for name, n in reads.items() if name.startswith("eval_")}
    assert eval_reads == {"eval_test.json": 1, "eval_compositional.json": 1}
    assert hashes == {"best.pt": 1}


def test_one_lookup_answers_the_recall_and_the_suite_records_as_the_functions_do(tmp_path, monkeypatch):
    from patchword.runs.recorded import RecordedEvaluations, evaluation_and_unused, suite_evaluation_of

    run = _evaluated_run(tmp_path)
    want_recall = evaluation_and_unused(run, run / "best.pt")
    want_suite = suite_evaluation_of(run, run / "best.pt", "compositional", suite_files=[])
    assert want_recall[1] == "eval_test.json" and want_suite[1] == "eval_compositional.json"
    reads, hashes = _counted(monkeypatch)
    lookup = RecordedEvaluations(run, run / "best.pt")
    assert lookup.recall() == want_recall
    assert lookup.suite("compositional", suite_files=[]) == want_suite
    assert lookup.suite("patches") == ({}, None)
    assert reads == {"eval_test.json": 1, "eval_compositional.json": 1} and hashes == {"best.pt": 1}
    # a checkpoint outside the run: nothing is read for it
    reads.clear()
    assert RecordedEvaluations(run, tmp_path / "elsewhere.pt").recall() == ({}, None, [])
    assert reads == {}


def test_a_coco_1k_row_not_measured_gets_no_comparison_notes(tmp_path):
    """The COCO 1K row, not measured (eval.coco_1k not set), was noted "measured on 1000 test images, the
    published MS-COCO 1K protocol on 5000: not a like-for-like comparison"."""
    opt = {"bi_gru": True, "data_name": "coco_precomp", "cross_attn": "t2i", "agg_func": "Mean"}
    data = {"dataset": "precomp", "root": "data/coco_precomp", "test_split": "testall"}
    run = _run(tmp_path / "coco", _summary(images=1000), {"data": data})
    (run / "import.json").write_text(json.dumps({"family": "scan", "opt": opt | {"lambda_softmax": 9.0}}))
    caption, _, rows = next(t for t in _tables(collect([run])) if t[0].startswith("Published"))[:3]
    assert [row[2] for row in rows] == ["published [1]", "not measured: eval.coco_1k was not set"]
    assert "NOT LIKE FOR LIKE" not in caption and "test images" not in caption
    # measured (the fold averages recorded), the same gallery is noted as not like for like
    (run / "summary.json").write_text(
        json.dumps(_summary(images=1000) | {f"coco1k_{key}": 50.0 for key in (*RECALL_KEYS, "rsum")})
    )
    caption, _, rows = next(t for t in _tables(collect([run])) if t[0].startswith("Published"))[:3]
    assert [row[2] for row in rows] == ["published [1]", "measured here", "difference"]
    assert "NOT LIKE FOR LIKE: coco, MS-COCO 1K, t-i AVG (lambda1=9): measured on 1000 test images" in caption
