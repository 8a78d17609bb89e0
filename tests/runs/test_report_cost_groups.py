"""Which rows of ``patchword report``'s cost table and figure are ranked together: one machine (a row whose
runs were timed on several is averaged as none and ranked nowhere), one test gallery of one dataset, one
protocol (leaky rows are labelled and ranked only among themselves); memory is labelled in MiB, the unit it
is recorded in. Hand-made run directories (``config.yaml`` and ``summary.json``): no training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from patchword.experiments import plots
from patchword.experiments.cost import cost_rows, plot_accuracy_cost
from patchword.experiments.gallery_table import gallery_rows
from patchword.experiments.report import collect
from patchword.experiments.report_csv import csv_text

XEON = {"device": "cpu", "device_name": "Xeon", "threads": 4}
H100 = {"device": "cuda:0", "device_name": "NVIDIA H100", "threads": 16}
F30K = {"dataset": "laps", "root": "/data/f30k"}


def _summary(rsum: float, seconds: float, machine: dict, leaky: bool = False) -> dict:
    cost = {**machine, "world_size": 1, "scoring_seconds": seconds, "pairs": 5_000_000, "precision": "fp32"}
    return {"rsum": rsum, "split": "test", "images": 1000, "captions": 5000, "leaky": leaky, "cost": cost}


def _run(directory: Path, summary: dict, data: dict | None = None, seed: int = 0) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "data": data or {}}))
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def _cells(entries, column: str) -> dict[str, str]:
    caption, header, rows = cost_rows(entries, {})
    return {row[0]: row[header.index(column)] for row in rows}


def test_leaky_rows_are_labelled_and_never_push_leak_free_rows_off_the_front(tmp_path, monkeypatch):
    """A caption-tied (leaky) run with a higher rSum and a shorter time pushed the leak-free run off the
    front, and neither the cost table nor the figure said LEAKY (SPEC decision 1)."""
    leaky = _run(tmp_path / "leaky", _summary(400.0, 1.0, XEON, leaky=True))
    clean = _run(tmp_path / "clean", _summary(300.0, 2.0, XEON))
    entries = collect([leaky, clean])
    assert _cells(entries, "s / 1K x 5K") == {"leaky (LEAKY)": "1.00 ★", "clean": "2.00 ★"}
    caption, _, rows = cost_rows(entries, {})
    assert "LEAKY" in caption and "only against other leaky rows" in caption
    assert [r["protocol"] for r in csv.DictReader(csv_text(entries).splitlines())] == ["leaky", "leak-free"]
    # the figure: each row annotated with its mark, the leaky one its own marker group
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: figures.append(fig))
    assert plot_accuracy_cost(entries, tmp_path / "cost.png") is not None
    (ax,) = figures[0].axes
    assert sorted(t.get_text() for t in ax.texts) == ["clean", "leaky (LEAKY)"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 2 and [label.endswith("; LEAKY") for label in legend] == [False, True]


def test_rows_of_different_datasets_are_never_ranked_against_each_other(tmp_path):
    """Both galleries are test 1000 x 5000, one of synthetic scenes, one of Flickr30K: the synthetic row's
    rSum pushed the Flickr30K row off the front and the caption saw one gallery."""
    synthetic = _run(tmp_path / "synthetic", _summary(500.0, 1.0, XEON))
    f30k = _run(tmp_path / "f30k", _summary(300.0, 2.0, XEON), data=F30K)
    caption, header, rows = cost_rows(collect([synthetic, f30k]), {})
    assert {row[0]: row[header.index("s / 1K x 5K")] for row in rows} == {
        "synthetic": "1.00 ★",
        "f30k": "2.00 ★",
    }
    assert (
        "2 TEST GALLERIES [test 1000 x 5000 of laps (/data/f30k); "
        "test 1000 x 5000 of synthetic (simple scenes, seed 0, 64 px)]" in caption
    )
    # a record that names its dataset is taken at its word
    _run(tmp_path / "named", {**_summary(300.0, 2.0, XEON), "dataset": "laps (/data/f30k)"})
    caption, _, _ = cost_rows(collect([f30k, tmp_path / "named"]), {})
    assert "TEST GALLERIES" not in caption


def test_a_row_whose_runs_were_timed_on_different_machines_is_not_averaged_as_one(tmp_path):
    """Seed 0 scored on a 4-thread Xeon in 40 s, seed 1 on an H100 in 0.5 s: the row read "20.25 ± 27.93 ★
    ... Xeon, 4 threads" and beat the Xeon-only row on the Xeon's front."""
    sw = tmp_path / "sw"
    _run(sw / "seed-0", _summary(300.0, 40.0, XEON), seed=0)
    _run(sw / "seed-1", _summary(300.0, 0.5, H100), seed=1)
    record = {"seeds": [0, 1], "variants": {}, "runs": {"runs": {"0": {}, "1": {}}}, "summary": {}}
    (sw / "sweep.json").write_text(json.dumps(record))
    xeon = _run(tmp_path / "xeon", _summary(200.0, 50.0, XEON))
    entries = collect([sw, xeon])
    caption, header, rows = cost_rows(entries, {})
    mixed, alone = rows
    times = header.index("s / 1K x 5K")
    assert mixed[times : times + 4] == ["mixed"] * 4  # s / 1K x 5K, pairs/s, peak device and host memory
    assert mixed[-1] == "MIXED: NVIDIA H100 (1 run); Xeon, 4 threads (1 run), fp32"
    assert mixed[header.index("rsum")] == "300.0 ± 0.0"  # accuracy does not depend on the machine
    assert alone[header.index("s / 1K x 5K")] == "50.0 ★"  # alone on the Xeon's front now
    assert "MIXED" in caption and "2 MACHINES" in caption
    rows = list(csv.DictReader(csv_text(entries).splitlines()))
    assert rows[0]["machine"].startswith("MIXED: ")
    assert rows[0]["cost.scoring_seconds_mean"] == rows[0]["seconds_per_1k_x_5k_mean"] == ""
    assert float(rows[1]["seconds_per_1k_x_5k_mean"]) == 50.0


def test_memory_is_labelled_in_mib_the_unit_it_is_recorded_in(tmp_path):
    """peak_host_rss_mb is VmHWM kB / 1024 and peak_device_mb bytes / 2**20: MiB, shown as "MB". The host
    and device columns are the scoring's own growth (peak_host_growth_mb, peak_device_growth_mb); a record
    without it shows the process's peak, marked, never averaged with growth figures."""
    summary = _summary(300.0, 2.0, H100)
    summary["cost"] |= {"peak_device_mb": 1536.0, "peak_host_rss_mb": 2048.0, "peak_host_scope": "evaluation"}
    old = json.loads(json.dumps(summary))
    summary["cost"] |= {"host_rss_start_mb": 1024.0, "peak_host_growth_mb": 1024.0}
    summary["cost"] |= {"device_start_mb": 512.0, "peak_device_growth_mb": 1024.0}
    _, header, (row,) = cost_rows(collect([_run(tmp_path / "run", summary)]), {})
    assert (row[header.index("peak device MiB")], row[header.index("peak host MiB")]) == ("1024", "1024")
    _, _, (row,) = cost_rows(collect([_run(tmp_path / "old", old)]), {})
    assert row[header.index("peak host MiB")] == "2048 (process)"
    assert row[header.index("peak device MiB")] == "1536 (process)"
    assert not any("MB" in h for h in header)
    gallery = tmp_path / "gallery.json"
    shape = {"images": 1000, "captions": 5000, "seconds": 2.0, "pairs_per_s": 2.5e6, "extrapolated": False}
    shape |= {"peak_host_mb": 900.0, "peak_host_scope": "shape", "peak_device_mb": None}
    gallery.write_text(json.dumps({"kind": "gallery", "rows": [shape], "machine": {}}))
    _, header, rows = gallery_rows(gallery)
    assert header[3:5] == ["peak host MiB", "peak device MiB"] and rows[0][3:5] == ["900", ""]
