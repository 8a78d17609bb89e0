"""What a ``patchword report`` row's cells say they are, from hand-made run directories (``config.yaml`` and
``summary.json``; no training): a sweep row whose seeds scored different splits, a record that holds no
recalls, one seed's undefined spread, the training time's spread, the checkpoint a row's figures are of and
the machine its training ran on."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.cost import cost_rows
from patchword.experiments.report import _tables, collect
from patchword.experiments.report_csv import csv_text
from patchword.experiments.rows import significant
from patchword.experiments.sweep import mean_std, mean_std_of, summarize

XEON = {"device": "cpu", "device_name": "Xeon", "threads": 4, "world_size": 1, "precision": "fp32"}


def _summary(rsum: float = 300.0, split: str = "test", **extra) -> dict:
    recalls = {key: rsum / 6 for key in RECALL_KEYS} | {"rsum": rsum}
    cost = {**XEON, "scoring_seconds": 1.0, "pairs": 5_000_000}
    return {
        **recalls,
        "split": split,
        "images": 1000,
        "captions": 5000,
        "leaky": False,
        "cost": cost,
        **extra,
    }


def _run(
    directory: Path, summary: dict | None, config: dict | None = None, name: str = "summary.json"
) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": 0, **(config or {})}))
    if summary is not None:
        (directory / name).write_text(json.dumps(summary))
    return directory


def _sweep(sw: Path, summaries: list[dict], configs: list[dict] | None = None) -> Path:
    for seed, summary in enumerate(summaries):
        _run(sw / f"seed-{seed}", summary, {"seed": seed, **(configs[seed] if configs else {})})
    seeds = list(range(len(summaries)))
    record = {"config": None, "overrides": [], "summary": {}, "seeds": seeds, "variants": {}}
    (sw / "sweep.json").write_text(json.dumps(record | {"runs": {"runs": {str(s): {} for s in seeds}}}))
    return sw


def _column(table, column: str) -> dict[str, str]:
    caption, header, rows = table
    return {row[0]: row[header.index(column)] for row in rows}


def test_a_sweep_row_whose_seeds_scored_different_splits_says_so_and_is_ranked_nowhere(tmp_path):
    """Seed 2 resumed after the sweep with eval.split=dev: the row read "test (1000 / 5000)" from seed 0
    alone, under "Test metrics", starred on the front of the test gallery, "test" in the CSV."""
    dev = {"eval": {"split": "dev"}}
    sw = _sweep(tmp_path / "sw", [_summary(300.0), _summary(310.0), _summary(390.0, "dev")], [{}, {}, dev])
    entries = collect([sw])
    tables = _tables(entries)
    caption, header, rows = tables[0]
    split = _column(tables[0], "split (images / captions)")["sw (SEEDS DIFFER)"]
    assert split == (
        "MIXED: dev (1000 / 5000) [G2] (1 run); test (1000 / 5000) [G1] (2 runs), MODEL SELECTION SPLIT"
    )
    assert not caption.startswith("Test metrics") and "MIXED GALLERIES" in caption
    assert "G1: test 1000 x 5000" in caption and "G2: dev 1000 x 5000" in caption
    cost = cost_rows(entries, {})
    assert _column(cost, "s / 1K x 5K") == {
        "sw (SEEDS DIFFER; MODEL SELECTION SPLIT; MIXED GALLERIES)": "1.00 ± 0.00"  # no ★
    }
    (row,) = csv.DictReader(csv_text(entries).splitlines())
    assert row["split"] == "MIXED: dev (1 run); test (2 runs)"
    assert row["split_use"] == "held-out; held-out; model selection"  # one entry per run
    assert (
        row["gallery"].startswith("MIXED: dev 1000 x 5000 of synthetic")
        and row["seeds_differ"] == "eval.split"
    )
    # the seeds of one gallery: one split, ranked on its front
    same = collect([_sweep(tmp_path / "same", [_summary(300.0), _summary(310.0)])])
    assert _column(_tables(same)[0], "split (images / captions)") == {"same": "test (1000 / 5000)"}
    assert _column(cost_rows(same, {}), "s / 1K x 5K") == {"same": "1.00 ± 0.00 ★"}
    (row,) = csv.DictReader(csv_text(same).splitlines())
    assert (row["split"], row["split_use"], row["seeds_differ"]) == ("test", "", "")


def test_a_record_without_recalls_is_not_an_evaluation(tmp_path):
    """A metrics.json holding an export's record (its figures nested under "metrics", no weights digest
    here) made an evaluated, complete, leak-free row with empty figures."""
    nested = {"patchword_version": "0.1.0", "metrics": _summary(), "checkpoint_step": 4}
    entries = collect([_run(tmp_path / "exported", nested, name="metrics.json")])
    caption, header, rows = _tables(entries)[0]
    assert rows[0][0] == "exported (NOT EVALUATED)"
    assert rows[0][header.index("split (images / captions)")] == "not evaluated"
    (row,) = csv.DictReader(csv_text(entries).splitlines())
    assert (row["complete"], row["protocol"], row["split"]) == ("no", "", "")


def test_one_seeds_spread_is_undefined_not_zero(tmp_path):
    """A single seed's std was 0.0: sweep.json std 0.0, the CSV's rsum_std 0.0."""
    assert mean_std([300.0]) == (300.0, None)
    assert mean_std([1.0, 3.0])[1] == pytest.approx(2**0.5)
    summary = summarize({0: {"rsum": 300.0, "i2t_r1": 20.0}})
    assert summary["std"]["rsum"] is None and summary["mean"]["rsum"] == 300.0
    assert json.loads(json.dumps(summary))["std"]["i2t_r1"] is None  # written null
    assert significant((300.0, None), 1) == "300"
    (row,) = csv.DictReader(csv_text(collect([_run(tmp_path / "one", _summary())])).splitlines())
    assert row["rsum_mean"] == "300.0" and row["rsum_std"] == "" and row["cost.threads_std"] == ""


def test_the_training_time_of_a_sweep_row_shows_its_spread(tmp_path):
    """The caption says mean ± sample std; the test table's train s showed the mean alone."""
    sw = _sweep(tmp_path / "sw", [_summary(train_seconds=1.0), _summary(train_seconds=2.0)])
    entries = collect([sw])
    assert _column(_tables(entries)[0], "train s") == {"sw": "1.50 ± 0.71"}
    assert _column(cost_rows(entries, {}), "train s") == {"sw": "1.50 ± 0.71"}


def test_rows_show_the_checkpoint_their_figures_are_of(tmp_path):
    """Two runs of one config whose best.pt were saved at different steps read the same but for their
    figures; a sweep row whose seeds kept different steps lists each."""
    early = _run(tmp_path / "early", _summary(checkpoint_step=4, steps=8))
    late = _run(tmp_path / "late", _summary(checkpoint_step=7, steps=8))
    imported = _run(tmp_path / "imported", _summary())  # an evaluation record names no training step
    sw = _sweep(tmp_path / "sw", [_summary(checkpoint_step=3, steps=8), _summary(checkpoint_step=8, steps=8)])
    entries = collect([early, late, imported, sw])
    assert _column(_tables(entries)[0], "checkpoint step / steps") == {
        "early": "4 / 8",
        "late": "7 / 8",
        "imported": "",
        "sw": "3, 8 / 8",
    }
    rows = {row["run"]: row for row in csv.DictReader(csv_text(entries).splitlines())}
    assert (rows["early"]["checkpoint_step_mean"], rows["late"]["checkpoint_step_mean"]) == ("4.0", "7.0")
    assert rows["late"]["steps_mean"] == "8.0" and rows["sw"]["checkpoint_step_std"] != ""


def _session(threads: int, steps: int = 4, device: str = "cpu", name: str = "Xeon") -> dict:
    return {"device": device, "device_name": name, "threads": threads, "world_size": 1, "timed_steps": steps}


def test_the_training_time_is_labelled_with_the_training_machine(tmp_path):
    """Evaluated with 4 threads, trained with 1: the training steps/s read "Xeon, 4 threads"; a run resumed
    with 2 threads blended both sessions' steps into one rate labelled with neither."""
    timed = {"train_seconds": 3.0, "train_steps_per_s": 4.0}
    one = _run(tmp_path / "one", _summary(**timed, train_sessions=[_session(1), _session(1)]))
    resumed = _run(tmp_path / "resumed", _summary(**timed, train_sessions=[_session(1), _session(2)]))
    gpu = _run(
        tmp_path / "gpu", _summary(**timed, train_sessions=[_session(8, device="cuda:0", name="H100")])
    )
    old = _run(tmp_path / "old", _summary(**timed))  # written before sessions were recorded
    entries = collect([one, resumed, gpu, old])
    cost = cost_rows(entries, {})
    assert _column(cost, "train machine") == {
        "one": "Xeon, 1 thread",
        "resumed": "MIXED: Xeon, 1 thread (1 session); Xeon, 2 threads (1 session)",
        "gpu": "H100",
        "old": "unknown",
    }
    assert _column(cost, "train steps/s") == {"one": "4.00", "resumed": "mixed", "gpu": "4.00", "old": "4.00"}
    assert _column(cost, "machine, precision")["one"] == "Xeon, 4 threads, fp32"  # the evaluation's
    assert "MIXED train machine" in cost[0]
    rows = {row["run"]: row for row in csv.DictReader(csv_text(entries).splitlines())}
    assert (
        rows["resumed"]["train_machine"].startswith("MIXED: ")
        and rows["resumed"]["train_steps_per_s_mean"] == ""
    )
    assert rows["one"]["train_machine"] == "Xeon, 1 thread" and rows["one"]["train_steps_per_s_mean"] == "4.0"


def test_a_damaged_training_session_is_named(tmp_path):
    from patchword.errors import DataError

    bad = _run(tmp_path / "bad", _summary(train_sessions=[{"device": "cpu", "threads": "two"}]))
    with pytest.raises(
        DataError, match=r"summary.json: train_sessions item 1: threads is \"two\", not a number"
    ):
        collect([bad])


def test_a_rows_mean_is_over_numbers_only():
    """``Entry.value`` and the suite table's ``suite_value`` share one rule (each had its own copy): no
    figure where a run lacks it or records something other than a number (a bool is none)."""
    assert mean_std_of([]) is None and mean_std_of([1.0, None]) is None
    assert mean_std_of([1.0, True]) is None and mean_std_of([1.0, "3"]) is None
    assert mean_std_of([300.0]) == (300.0, None)
    assert mean_std_of([1, 3.0]) == (2.0, pytest.approx(2**0.5))
