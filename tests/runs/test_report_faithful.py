"""What ``patchword report`` (and an export's model card) shows is what was measured: the split the
evaluation read (not the role it was scored in), a run nothing evaluated as "not evaluated", every data
setting of the test split in its gallery, rows told apart by more than their directory's name, a sweep's
seeds that ran with different settings flagged. Hand-made run directories (``config.yaml`` and
``summary.json``) unless a test says otherwise."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.experiments import plots
from patchword.experiments.cost import cost_rows, gallery_of, plot_accuracy_cost
from patchword.experiments.report import _tables, collect, differing_keys
from patchword.experiments.report_csv import csv_text

CPU = {"device": "cpu", "device_name": "Xeon", "threads": 4, "world_size": 1, "precision": "fp32"}


def _summary(rsum: float = 300.0, seconds: float = 2.0, split: str = "test", **extra) -> dict:
    cost = {**CPU, "scoring_seconds": seconds, "pairs": 5_000_000}
    record = {"rsum": rsum, "split": split, "images": 1000, "captions": 5000, "leaky": False, "cost": cost}
    return {**record, **extra}


def _run(directory: Path, summary: dict | None = None, config: dict | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": 0, **(config or {})}))
    if summary is not None:
        (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def _column(table, column: str) -> dict[str, str]:
    caption, header, rows = table
    return {row[0]: row[header.index(column)] for row in rows}


def test_a_run_scored_on_its_model_selection_split_is_shown_and_flagged_as_such(tmp_path, monkeypatch):
    """Trained with data.test_split=dev, the run's evaluation records the role "test": the report showed
    "test (1000 / 5000)" under "Test metrics", ranked against held-out test rows; an eval.split=dev
    record the same under "Test metrics" and a "test rSum" axis."""
    devtest = _run(tmp_path / "devtest", _summary(400.0, 1.0), {"data": {"test_split": "dev"}})
    evaldev = _run(tmp_path / "evaldev", _summary(390.0, 0.5, split="dev"), {"eval": {"split": "dev"}})
    clean = _run(tmp_path / "clean", _summary(300.0, 2.0))
    entries = collect([devtest, evaldev, clean])
    tables = _tables(entries)
    caption = tables[0][0]
    split = _column(tables[0], "split (images / captions)")
    assert split["devtest"].startswith("dev (1000 / 5000), MODEL SELECTION SPLIT")
    assert split["evaldev"].startswith("dev (1000 / 5000), MODEL SELECTION SPLIT")
    assert split["clean"].startswith("test (1000 / 5000)") and "SELECTION" not in split["clean"]
    assert not caption.startswith("Test metrics") and "MODEL SELECTION SPLIT: scored on the split" in caption
    # the dev rows are a gallery of their own: never on the held-out rows' front
    assert gallery_of(entries[0]).startswith("dev 1000 x 5000 of synthetic")
    cost = cost_rows(entries, {})
    assert _column(cost, "s / 1K x 5K") == {
        "devtest (MODEL SELECTION SPLIT)": "1.00 ★",
        "evaldev (MODEL SELECTION SPLIT)": "0.500 ★",
        "clean": "2.00 ★",
    }
    assert "2 TEST GALLERIES" in cost[0] and "MODEL SELECTION SPLIT" in cost[0]
    rows = list(csv.DictReader(csv_text(entries).splitlines()))
    assert [(r["split"], r["split_use"]) for r in rows] == [
        ("dev", "model selection"),
        ("dev", "model selection"),
        ("test", ""),
    ]
    # the figure's axis says what its points are
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out: figures.append(fig))
    plot_accuracy_cost(entries, tmp_path / "mixed.png")
    plot_accuracy_cost(collect([clean]), tmp_path / "clean.png")
    assert [fig.axes[0].get_ylabel() for fig in figures] == [
        "rSum of each row's split (see legend)",
        "test rSum",
    ]
    assert _tables(collect([clean]))[0][0].startswith("Test metrics")
    # a test split that is the training split is not a test result either
    trained = _run(tmp_path / "ontrain", _summary(), {"data": {"test_split": "train"}})
    (label,) = [row[0] for row in cost_rows(collect([trained]), {})[2]]
    assert label == "ontrain (TRAINING SPLIT)"


@pytest.mark.usefixtures("one_thread")
def test_the_export_card_names_the_split_read_and_says_a_dev_split_is_no_test_result(tmp_path):
    """A run trained with data.test_split=dev: its card's table read "| test | 8 | 40 |"."""
    args = [*TINY_RUN_32, "train.max_steps=2", "data.test_split=dev", "progress=false"]
    assert main(["train", *args, f"output_dir={tmp_path}", "name=devtest"]) == 0
    assert main(["export", str(tmp_path / "devtest"), str(tmp_path / "model")]) == 0
    card = (tmp_path / "model" / "README.md").read_text()
    assert "| dev | 8 | 40 |" in card and "| test |" not in card
    assert "**Not a test result:** split `dev` is the one training chose its checkpoint on" in card


def test_a_run_nothing_evaluated_is_not_evaluated_never_leak_free_or_complete(tmp_path):
    """A run still training (config.yaml, no summary): "leak-free" in the test table, "leak-free" and
    complete "yes" in the CSV; an imported checkpoint not yet evaluated: "measured here leak-free"."""
    live = _run(tmp_path / "live")
    imported = _run(tmp_path / "imported", config={"data": {"dataset": "laps", "root": "/data/f30k"}})
    (imported / "import.json").write_text(json.dumps({"family": "seps", "opt": {"vit_type": "vit_224"}}))
    done = _run(tmp_path / "done", _summary())
    entries = collect([live, imported, done])
    tables = _tables(entries)
    caption, header, rows = tables[0]
    assert rows[0][0] == "live (NOT EVALUATED)" and rows[0][header.index("protocol")] == ""
    assert rows[0][header.index("split (images / captions)")] == "not evaluated"
    assert "NOT EVALUATED: a run with no evaluation recorded" in caption
    assert _column(cost_rows(entries, {}), "machine, precision")["live (NOT EVALUATED)"] == ""
    rows = list(csv.DictReader(csv_text(entries).splitlines()))
    assert [(r["run"], r["protocol"], r["complete"]) for r in rows] == [
        ("live", "", "no"),
        ("imported", "", "no"),
        ("done", "leak-free", "yes"),
    ]
    (published,) = [t for t in tables if t[0].startswith("Published")]
    assert "measured here leak-free" not in published[0] and "12 test images" not in published[0]
    # the published row marked with its footnote (its protocol and note, under the table)
    assert {row[2] for row in published[2]} == {"published [1]", "not measured here yet"}


def test_the_gallery_holds_every_data_setting_of_the_test_split(tmp_path):
    """Runs whose test split differs only in data.dense_omit_prob (other dense captions), in the synthetic
    regions' noise or in data.dense_test were one gallery, ranked against each other; the test-metrics
    table never warned, and rows of an unknown machine were not counted at all."""
    base = {"data": {"dense_omit_prob": 0.15}}
    a = _run(tmp_path / "a", _summary(300.0, 1.0), base)
    omit = _run(tmp_path / "omit", _summary(290.0, 2.0), {"data": {"dense_omit_prob": 0.5}})
    workers = _run(
        tmp_path / "workers", _summary(280.0, 3.0), {"data": {"num_workers": 0, "vocab_min_count": 4}}
    )
    entries = collect([a, omit, workers])
    assert gallery_of(entries[1]).endswith(
        "of synthetic (simple scenes, seed 0, 64 px, data.dense_omit_prob=0.5)"
    )
    assert gallery_of(entries[0]) == gallery_of(entries[2])  # how the data is read: the same gallery
    caption, header, rows = _tables(entries)[0]
    assert "2 TEST GALLERIES [G1: test 1000 x 5000 of synthetic" in caption
    assert [row[header.index("split (images / captions)")] for row in rows] == [
        "test (1000 / 5000) [G1]",
        "test (1000 / 5000) [G2]",
        "test (1000 / 5000) [G1]",
    ]
    assert _column(cost_rows(entries, {}), "s / 1K x 5K") == {
        "a": "1.00 ★",
        "omit": "2.00 ★",
        "workers": "3.00",
    }
    regions = {"dataset": "synthetic_regions"}
    noisy = _run(tmp_path / "noisy", _summary(), {"data": {**regions, "region_noise": 0.9}})
    plain = _run(tmp_path / "plain", _summary(), {"data": regions})
    laps = {"dataset": "laps", "root": "/data/f30k"}
    other_dense = _run(tmp_path / "dense2", _summary(), {"data": {**laps, "dense_test": "/d/other.jsonl"}})
    f30k = _run(tmp_path / "f30k", _summary(), {"data": {**laps, "dense_train": "/d/train.jsonl"}})
    galleries = [gallery_of(e) for e in collect([noisy, plain, other_dense, f30k])]
    assert len(set(galleries)) == 4 and galleries[3] == "test 1000 x 5000 of laps (/data/f30k)"
    # evaluations recorded before costs were (machine unknown) on two galleries: counted all the same
    old = [
        _run(tmp_path / f"old{i}", {k: v for k, v in _summary().items() if k != "cost"}, c)
        for i, c in enumerate([base, {"data": {"dense_omit_prob": 0.5}}])
    ]
    assert "2 TEST GALLERIES" in cost_rows(collect(old), {})[0]


def _sweep(root: Path, record: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "sweep.json").write_text(json.dumps({"config": None, "overrides": [], "summary": {}, **record}))
    return root


def test_a_sweep_whose_seeds_ran_with_different_settings_is_flagged_not_averaged_as_equal(tmp_path):
    """Seed 1 resumed with train.max_steps=5 (resumes.jsonl): the report read seed 0's config only, and
    its "Config keys that differ (all others are equal)" table did not list train.max_steps."""
    sw = tmp_path / "sw"
    for seed in (0, 1):
        _run(sw / f"seed-{seed}", _summary(300.0 + seed), {"seed": seed, "train": {"max_steps": 2}})
    (sw / "seed-1" / "resumes.jsonl").write_text(json.dumps({"step": 2, "overrides": ["train.max_steps=5"]}))
    _sweep(sw, {"seeds": [0, 1], "variants": {}, "runs": {"runs": {"0": {}, "1": {}}}})
    (entry,) = entries = collect([sw])
    assert "train.max_steps" in differing_keys(entries)
    from patchword.experiments.entries import SeedsDiffer

    assert entry.seeds_differ == ["train.max_steps"]
    assert differing_keys(entries) == {"train.max_steps": [SeedsDiffer({0: 2, 1: 5})]}
    tables = _tables(entries)
    caption, header, rows = tables[-1]
    assert rows == [["train.max_steps", "DIFFERS BETWEEN SEEDS (seed 0: 2; seed 1: 5)"]]
    assert "DIFFERS BETWEEN SEEDS" in caption and "all others are equal" in caption
    assert tables[0][2][0][0] == "sw (SEEDS DIFFER)" and "SEEDS DIFFER" in tables[0][0]
    # each resume applies its own overrides to config.yaml: a plain resume after it ran with 2 again
    with (sw / "seed-1" / "resumes.jsonl").open("a") as fh:
        fh.write("\n" + json.dumps({"step": 5, "overrides": []}) + "\n")
    assert collect([sw])[0].seeds_differ == []


def test_rows_of_runs_with_the_same_directory_name_are_told_apart(tmp_path, monkeypatch):
    """R/a and R/x/a were both labelled "a": one ★ and one index size keyed "a" served both rows."""
    # the index here is a manifest alone (no shards, so no dead rows: tests/search/test_index_bytes.py
    # measures a real one)
    monkeypatch.setattr("patchword.experiments.cost.dead_row_bytes", lambda index_dir: 0)
    first = _run(tmp_path / "R" / "a", _summary(300.0, 1.0))
    second = _run(tmp_path / "R" / "x" / "a", _summary(200.0, 2.0))  # dominated by the first
    index = tmp_path / "a.index"
    index.mkdir()
    manifest = {"model": {"run_dir": str(first)}, "entries": [{"id": i} for i in range(4)]}
    (index / "manifest.json").write_text(json.dumps(manifest))
    out, table = tmp_path / "report.md", tmp_path / "report.csv"
    args = ["report", str(first), str(second), "--out", str(out), "--csv", str(table), "--index", str(index)]
    assert main(args) == 0
    entries = collect([first, second])
    assert [e.label for e in entries] == ["R/a", "x/a"]
    from patchword.experiments.report import _index_sizes

    cost = cost_rows(entries, _index_sizes(entries, (index,)))
    assert _column(cost, "s / 1K x 5K") == {"R/a": "1.00 ★", "x/a": "2.00"}
    assert _column(cost, "index bytes/image")["x/a"] == "" and _column(cost, "index bytes/image")["R/a"]
    assert [r["run"] for r in csv.DictReader(table.open())] == ["R/a", "x/a"]
    # sweeps too, and the same run given twice keeps one label
    for parent in (tmp_path / "S" / "sw", tmp_path / "S" / "y" / "sw"):
        _run(parent / "v" / "seed-0", _summary())
        _sweep(parent, {"seeds": [0], "variants": {"v": []}, "runs": {"v": {"0": {}}}})
    labels = [e.label for e in collect([tmp_path / "S" / "sw", tmp_path / "S" / "y" / "sw", first, first])]
    assert labels == ["S/sw/v", "y/sw/v", "a", "a"]


@pytest.mark.parametrize("planned, shown", [([0], "1"), ([0, 1], "1 of 2 (missing: 1)")])
def test_a_variant_is_incomplete_only_for_the_seeds_it_was_asked_for(tmp_path, planned, shown):
    """A second invocation added variant b with --seeds 0 to a sweep of a at seeds 0,1: b read "INCOMPLETE,
    1 of 2" and "the same `patchword sweep` command resumes it", which it never does."""
    sw = tmp_path / "sw"
    for variant, seeds in (("a", [0, 1]), ("b", [0])):
        for seed in seeds:
            _run(sw / variant / f"seed-{seed}", _summary(), {"seed": seed})
    runs = {"a": {"0": {}, "1": {}}, "b": {"0": {}}}
    _sweep(
        sw,
        {
            "seeds": [0, 1],
            "variants": {"a": [], "b": []},
            "runs": runs,
            "planned_seeds": {"a": [0, 1], "b": planned},
        },
    )
    caption, header, rows = _tables(collect([sw]))[0]
    assert [row[1] for row in rows] == ["2", shown]
    assert ("INCOMPLETE" in caption) == (len(planned) > 1)
    if len(planned) > 1:
        assert rows[1][0] == "sw/b (INCOMPLETE)" and "same `patchword sweep` command" not in caption
        assert "the row's --variant (if it has one) and the missing --seeds resumes it" in caption


def test_a_variant_named_runs_is_read_from_its_own_directory(tmp_path, capsys):
    """sweep.json keeps a sweep without variants under "runs", as it keeps a variant named runs: the
    report looked for sw/seed-0 and stopped with "does not exist"."""
    sw = tmp_path / "sw"
    _run(sw / "runs" / "seed-0", _summary())
    _sweep(sw, {"seeds": [0], "variants": {"runs": ["train.lr=1e-4"]}, "runs": {"runs": {"0": {}}}})
    (entry,) = collect([sw])
    assert (entry.label, entry.runs) == ("sw/runs", [sw / "runs" / "seed-0"])
    # a variant name that is not a directory of the sweep is read from nowhere
    bad = _sweep(tmp_path / "bad", {"seeds": [0], "variants": {}, "runs": {"../x": {"0": {}}}})
    assert main(["report", str(bad), "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad / "sweep.json") in err and "'../x'" in err and "\n" not in err


def test_small_figures_keep_their_significant_digits(tmp_path):
    """0.0012 s per 1K x 5K read 0.00, a 0.118 s training 0, a 4,000-parameter model 0.00 / 0.00."""
    summary = _summary(300.0, 0.0012, train_seconds=0.118, params_total=4000, params_trainable=4000)
    entries = collect([_run(tmp_path / "small", summary)])
    cost = cost_rows(entries, {})
    assert _column(cost, "s / 1K x 5K")["small"] == "0.00120 ★"
    assert _column(cost, "train s")["small"] == "0.118"
    assert _column(cost, "params M (total / trainable)")["small"] == "0.00400 / 0.00400"
    assert _column(_tables(entries)[0], "train s")["small"] == "0.118"
