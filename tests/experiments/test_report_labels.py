"""What ``patchword report`` says its figures are (reviewer's findings on runs for a paper): a published row's
note and protocol (a doubtful number, an assumed protocol) under the published table, a compositional record
scored on SugarCrepe files in its own columns with the dense text its matcher read, and a two-stage
(shortlist) search's recalls named as such. Hand-made run directories (``config.yaml`` and a record)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments import entries as entries_module
from patchword.experiments.report import _tables, collect
from patchword.experiments.report_csv import csv_text
from patchword.experiments.report_page import html_page, markdown_page

CPU = {"device": "cpu", "device_name": "Xeon", "threads": 4, "world_size": 1, "precision": "fp32"}


def _summary(rsum: float = 300.0, **extra) -> dict:
    recalls = {key: rsum / 6 for key in RECALL_KEYS} | {"rsum": rsum}
    cost = {**CPU, "scoring_seconds": 1.0, "pairs": 5_000_000}
    return {**recalls, "split": "test", "images": 12, "captions": 60, "leaky": False, "cost": cost, **extra}


def _run(directory: Path, summary: dict | None, config: dict | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": 0, **(config or {})}))
    if summary is not None:
        (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def _table(tables, start: str):
    (table,) = [t for t in tables if t[0].startswith(start)]
    return table


def test_the_published_table_shows_each_published_rows_note_and_protocol(tmp_path):
    """The report left out the note the model card shows: the SEPS ViT-B-224 Flickr30K row's "The paper's
    ablation table prints this model's I2T R@5 as 96.7, not 93.7" read as an undisputed 93.7."""
    run = _run(tmp_path / "imported", _summary(), {"data": {"dataset": "laps", "root": "/data/f30k"}})
    (run / "import.json").write_text(json.dumps({"family": "seps", "opt": {"vit_type": "vit_224"}}))
    tables = _tables(collect([run]))
    published = _table(tables, "Published")
    caption, header, rows, notes = published
    marked = [row[2] for row in rows if row[2].startswith("published")]
    assert marked == ["published [1]"]  # one published row (Flickr30K 1K), its footnote mark
    assert [row[2] for row in rows if not row[2].startswith("published")] == ["measured here", "difference"]
    (note,) = notes
    assert note.startswith("[1] Flickr30K 1K: protocol: Flickr30K 1K test: 1000 images, 5000 captions;")
    assert "LEAKY; note: The paper's ablation table prints this model's I2T R@5 as 96.7, not 93.7" in note
    # under the table, in both pages
    page = markdown_page(tables, [])
    last_row = page.index("| imported | Flickr30K 1K | difference |")
    assert last_row < page.index("\n\n[1] Flickr30K 1K: protocol:") < page.index("Config keys that differ")
    assert "<p>[1] Flickr30K 1K: protocol:" in html_page(tables, [])


def test_a_naaf_coco_row_says_its_protocol_is_assumed(tmp_path):
    """NAAF's README says "COCO": the table assumes the 1K 5-fold protocol, and the report now says so."""
    run = _run(tmp_path / "naaf", _summary(), {"data": {"dataset": "precomp", "root": "/data/coco"}})
    opt = {"data_name": "coco_precomp", "precomp_enc_text_type": "basic"}
    (run / "import.json").write_text(json.dumps({"family": "naaf", "opt": opt}))
    notes = _table(_tables(collect([run])), "Published")[3]
    assert any("README says COCO; the notes assume the 1K 5-fold protocol" in note for note in notes)


def test_a_sugarcrepe_record_shows_its_own_kinds_suite_and_dense_text(tmp_path, monkeypatch):
    """A record of --suite-file swap_obj.json showed as an empty row under the synthetic kinds, and never
    said that SEPS had been scored without its dense text."""
    sugar = _run(tmp_path / "sugar", _summary(), {"model": {"matcher": "seps"}})
    synthetic = _run(tmp_path / "synthetic", _summary())
    records = {
        sugar: {
            "swap_obj": 75.0,
            "n": {"swap_obj": 4},
            "suite": "compositional",
            "source": [str(tmp_path / "files" / "swap_obj.json")],
            "dense_text": "none",
        },
        synthetic: {
            "attribute_swap": 60.0,
            "relation_swap": 55.0,
            "object_replace": 70.0,
            "count_change": 50.0,
            "n": {"attribute_swap": 8, "relation_swap": 8, "object_replace": 8, "count_change": 8},
            "source": "synthetic test split, seed 0",
            "dense_text": "image-tied",
        },
    }

    class Recorded:  # each run's recorded evaluations, as far as the report asks for its suite record
        def __init__(self, run: Path) -> None:
            self.run = run

        def suite(self, suite: str) -> tuple[dict, str | None]:
            return records[self.run], "eval_compositional.json"

    monkeypatch.setattr(entries_module, "_recorded", Recorded)
    caption, header, rows = _table(_tables(collect([sugar, synthetic])), "Compositional suite")
    assert header[:3] == ["run", "suite", "dense text"]
    cells = [dict(zip(header, row, strict=True)) for row in rows]
    assert cells[0]["suite"] == "files swap_obj.json" and cells[0]["dense text"] == "none"
    assert cells[0]["swap_obj"] == "75.0" and cells[0]["attribute_swap"] == ""
    assert cells[1]["suite"] == "synthetic test split, seed 0" and cells[1]["dense text"] == "image-tied"
    assert cells[1]["count_change"] == "50.0" and cells[1]["swap_obj"] == ""
    assert "dense text none: the matcher reads dense text but none was given (suite files" in caption


def test_a_two_stage_rows_protocol_and_csv_name_its_shortlists(tmp_path):
    """A TGDT record of a shortlist search read "leak-free" like an exhaustive one."""
    shortlist = {"shortlist_i2t": 40, "shortlist_t2i": 8, "hybrid_alpha": 1.0}
    misses = {"shortlist_miss_i2t": 2.5, "shortlist_miss_t2i": 10.0}
    tgdt = _run(tmp_path / "tgdt", _summary(**shortlist, **misses))
    vse = _run(tmp_path / "vse", _summary())
    entries = collect([tgdt, vse])
    caption, header, rows, notes = _tables(entries)[0]
    protocol = {row[0]: row[header.index("protocol")] for row in rows}
    assert protocol == {"tgdt": "leak-free, two-stage (shortlist 40/8, α 1.0)", "vse": "leak-free"}
    (note,) = notes
    assert note.startswith("TWO-STAGE: recalls of a shortlist search") and "rank N+1" in note
    assert "\n\nTWO-STAGE: recalls of a shortlist search" in markdown_page(_tables(entries), [])
    got = list(csv.DictReader(csv_text(entries).splitlines()))
    assert [row["protocol"] for row in got] == ["leak-free, two-stage (shortlist 40/8, α 1.0)", "leak-free"]
    assert [row["shortlist_i2t_mean"] for row in got] == ["40.0", ""]
    assert [row["shortlist_t2i_mean"] for row in got] == ["8.0", ""]
    assert [row["hybrid_alpha_mean"] for row in got] == ["1.0", ""]
    assert [row["shortlist_miss_t2i_mean"] for row in got] == ["10.0", ""]
    # an exhaustive report's test table carries no two-stage note
    assert len(_tables(collect([vse]))[0]) == 3
