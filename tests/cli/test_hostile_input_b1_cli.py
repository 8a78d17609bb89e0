"""A hostile-input review of ``demo``, ``data``, ``sweep`` (review B1): the demo moving aside a run another
process trains, or any run that is not a demo's; ``data export synthetic`` taking settings it never applies
and a split size numpy cannot allocate; a sweep variant named like a seed's run, a damaged ``last.pt``
found only after ``sweep.json`` was rewritten; an unknown id in a LAPS ids file read as a second run of
another. Each is one ``error:`` line naming the directory, flag, key or line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, laps_args, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- demo


class Started(Exception):
    """Raised where the demo would start preparing its data: what it did before is what is checked."""


@pytest.fixture
def demo_stops_at_its_data(monkeypatch):
    def stop(*args, **kwargs):
        raise Started

    monkeypatch.setattr("patchword.data.prepare.prepare_data", stop)


def _demo_run(root: Path, name: str, overrides: list[str], summary: dict | None = None) -> Path:
    """A run directory as an interrupted (``summary`` None) or finished demo with ``overrides`` leaves it."""
    from patchword.config import save_config
    from patchword.recipes.demo import demo_config

    run = root / name
    run.mkdir(parents=True)
    save_config(demo_config(overrides), run / "config.yaml")
    (run / "last.pt").write_bytes(b"a checkpoint")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_the_demo_does_not_move_an_ordinary_run_aside(
    trained_tiny_run, tmp_path, capsys, demo_stops_at_its_data
):
    """Old code: ``demo name=X`` moved any directory X aside (a `patchword train` run included)."""
    runs = tmp_path / "runs"
    run = Path(shutil.copytree(trained_tiny_run, runs / "tiny"))
    before = _snapshot(run)
    assert main(["demo", f"output_dir={runs}", "name=tiny"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {run} is not an earlier demo's run (the demo moves aside only its own): choose another "
        f"name= for the demo, or move {run} yourself"
    )
    assert sorted(p.name for p in runs.iterdir()) == ["tiny"] and _snapshot(run) == before


def test_the_demo_does_not_move_a_run_in_use(tmp_path, capsys, demo_stops_at_its_data):
    """Old code: the demo moved a run directory another process was training in (no lock taken)."""
    from patchword.train.runner import TRAIN_RUNS

    overrides = [f"output_dir={tmp_path}"]
    run = _demo_run(tmp_path, "demo", overrides)
    with TRAIN_RUNS.lock(run):  # what a `patchword train --resume` of it holds
        assert main(["demo", *overrides]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: run directory {run} is in use by another process"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "interrupted"])
def test_the_demo_moves_an_earlier_demo_aside(tmp_path, finished, demo_stops_at_its_data):
    """An earlier demo is told by what only the demo writes (``pretrained_global`` in its summary) or, one
    stopped before that, by its config (this demo's)."""
    overrides = [f"output_dir={tmp_path}"]
    summary = {"rsum": 1.0, "pretrained_global": {"rsum": 1.0}} if finished else None
    earlier = _snapshot(
        _demo_run(tmp_path, "demo", ["train.max_steps=7", *overrides] if finished else overrides, summary)
    )
    with pytest.raises(Started):
        main(["demo", *overrides])
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("demo-")]
    assert {k: v for k, v in _snapshot(aside).items() if k != ".lock"} == earlier
    assert not (tmp_path / "demo").exists()


def test_an_interrupted_run_of_another_config_is_not_taken_for_a_demo(
    tmp_path, capsys, demo_stops_at_its_data
):
    run = _demo_run(tmp_path, "demo", [f"output_dir={tmp_path}", "train.max_steps=7"])
    assert main(["demo", f"output_dir={tmp_path}"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {run} is not an earlier demo's run")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "last.pt"]


# ------------------------------------------------------------------------------- data export / check


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.embed_dim=-1", "error: model.embed_dim: is not read by `data export synthetic`"),
        ("train.lr=5", "error: train.lr: is not read by `data export synthetic`"),
        ("data.dev_from_train=1", "error: data.dev_from_train: applies to image-file datasets"),
        ("data.num_workers=-1", "error: data.num_workers: must be >= 0, got -1"),
        ("data.num_test=100000000", "error: data.num_test: at most 10,000,000 images a split"),
    ],
)
def test_data_export_refuses_settings_it_never_applies(tmp_path, capsys, override, expected):
    """Old code: wrote the scenes with model.embed_dim=-1, train.lr=5 or data.dev_from_train=1 accepted
    (data check refuses the last), and a huge data.num_test was numpy's ArrayMemoryError traceback."""
    out = tmp_path / "scenes"
    assert main(["data", "export", "synthetic", "--out", str(out), override]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(expected)
    assert list(tmp_path.iterdir()) == []


def test_data_check_of_a_huge_split_is_one_line(capsys):
    assert main(["data", "check", "data.num_test=100000000"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line
        == "error: data.num_test: at most 10,000,000 images a split (generated in memory), got 100,000,000"
    )


def test_an_unknown_id_inside_an_images_block_is_named_at_its_line(laps_dataset, capsys):
    """Old code: an unknown id at train_ids.txt:2 between two lines of train0 was reported as train0
    starting a second run at line 3."""
    ids = laps_dataset["root"] / "train_ids.txt"
    lines = ids.read_text().splitlines()
    lines[1:3] = ["bogus", "train0"]
    ids.write_text("\n".join(lines) + "\n")
    assert main(["data", "check", "--split", "train", *laps_args(laps_dataset)]) == 2
    out = capsys.readouterr().out
    assert (
        f"error: image id 'bogus' ({ids}:2) is missing from {laps_dataset['root'] / 'id_mapping.json'}" in out
    )


# --------------------------------------------------------------------------------------------- sweep

TINY = [*TINY_RUN_32, "train.max_steps=2"]


def test_a_variant_named_like_a_seeds_run_is_refused(tmp_path, capsys, monkeypatch):
    """Old code: ``--variant "seed-0: ..."`` put its runs inside the sweep's run of seed 0
    (``sw/seed-0/seed-0``)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a run started before the variants were checked")

    monkeypatch.setattr("patchword.train.runner.train_run", refuse)
    code = main(
        [
            "sweep",
            "--seeds",
            "0",
            "--name",
            "sw",
            "--variant",
            "seed-0: train.lr=1e-3",
            *TINY,
            f"output_dir={tmp_path}",
        ]
    )
    assert code == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --variant: 'seed-0' is the name of a seed's run directory: rename it"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_last_pt_stops_the_sweep_before_sweep_json_is_rewritten(tmp_path, capsys):
    """Old code: the finished seed 0 was kept and sweep.json rewritten (without seed 1's row) before seed
    1's damaged last.pt was read by its resume."""
    argv = [
        "sweep",
        "--seeds",
        "0,1",
        "--name",
        "sw",
        *TINY,
        f"output_dir={tmp_path}",
        f"data.cache_dir={tmp_path / 'c'}",
    ]
    assert main(argv) == 0
    seed = tmp_path / "sw" / "seed-1"
    (seed / "summary.json").unlink()
    last = seed / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    record = (tmp_path / "sw" / "sweep.json").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {last}: not a readable patchword checkpoint"), line
    assert (tmp_path / "sw" / "sweep.json").read_bytes() == record


def test_two_variants_of_one_name_are_refused_naming_it(tmp_path, capsys):
    """Old code: ``two variants share a name``, which name unsaid."""
    argv = [
        "sweep",
        "--seeds",
        "0",
        "--name",
        "sw",
        "--variant",
        "a: train.lr=1e-3",
        "--variant",
        "a: seed=2",
    ]
    assert main([*argv, *TINY, f"output_dir={tmp_path}"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --variant: two variants share the name 'a'"
    assert list(tmp_path.iterdir()) == []


def test_a_data_root_that_is_a_file_is_said_to_be_one(tmp_path, capsys):
    """Old code: ``data.root=FILE: no such directory``."""
    root = tmp_path / "root.txt"
    root.write_text("not a dataset")
    argv = ["train", *TINY_RUN_32, "data.dataset=laps", "data.image_size=32", f"data.root={root}"]
    argv.append(f"output_dir={tmp_path}")
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"data.root={root}: is a file, not a directory" in line, line
