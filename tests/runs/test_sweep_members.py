"""What a sweep does with the directories and the record it finds under its name: a seed directory holding
files no run of the sweep left is refused (never cleared), what a start killed before its first checkpoint
left is started again, and a later invocation with fewer seeds or other variants adds to ``sweep.json``
instead of cutting the record down to its own seeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [*TINY_RUN_32, "train.max_steps=2"]


def _sweep(out: Path, seeds: str, *extra: str) -> int:
    return main(["sweep", "--seeds", seeds, "--name", "sw", *TINY, f"output_dir={out}", *extra])


def _record(out: Path) -> dict:
    return json.loads((out / "sw" / "sweep.json").read_text())


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a run starts (or resumes)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr("patchword.train.runner.train_run", refuse)
    monkeypatch.setattr("patchword.train.runner.resume_run", refuse)


@pytest.fixture
def two_seeds(tmp_path) -> Path:
    """A finished 2-seed sweep ``sw`` under ``tmp_path`` (its runs record their output_dir: no copies)."""
    assert _sweep(tmp_path, "0,1") == 0
    return tmp_path


@pytest.mark.parametrize("planted", ["notes.txt", "data/images.txt", "config.yaml+notes.txt"])
def test_files_in_a_seed_directory_that_no_run_left_are_refused_not_deleted(
    tmp_path, capsys, no_training, planted
):
    """f715cbc removed any seed directory without last.pt or summary.json (`rmtree`) and started the seed:
    `--name mine` over output_dir/mine/seed-0 holding a user's files deleted them and exited 0."""
    seed_dir = tmp_path / "sw" / "seed-0"
    for name in planted.split("+"):
        (seed_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (seed_dir / name).write_text("seed: 0\n" if name == "config.yaml" else "mine")
    before = _files(tmp_path)
    code = _sweep(tmp_path, "0")
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith(f"error: --name: {seed_dir} holds files a run of the sweep did not")
    assert _files(tmp_path) == before and not (tmp_path / "sw" / "sweep.json").exists()


def test_what_a_killed_start_left_is_started_again(two_seeds, capsys):
    """A start killed before its first checkpoint leaves config.yaml, vocab.json and metrics.jsonl (and the
    lock file): the sweep starts that seed again, as `patchword train` does."""
    first = two_seeds / "sw" / "seed-0"
    killed = two_seeds / "sw" / "seed-2"
    killed.mkdir()
    for name in ("vocab.json", "metrics.jsonl"):
        shutil.copy(first / name, killed / name)
    config = (first / "config.yaml").read_text()
    assert "\nname: seed-0\n" in config and "\nseed: 0\n" in config
    (killed / "config.yaml").write_text(
        config.replace("\nname: seed-0\n", "\nname: seed-2\n").replace("\nseed: 0\n", "\nseed: 2\n")
    )
    (killed / ".lock").touch()
    assert _sweep(two_seeds, "2") == 0
    assert (killed / "summary.json").is_file()
    assert sorted(_record(two_seeds)["runs"]["runs"]) == ["0", "1", "2"]


def test_a_rerun_with_fewer_seeds_keeps_the_others_in_the_record(two_seeds, no_training):
    """f715cbc rewrote sweep.json with `--seeds 0` alone: seed 1's result and the 2-seed mean were gone."""
    before = _record(two_seeds)
    assert _sweep(two_seeds, "0") == 0
    after = _record(two_seeds)
    assert after["seeds"] == [0, 1] and list(after["runs"]["runs"]) == ["0", "1"]
    assert after["runs"] == before["runs"] and after["summary"] == before["summary"]
    assert after["summary"]["runs"]["n"] == 2


def test_a_rerun_with_a_new_seed_adds_it_to_the_record(two_seeds):
    assert _sweep(two_seeds, "2") == 0
    after = _record(two_seeds)
    assert after["seeds"] == [0, 1, 2] and list(after["runs"]["runs"]) == ["0", "1", "2"]
    assert after["summary"]["runs"]["n"] == 3


def test_a_kept_seed_made_with_other_settings_is_refused(two_seeds, capsys, no_training):
    """Keeping seeds 0 and 1 in the record next to a seed 2 run with another learning rate would average two
    recipes: refused, naming the run, before anything runs or is rewritten."""
    before = _files(two_seeds)
    assert _sweep(two_seeds, "2", "train.lr=0.5") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --name: ") and "was made with other settings (train.lr" in line
    assert _files(two_seeds) == before


def test_a_kept_seed_whose_run_is_gone_leaves_the_sweep_incomplete(two_seeds, no_training):
    """Its result cannot be read back: it leaves the runs, its seed stays planned (report: 1 of 2)."""
    shutil.rmtree(two_seeds / "sw" / "seed-1")
    assert _sweep(two_seeds, "0") == 0
    after = _record(two_seeds)
    assert after["seeds"] == [0, 1] and list(after["runs"]["runs"]) == ["0"]
    assert after["summary"]["runs"]["n"] == 1


def test_a_rerun_with_another_variant_keeps_the_first(tmp_path):
    assert _sweep(tmp_path, "0", "--variant", "a: train.lr=1e-3") == 0
    first = _record(tmp_path)
    assert _sweep(tmp_path, "0", "--variant", "b: train.lr=2e-3") == 0
    after = _record(tmp_path)
    assert after["variants"] == {"a": ["train.lr=1e-3"], "b": ["train.lr=2e-3"]}
    assert list(after["runs"]) == ["a", "b"] and after["runs"]["a"] == first["runs"]["a"]
    assert after["summary"]["a"] == first["summary"]["a"]
