"""Hostile inputs to ``patchword hash search`` and ``hash eval``: a run whose directory takes no new files is
searched without its index cache (one warning), a directory where the cache goes is refused up front
naming it, and two outputs of one command naming the same file are refused naming both flags."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile

import pytest

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = ["--modality", "image", "--query-index", "0", "1", "--k", "3"]


@pytest.fixture
def run_copy(hash_run, tmp_path):
    """A copy of the module's trained run, without a cached index."""
    run = tmp_path / "run"
    shutil.copytree(hash_run, run)
    for cached in run.glob("index_*.npz"):
        cached.unlink()
    return run


def _read_only(monkeypatch, folder) -> None:
    """``folder`` takes no new files (EACCES), as a read-only run directory (tests may run as root)."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        where = kwargs.get("dir", args[2] if len(args) > 2 else None)
        if where is not None and os.path.realpath(where) == os.path.realpath(folder):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_a_read_only_run_is_searched_without_its_cache(run_copy, monkeypatch, capsys, caplog):
    """Old code failed after encoding the database (exit 2), naming a temporary file of the cache."""
    assert main(["hash", "search", str(run_copy), *SEARCH]) == 0  # a writable copy: the reference
    expected = json.loads(capsys.readouterr().out)
    (run_copy / "index_text.npz").unlink()
    _read_only(monkeypatch, run_copy)
    with caplog.at_level("WARNING"):
        assert main(["hash", "search", str(run_copy), *SEARCH]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == expected
    assert "Traceback" not in captured.err
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"{run_copy / 'index_text.npz'}: cannot cache the database index (Permission denied)"
    ), warnings
    assert not (run_copy / "index_text.npz").exists()


def test_a_directory_where_the_cache_goes_is_refused_before_the_run_is_read(run_copy, monkeypatch, capsys):
    """Old code encoded the database, then failed with `[Errno 21] Is a directory`."""
    (run_copy / "index_text.npz").mkdir()

    def unread(*args, **kwargs):
        raise AssertionError("the run was read before the cache path was checked")

    monkeypatch.setattr("patchword.hashing.runner.open_hashing_run", unread)
    assert main(["hash", "search", str(run_copy), *SEARCH]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {run_copy / 'index_text.npz'}: the run's cached database index is not a file (a "
        "directory?): remove or rename it so that the index can be cached there"
    )


@pytest.mark.parametrize("spelled", ["e.png", "sub/../e.png"])
def test_eval_refuses_out_and_pr_plot_naming_one_file(run_copy, tmp_path, capsys, spelled):
    """Old code wrote the plot, then replaced it with the JSON (exit 0)."""
    (tmp_path / "sub").mkdir()
    plot = tmp_path / "e.png"
    argv = ["hash", "eval", str(run_copy), "--out", str(plot), "--pr-plot", str(tmp_path / spelled)]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --pr-plot: {tmp_path / spelled} is also --out's file: give each output its own file"
    )
    assert not plot.exists()
