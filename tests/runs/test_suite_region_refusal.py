"""``patchword eval RUN --suite compositional`` on a run that reads region features: refused up front with
what the suite scores (image files) and what the run reads, with or without ``--suite-file``; a run on real
image files without ``--suite-file`` still gets the SugarCrepe advice."""

from __future__ import annotations

import json

import pytest

from conftest import laps_args, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _suite_files(tmp_path):
    triples = tmp_path / "swap_att.json"
    record = {"filename": "0.png", "caption": "a red circle", "negative_caption": "a blue circle"}
    triples.write_text(json.dumps([record]))
    return ["--suite-file", str(triples), "--image-root", str(tmp_path)]


@pytest.mark.parametrize("with_files", [False, True], ids=["synthetic", "suite-file"])
def test_a_region_feature_run_is_refused_naming_what_it_reads(
    trained_region_run, tmp_path, capsys, with_files
):
    """Old code: "--suite-file: a run on real data needs SugarCrepe-style files" for a synthetic run, and
    with the files "the image encoder does not take images" once the run was loaded."""
    extra = _suite_files(tmp_path) if with_files else []
    capsys.readouterr()
    assert main(["eval", str(trained_region_run), "--suite", "compositional", *extra]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --suite: compositional scores image files; {trained_region_run} reads region features "
        "(model.image_encoder=precomp)"
    )
    assert not (trained_region_run / "eval_compositional.json").exists()


def test_a_run_on_image_files_still_gets_the_sugarcrepe_advice(laps_dataset, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", *laps_args(laps_dataset), f"output_dir={runs}", "name=laps"]) == 0
    capsys.readouterr()
    assert main(["eval", str(runs / "laps"), "--suite", "compositional"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == "error: --suite-file: a run on real data needs SugarCrepe-style files"
