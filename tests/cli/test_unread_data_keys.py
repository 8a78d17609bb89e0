"""``data.*`` keys the chosen dataset never reads (data/config.py ``READ_BY``): refused when the user sets
them (a new run's config, an evaluation's overrides), never on a saved run's config.yaml, which an older
version may have written with one (the run must still resume and evaluate)."""

from __future__ import annotations

import pytest

from conftest import laps_args, one_error_line
from patchword.cli import main
from patchword.data.config import DataConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_train_and_data_check_refuse_a_key_the_dataset_never_reads(laps_dataset, tmp_path, capsys):
    """Old code: trained, config.yaml said data.num_train: 5, and all 8 training images were loaded."""
    args = laps_args(laps_dataset, "data.dense=false", "data.num_train=5")
    assert main(["train", *args, f"output_dir={tmp_path / 'runs'}", "name=r"]) == 2
    expected = "error: data.num_train: is read by data.dataset=synthetic or synthetic_regions, not laps"
    assert one_error_line(capsys.readouterr().err).startswith(expected)
    assert not (tmp_path / "runs" / "r").exists()
    assert main(["data", "check", *args]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(expected)


def test_a_run_saved_with_such_a_key_still_resumes_and_evaluates(laps_dataset, tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    args = [
        *laps_args(laps_dataset, "data.dense=false", "data.num_train=5"),
        f"output_dir={runs}",
        "name=old",
    ]
    with monkeypatch.context() as older_version:  # one that accepted the key and recorded it
        older_version.setattr(DataConfig, "refuse_unread_settings", lambda self, keys=None: None)
        assert main(["train", *args]) == 0
    run = runs / "old"
    assert "num_train: 5" in (run / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(tmp_path / "e.json")]) == 0
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0
    # what the user sets now is checked: an override the dataset never reads
    capsys.readouterr()
    assert main(["eval", str(run), "data.synthetic_seed=3", "--out", str(tmp_path / "f.json")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        "error: data.synthetic_seed: is read by data.dataset=synthetic or synthetic_regions"
    )
    assert not (tmp_path / "f.json").exists()
