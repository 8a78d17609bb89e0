"""A matcher that reads dense text, run on region features (which bring none), records the truth: no dense
pairing, not leaky, "dense text: no" on its model card, as a run with data.dense=false does. Old code
recorded ``"dense_pairing": "image"`` (and, for caption-tied dense text, ``"leaky": true``) because the
run's config says data.dense=true, although no dense text was ever read; runs saved so (their config.yaml
is never rewritten) now evaluate and export with the truth."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from conftest import TINY_REGIONS
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def seps_on_regions(tmp_path_factory) -> Path:
    """A one-step SEPS run on the synthetic region features, data.dense left at its default (true)."""
    runs = tmp_path_factory.mktemp("runs")
    args = [*TINY_REGIONS, "model.matcher=seps", "train.max_steps=1", f"output_dir={runs}", "name=seps"]
    with contextlib.redirect_stderr(io.StringIO()) as err:  # the verb logs to the current stderr
        assert main(["train", *args]) == 0
    assert err.getvalue().count("data.dataset=synthetic_regions holds region features, no dense text") == 1
    assert yaml.safe_load((runs / "seps" / "config.yaml").read_text())["data"]["dense"] is True
    return runs / "seps"


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_training_records_no_dense_pairing_and_says_why(seps_on_regions):
    summary = _read(seps_on_regions / "summary.json")
    assert summary["matcher"] == "seps"
    assert summary["dense_pairing"] is None and summary["leaky"] is False


def test_a_saved_run_evaluates_and_exports_with_the_truth(seps_on_regions, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(seps_on_regions), "--out", str(out)]) == 0, capsys.readouterr().err
    evaluated = _read(out)
    assert evaluated["dense_pairing"] is None and evaluated["leaky"] is False
    assert main(["export", str(seps_on_regions), str(tmp_path / "export")]) == 0, capsys.readouterr().err
    card = (tmp_path / "export" / "README.md").read_text()
    assert "* dense text: no\n" in card and "tied to the image" not in card
    assert "leak-free" in card


def test_a_saved_run_with_caption_tied_dense_text_is_not_leaky_on_region_features(
    seps_on_regions, tmp_path, capsys
):
    """A run saved before caption-tied dense text was refused on region features: it never read any, so
    it is no leaky evaluation (old code: ``"leaky": true``, ``"dense_pairing": "caption"``)."""
    run = tmp_path / "run"
    run.mkdir()
    for item in seps_on_regions.iterdir():
        if item.is_file():
            (run / item.name).write_bytes(item.read_bytes())
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["seps"]["dense_pairing"] = "caption"
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out)]) == 0, capsys.readouterr().err
    evaluated = _read(out)
    assert evaluated["dense_pairing"] is None and evaluated["leaky"] is False
