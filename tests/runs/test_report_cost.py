"""Cost beside accuracy (issue 38): what an evaluation records about its cost, what ``patchword report``
shows of it (cost columns, machines never ranked together, the Pareto front), and ``report --csv``."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.device import cpu_model
from patchword.experiments.cost import GALLERY_PAIRS, cost_rows, machine_of, pareto_front, seconds_per_gallery
from patchword.experiments.report import collect
from patchword.runs import load_run

pytestmark = pytest.mark.usefixtures("one_thread")

COMPAT = Path(__file__).resolve().parents[1] / "data" / "compat_f715cbc"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("cost")
    runs = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the evaluation after the fit runs with torch's threads: one, recorded
    try:
        for name, extra in (("seps", []), ("longer", ["train.lr=1e-3"])):
            args = [*TINY_RUN_32, "train.max_steps=3", "train.eval_every=0", "progress=false"]
            args += [f"output_dir={root}", f"data.cache_dir={root / 'cache'}", f"name={name}", *extra]
            assert main(["train", *args]) == 0
            runs.append(root / name)
    finally:
        torch.set_num_threads(threads)
    return runs


def test_the_evaluation_after_the_fit_runs_with_train_num_threads(tmp_path):
    """Old code: ``train.num_threads`` held for the fit only, the final evaluation of the same ``patchword
    train`` ran with torch's threads (all the cores, on a machine the user had asked to share)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        args = [
            *TINY_RUN_32,
            "train.max_steps=1",
            "train.eval_every=0",
            "progress=false",
            "train.num_threads=1",
        ]
        args += [f"output_dir={tmp_path}", f"data.cache_dir={tmp_path / 'cache'}", "name=one"]
        assert main(["train", *args]) == 0
        assert torch.get_num_threads() == 2  # restored after the command
    finally:
        torch.set_num_threads(threads)
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["cost"]["threads"] == 1


def test_a_run_records_what_its_evaluation_cost(two_runs):
    run = two_runs[0]
    summary = json.loads((run / "summary.json").read_text())
    cost = summary["cost"]
    assert cost["exhaustive"] is True
    assert cost["pairs"] == summary["images"] * summary["captions"] == 8 * 40
    assert cost["scoring_seconds"] > 0 and cost["encode_seconds"] > 0
    assert cost["pairs_per_s"] == pytest.approx(cost["pairs"] / cost["scoring_seconds"], rel=1e-3)
    assert (cost["device"], cost["device_name"], cost["cpu"]) == ("cpu", cpu_model(), cpu_model())
    assert cost["threads"] == 1  # torch's threads at the evaluation (train.num_threads is the fit's)
    assert cost["precision"] == "fp32" and cost["world_size"] == 1
    assert cost["peak_device_mb"] is None and cost["peak_host_rss_mb"] > 0
    model = load_run(run).model
    assert summary["params_total"] == sum(p.numel() for p in model.parameters())
    assert summary["params_trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    # the steps over the time in them (validation, checkpoint writes and loader start-ups left out)
    assert summary["train_steps_per_s"] == pytest.approx(
        summary["steps"] / summary["step_time_seconds"], rel=1e-2
    )
    assert summary["step_time_seconds"] < summary["train_seconds"]


def test_patchword_eval_records_the_cost_too(two_runs, tmp_path):
    out = tmp_path / "eval.json"
    resident = _resident_mb()
    spike = bytearray(400 << 20)  # 400 MiB resident before the evaluation, freed before it starts
    spike[::4096] = b"x" * len(range(0, len(spike), 4096))
    del spike
    assert main(["eval", str(two_runs[0]), "--out", str(out), "progress=false"]) == 0
    record = json.loads(out.read_text())
    assert record["cost"]["pairs"] == 8 * 40 and record["cost"]["scoring_seconds"] > 0
    assert record["params_total"] > 0 and record["eval_precision"] == "fp32"
    if sys.platform == "linux":  # the peak is the evaluation's, not the process's (which saw the spike)
        assert record["cost"]["peak_host_scope"] == "evaluation"
        assert record["cost"]["peak_host_rss_mb"] < resident + 300


def _resident_mb() -> float:
    """This process's resident memory now (Linux ``VmRSS``), MiB; 0 elsewhere."""
    if sys.platform != "linux":
        return 0.0
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_report_csv_round_trips_the_runs_figures(two_runs, tmp_path):
    csv_path = tmp_path / "report.csv"
    out = tmp_path / "report.md"
    assert main(["report", *map(str, two_runs), "--out", str(out), "--csv", str(csv_path)]) == 0
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["run"] for r in rows] == ["seps", "longer"]
    for row, run in zip(rows, two_runs, strict=True):
        summary = json.loads((run / "summary.json").read_text())
        assert row["seeds"] == "1" and row["machine"] == f"{cpu_model()}, 1 thread"
        for key in ("rsum", "i2t_r1", "t2i_r10", "params_total", "train_seconds", "train_steps_per_s"):
            assert float(row[f"{key}_mean"]) == summary[key], key
            assert row[f"{key}_std"] == ""  # one run: no spread (undefined, not 0)
        for key in ("scoring_seconds", "pairs_per_s", "peak_host_rss_mb", "threads"):
            assert float(row[f"cost.{key}_mean"]) == summary["cost"][key], key
        assert row["cost.peak_device_mb_mean"] == ""  # recorded as None on the CPU: an empty cell
        expected = summary["cost"]["scoring_seconds"] * GALLERY_PAIRS / summary["cost"]["pairs"]
        assert float(row["seconds_per_1k_x_5k_mean"]) == pytest.approx(expected, rel=1e-12)
    text = out.read_text()
    assert "s / 1K x 5K" in text and "MACHINES" not in text  # one machine: nothing flagged
    assert (tmp_path / "report_cost.png").is_file() and "![accuracy vs cost](report_cost.png)" in text


def test_an_evaluation_from_before_costs_were_recorded_still_reads(tmp_path):
    run = shutil.copytree(COMPAT / "run", tmp_path / "old")
    (entry,) = collect([run])
    assert machine_of(entry) == "unknown" and seconds_per_gallery(entry) is None
    caption, header, rows = cost_rows([entry], {})
    assert rows[0][header.index("s / 1K x 5K")] == "" and rows[0][-1] == "unknown"


def test_the_pareto_front_of_a_hand_made_set():
    # (rsum, seconds): b is beaten by a (more accurate, cheaper); d ties c exactly; e is slow but best
    points = {
        "a": (400, 1.0),
        "b": (390, 2.0),
        "c": (380, 0.5),
        "d": (380, 0.5),
        "e": (450, 9.0),
        "f": (300, 0.5),
    }
    front = dict(zip(points, pareto_front(list(points.values())), strict=True))
    assert front == {"a": True, "b": False, "c": True, "d": True, "e": True, "f": False}


def _entry(label, rsum, seconds, device_name, device="cuda:0", threads=8, images=1000):
    cost = {"scoring_seconds": seconds, "pairs": GALLERY_PAIRS, "device": device, "device_name": device_name}
    cost |= {"threads": threads, "precision": "fp32"}
    summary = {"rsum": rsum, "cost": cost, "split": "test", "images": images, "captions": 5 * images}

    def value(key):
        record = summary
        for part in key.split("."):
            record = record.get(part) if isinstance(record, dict) else None
        return (float(record), 0.0) if isinstance(record, (int, float)) else None

    return SimpleNamespace(
        label=label,
        runs=[Path(label)],
        planned=1,
        missing=[],
        summaries=[summary],
        galleries=[f"test {images} x {5 * images}"],
        uses=[None],
        seeds_differ=[],
        value=value,
        first=lambda k: summary.get(k),
    )


def test_rows_measured_on_different_machines_are_never_ranked_against_each_other():
    # on the H100 the slow model is dominated; on the CPU it is alone, so on its own front
    entries = [
        _entry("fast-h100", 400, 1.0, "NVIDIA H100"),
        _entry("slow-h100", 390, 5.0, "NVIDIA H100"),
        _entry("cpu", 380, 50.0, "AMD EPYC", device="cpu", threads=2),
    ]
    caption, header, rows = cost_rows(entries, {})
    cells = {row[0]: row[header.index("s / 1K x 5K")] for row in rows}
    assert cells == {"fast-h100": "1.00 ★", "slow-h100": "5.00", "cpu": "50.0 ★"}  # 3 significant digits
    assert "2 MACHINES" in caption
    assert [row[-1] for row in rows] == [
        "NVIDIA H100, fp32",
        "NVIDIA H100, fp32",
        "AMD EPYC, 2 threads, fp32",
    ]


def test_report_shows_the_bytes_per_image_of_an_index_built_from_a_run(env, two_runs, tmp_path):
    out = tmp_path / "report.md"
    assert main(["report", str(env.run_dir), "--out", str(out), "--index", str(env.index_dir)]) == 0
    manifest = json.loads((env.index_dir / "manifest.json").read_text())
    size = sum(f.stat().st_size for f in env.index_dir.rglob("*") if f.is_file())
    expected = f"{size / len(manifest['entries']):,.0f}"
    rows = [line for line in out.read_text().splitlines() if line.startswith(f"| {env.run_dir.name} |")]
    cost_row = rows[1]  # the recall table's row, then the cost table's
    assert cost_row.split(" | ")[-2] == expected  # the index column, before the machine
    # an index of a run the report does not show: one line, exit 2, nothing written
    other = tmp_path / "other.md"
    assert main(["report", str(two_runs[0]), "--out", str(other), "--index", str(env.index_dir)]) == 2
    assert not other.exists()


def test_an_evaluation_with_only_neutral_overrides_still_describes_the_run(two_runs, tmp_path):
    from patchword.runs.recorded import evaluation_of

    run = shutil.copytree(two_runs[1], tmp_path / "copy")
    (run / "summary.json").unlink()  # only eval files describe the run now
    assert main(["eval", str(run), "progress=false", "eval.max_memory_mb=64"]) == 0
    record, name = evaluation_of(run, run / "best.pt")
    assert name == "eval_test.json" and record["overrides"] == ["progress=false", "eval.max_memory_mb=64"]
    # an override that changes what is measured: that file is not the run's evaluation
    assert main(["eval", str(run), "--out", str(run / "eval_dev.json"), "eval.split=dev"]) == 0
    (run / "eval_test.json").unlink()
    assert evaluation_of(run, run / "best.pt") == ({}, None)


def test_rows_measured_on_different_test_galleries_are_never_ranked_against_each_other():
    # the 12-image gallery's higher rSum says nothing about the 1000-image rows: each is its own front
    entries = [
        _entry("big-a", 400, 1.0, "NVIDIA H100"),
        _entry("big-b", 390, 5.0, "NVIDIA H100"),
        _entry("tiny", 500, 9.0, "NVIDIA H100", images=12),
    ]
    caption, header, rows = cost_rows(entries, {})
    cells = {row[0]: row[header.index("s / 1K x 5K")] for row in rows}
    assert cells == {"big-a": "1.00 ★", "big-b": "5.00", "tiny": "9.00 ★"}
    assert "2 TEST GALLERIES [test 1000 x 5000; test 12 x 60]" in caption and "MACHINES" not in caption


def test_report_refuses_a_json_that_is_not_a_gallery_benchmark(two_runs, tmp_path, capsys):
    wrong = tmp_path / "scoring.json"
    wrong.write_text(json.dumps({"kind": "scoring", "rows": []}))
    broken = tmp_path / "gallery.json"
    broken.write_text(json.dumps({"kind": "gallery", "rows": [{"images": 1000, "captions": 5000}]}))
    for path, message in ((wrong, "not a `patchword bench gallery --json` file"), (broken, "row 1 lacks")):
        out = tmp_path / f"{path.stem}.md"
        assert main(["report", str(two_runs[0]), "--out", str(out), "--gallery", str(path)]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith("error: ") and str(path) in line and message in line and "\n" not in line
        assert not out.exists()
    out = tmp_path / "r.md"
    assert (
        main(["report", str(two_runs[0]), "--out", str(out), "--csv", str(tmp_path / "nowhere" / "r.csv")])
        == 2
    )
    assert "--csv" in capsys.readouterr().err


def test_cost_of_a_several_process_evaluation_counts_the_whole_matrix():
    from patchword.eval.config import EvalConfig
    from patchword.eval.protocol import evaluation_cost

    timings = {"encode_seconds": 1.0, "scoring_seconds": 2.0, "pairs": 2_500_000}
    cost = evaluation_cost(
        timings, "cpu", EvalConfig(), 2, gallery_pairs=GALLERY_PAIRS, host_scope="evaluation"
    )
    assert (cost["pairs"], cost["pairs_this_process"], cost["pairs_per_s"]) == (
        GALLERY_PAIRS,
        2_500_000,
        2.5e6,
    )
    entry = _entry("two", 400, 2.0, "NVIDIA H100")
    entry.summaries[0]["cost"]["world_size"] = 2
    assert machine_of(entry) == "NVIDIA H100, 2 processes"
