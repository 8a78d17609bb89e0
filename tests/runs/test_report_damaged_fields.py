"""Files ``patchword report`` reads that are valid JSON with a damaged field (a number written as a string, a
list where a name belongs, null where a time belongs, a log record without its figure): one error line
naming the file and the field, exit 2, nothing written. Before, each was a traceback (``TypeError`` in a
division or a format string, ``KeyError`` in the curves, "Cannot specify ',' with 's'.")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import one_error_line
from patchword.cli import main
from patchword.experiments.gallery_table import gallery_rows

COST = {"device": "cpu", "device_name": "Xeon", "threads": 2, "world_size": 1, "precision": "fp32"}
SUMMARY = {"rsum": 300.0, "split": "test", "images": 8, "captions": 40, "leaky": False}
SUMMARY["cost"] = {**COST, "scoring_seconds": 0.01, "pairs": 320}
TRAIN = {"split": "train", "step": 1, "loss": 2.0}
DEV = {"split": "dev", "step": 1, "rsum": 100.0}
GALLERY_ROW = {"images": 20, "captions": 100, "seconds": 1.2, "pairs_per_s": 1700.0, "peak_host_mb": 300.0}
GALLERY_ROW |= {
    "peak_host_scope": "shape",
    "peak_device_mb": None,
    "extrapolated": False,
    "pairs_scored": 2000,
}
GALLERY = {"kind": "gallery", "config": "c", "device": "cpu", "max_memory_mb": 1024.0, "rows": [GALLERY_ROW]}
GALLERY["machine"] = {"cpu": "AMD EPYC", "torch_threads": 4}


def _run(root: Path, summary: dict, log: list[dict] | None = None) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": 0}))
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log or [TRAIN, DEV]))
    return run


def _cost(**changed) -> dict:
    return {**SUMMARY, "cost": {**SUMMARY["cost"], **changed}}


@pytest.mark.parametrize(
    "summary, log, named, field",
    [
        (_cost(pairs="5"), None, "summary.json", "cost.pairs"),
        (_cost(scoring_seconds="5"), None, "summary.json", "cost.scoring_seconds"),
        (_cost(precision=["fp32"]), None, "summary.json", "cost.precision"),
        (_cost(world_size="2"), None, "summary.json", "cost.world_size"),
        (SUMMARY, [{"split": "train", "step": 1}, DEV], "metrics.jsonl", "loss"),
        (SUMMARY, [TRAIN, {"split": "dev", "step": 1}], "metrics.jsonl", "rsum"),
        (SUMMARY, [{"split": "train", "loss": 2.0}, DEV], "metrics.jsonl", "step"),
    ],
)
def test_a_damaged_field_of_a_run_is_one_line_naming_file_and_field(
    tmp_path, capsys, summary, log, named, field
):
    run = _run(tmp_path, summary, log)
    out = tmp_path / "report.md"
    assert main(["report", str(run), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(run / named) in line and field in line
    assert not out.exists()


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda g: g["rows"][0].update(seconds=None), "seconds"),
        (lambda g: g.update(machine="x"), "machine"),
        (lambda g: g["rows"][0].update(images="1k"), "images"),
    ],
)
def test_a_damaged_gallery_file_is_one_line_naming_file_and_field(tmp_path, capsys, change, field):
    gallery = json.loads(json.dumps(GALLERY))
    change(gallery)
    path = tmp_path / "gallery.json"
    path.write_text(json.dumps(gallery))
    run, out = _run(tmp_path, SUMMARY), tmp_path / "report.md"
    assert main(["report", str(run), "--out", str(out), "--gallery", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(path) in line and f"{field} is " in line
    assert not out.exists()


@pytest.mark.parametrize(
    "manifest, field", [({"model": "x", "entries": []}, "model"), ({"entries": 3}, "entries")]
)
def test_a_damaged_index_manifest_is_one_line_naming_file_and_field(tmp_path, capsys, manifest, field):
    index = tmp_path / "scenes.index"
    index.mkdir()
    (index / "manifest.json").write_text(json.dumps(manifest))
    run, out = _run(tmp_path, SUMMARY), tmp_path / "report.md"
    assert main(["report", str(run), "--out", str(out), "--index", str(index)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(index / "manifest.json") in line and f"{field} is " in line


def test_the_gallery_table_names_the_threads_the_benchmark_ran_with(tmp_path):
    """Cost rows are told apart by thread count; the gallery table's caption named the CPU only."""
    path = tmp_path / "gallery.json"
    path.write_text(json.dumps(GALLERY))
    caption, _, rows = gallery_rows(path)
    assert "CPU AMD EPYC, 4 torch threads" in caption
    assert rows[0][-1] == "measured"
    # an extrapolated row whose file lacks the pairs it was extrapolated from: not "from 0 pairs"
    row = {**GALLERY_ROW, "extrapolated": True}
    del row["pairs_scored"]
    path.write_text(json.dumps({**GALLERY, "rows": [row]}))
    assert gallery_rows(path)[2][0][-1] == "extrapolated"
