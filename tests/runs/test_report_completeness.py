"""``patchword report`` over an interrupted sweep: every variant the sweep set out to run has a row (one with
no finished seed too: "0 of N", no figures), and the incompleteness shows in the test table, the cost table
and the CSV alike. The sweeps are hand-made (``sweep.json`` as :func:`run_sweep` writes it, and run
directories holding a ``config.yaml`` and a ``summary.json``): no training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from patchword.cli import main
from patchword.experiments.cost import cost_rows
from patchword.experiments.report import _tables, collect
from patchword.experiments.report_csv import csv_text


def _run(directory: Path, rsum: float, seed: int) -> None:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": seed}))
    summary = {"rsum": rsum, "i2t_r1": rsum / 6, "split": "test", "images": 8, "captions": 40, "leaky": False}
    (directory / "summary.json").write_text(json.dumps(summary))


def _sweep(root: Path, seeds: list[int], variants: dict[str, list[str]], done: dict[str, dict[int, float]]):
    """A sweep directory whose ``done`` variants finished the given seeds (seed -> rSum), as a sweep stopped
    then leaves it; ``variants``: the ones it set out to run (``{}``: none named)."""
    for variant, finished in done.items():
        for seed, rsum in finished.items():
            _run(root / (variant if variant != "runs" else "") / f"seed-{seed}", rsum, seed)
    runs = {v: {str(s): {"rsum": r} for s, r in finished.items()} for v, finished in done.items()}
    record = {"config": None, "overrides": [], "seeds": seeds, "variants": variants, "runs": runs}
    (root / "sweep.json").write_text(json.dumps({**record, "summary": {}}))
    return root


def test_a_sweep_stopped_in_its_second_variant_shows_that_variant_as_incomplete(tmp_path):
    """SIGTERMed while training the first seed of variant b: the report listed variant a alone, as if the
    sweep had been a one-variant sweep that finished."""
    variants = {"a": [], "b": ["train.lr=2e-3"]}
    sw = _sweep(tmp_path / "sw", [0, 1, 2], variants, {"a": {0: 100.0, 1: 110.0, 2: 120.0}})
    entries = collect([sw])
    assert [(e.label, len(e.runs), e.planned) for e in entries] == [("sw/a", 3, 3), ("sw/b", 0, 3)]
    caption, header, rows = _tables(entries)[0]
    assert rows[0][:2] == ["sw/a", "3"] and rows[0][header.index("rsum")] == "110.0 ± 10.0"
    # no figure at all; the seeds still to run named (a rerun with them resumes the variant)
    assert rows[1] == ["sw/b (INCOMPLETE)", "0 of 3 (missing: 0, 1, 2)", *[""] * (len(header) - 2)]
    assert "INCOMPLETE" in caption and "none for a variant with no finished seed" in caption
    _, _, cost = cost_rows(entries, {})
    assert [row[0] for row in cost] == ["sw/a", "sw/b (INCOMPLETE, 0 of 3 seeds)"]
    assert cost[1][1:] == [""] * (len(cost[1]) - 1)
    # the whole report, the CSV too
    out, table = tmp_path / "report.md", tmp_path / "report.csv"
    assert main(["report", str(sw), "--out", str(out), "--csv", str(table)]) == 0
    assert "| sw/b (INCOMPLETE) | 0 of 3 (missing: 0, 1, 2) |" in out.read_text()
    rows = list(csv.DictReader(table.open()))
    assert [(r["run"], r["seeds"], r["planned"], r["complete"]) for r in rows] == [
        ("sw/a", "3", "3", "yes"),
        ("sw/b", "0", "3", "no"),
    ]
    assert rows[1]["rsum_mean"] == "" and rows[1]["protocol"] == ""


def test_a_sweep_stopped_in_its_first_of_three_seeds_is_incomplete_in_the_csv_and_the_cost_table(tmp_path):
    """The test table said "1 of 3 (INCOMPLETE)" while the CSV row read ``sw,1,...`` and the cost table
    row had no mark: a reader of either took one seed's numbers for a finished sweep."""
    sw = _sweep(tmp_path / "sw", [0, 1, 2], {}, {"runs": {0: 300.0}})
    entries = collect([sw])
    caption, header, rows = cost_rows(entries, {})
    assert rows[0][0] == "sw (INCOMPLETE, 1 of 3 seeds)" and rows[0][header.index("rsum")] == "300.0"
    assert "INCOMPLETE" in caption
    (row,) = csv.DictReader(csv_text(entries).splitlines())
    assert (row["run"], row["seeds"], row["planned"], row["complete"]) == ("sw", "1", "3", "no")
    assert float(row["rsum_mean"]) == 300.0


def test_a_sweep_record_from_before_variants_were_recorded_still_reads(tmp_path):
    sw = _sweep(tmp_path / "sw", [0, 1], {}, {"a": {0: 100.0, 1: 120.0}})
    record = json.loads((sw / "sweep.json").read_text())
    del record["variants"]
    (sw / "sweep.json").write_text(json.dumps(record))
    assert [(e.label, len(e.runs), e.planned) for e in collect([sw])] == [("sw/a", 2, 2)]


def test_a_sweep_record_whose_variants_are_not_a_mapping_is_refused_in_one_line(tmp_path, capsys):
    sw = _sweep(tmp_path / "sw", [0], {}, {"runs": {0: 100.0}})
    record = json.loads((sw / "sweep.json").read_text())
    (sw / "sweep.json").write_text(json.dumps({**record, "variants": ["a"]}))
    out = tmp_path / "report.md"
    assert main(["report", str(sw), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert str(sw / "sweep.json") in err and "'variants'" in err and "\n" not in err
    assert not out.exists()
