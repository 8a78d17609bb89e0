"""``patchword data export synthetic --run RUN``: the next steps it prints are ones that work for RUN. A run
that reads region features (``model.image_encoder=precomp``) can neither index nor evaluate image files, so
for it the ``index build`` / ``eval data.dataset=laps`` hints are replaced by a line saying so; a run with
an image encoder, and an export without a run, keep them."""

from __future__ import annotations

import pytest

from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _export(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["data", "export", "synthetic", "--split", "test", *args]) == 0
    return capsys.readouterr().out


def test_a_region_feature_run_gets_no_hint_that_fails_for_it(trained_region_run, tmp_path, capsys):
    """Old code: printed `patchword index build RUN_DIR --images ...` and `patchword eval RUN_DIR
    data.dataset=laps ...`, both of which fail for this run."""
    out = tmp_path / "scenes"
    printed = _export(capsys, "--run", str(trained_region_run), "--out", str(out))
    assert printed.startswith(f"exported 8 images and 40 captions of the synthetic test split to {out}")
    assert "index build" not in printed and "patchword eval" not in printed, printed
    assert printed.splitlines()[-1] == (
        f"{trained_region_run} reads region features (model.image_encoder=precomp), not images: it cannot "
        "index or evaluate these files"
    )
    assert (out / "images").is_dir() and (out / "test.jsonl").is_file()  # the files are written all the same


def test_an_export_without_a_run_keeps_the_hints(tmp_path, capsys):
    out = tmp_path / "scenes"
    printed = _export(capsys, "--out", str(out), "data.num_test=4", "data.synthetic_image_size=16")
    assert (
        f"  patchword index build RUN_DIR --images {out / 'images'} --dense {out / 'test.jsonl'}" in printed
    )
    assert "  patchword eval RUN_DIR data.dataset=laps " in printed
    assert "region features" not in printed


def test_a_run_with_an_image_encoder_keeps_the_hints(trained_tiny_run, tmp_path, capsys):
    printed = _export(capsys, "--run", str(trained_tiny_run), "--out", str(tmp_path / "scenes"))
    assert "  patchword index build RUN_DIR --images " in printed
    assert "  patchword eval RUN_DIR data.dataset=laps " in printed and "region features" not in printed
