"""One spelling per concept across verbs (a CLI review): ``eval --device`` as index build, search and serve
take it (the override ``device=`` underneath), ``-k`` / ``--k`` in both searches, ``--run`` beside ``bench``'s
``--run-dir`` as search, serve and data export spell it. Before: each refused the other verbs' spelling."""

from __future__ import annotations

import json

import pytest

from conftest import one_error_line
from patchword.cli import main


def test_eval_device_is_the_device_override(trained_tiny_run, tmp_path, capsys):
    assert main(["eval", str(trained_tiny_run), "--device", "cpu", "--out", str(tmp_path / "a.json")]) == 0
    assert main(["eval", str(trained_tiny_run), "device=cpu", "--out", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / name).read_text()) for name in ("a.json", "b.json"))
    assert a["overrides"] == b["overrides"] == ["device=cpu"] and a["rsum"] == b["rsum"]
    capsys.readouterr()
    assert main(["eval", str(trained_tiny_run), "--device", "cpu", "device=cpu"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --device: ")


@pytest.mark.parametrize("argv", [["search", "--help"], ["hash", "search", "--help"]])
def test_both_searches_take_k_and_double_dash_k(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "-k K, --k K" in capsys.readouterr().out


def test_bench_takes_run_beside_run_dir(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "two-stage", "--help"])
    assert "--run-dir RUN_DIR, --run RUN_DIR" in capsys.readouterr().out
