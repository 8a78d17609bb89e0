"""Hostile inputs to ``patchword bench gallery``: a ``--json`` file that is a matrix ``--keep`` leaves, a
``--workdir`` that takes no new files and a shape given twice are refused in one line naming the flag,
before any work and with nothing written (old code found each out once scoring had started, or not at
all)."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

import patchword.bench.gallery as gallery
from conftest import one_error_line
from patchword.bench.gallery import matrix_path, partial_path
from patchword.cli import main
from patchword.errors import ConfigError


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("scoring started")

    monkeypatch.setattr(gallery, "build_bench_matcher", refuse)


def _listing(folder) -> list:
    return sorted((p, p.stat().st_size) for p in folder.rglob("*"))


@pytest.mark.parametrize("kept", [matrix_path, partial_path], ids=["complete", "partial"])
def test_json_on_a_kept_matrix_is_refused(tmp_path, capsys, no_work, kept):
    """Old code wrote the JSON over the kept matrix (the output still listed it as kept)."""
    target = kept(tmp_path, "quick")
    argv = ["bench", "gallery", "--quick", "--workdir", str(tmp_path), "--keep", "--json", str(target)]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --json: {target} is where --keep leaves the quick matrix in --workdir: give --json another "
        "file"
    )
    assert _listing(tmp_path) == []


def test_a_workdir_that_takes_no_files_is_refused_before_any_work(tmp_path, capsys, no_work, monkeypatch):
    """Old code failed once scoring started, naming the .partial file."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):  # a read-only --workdir (tests may run as root)
        if os.path.realpath(kwargs.get("dir") or ".") == os.path.realpath(tmp_path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    assert main(["bench", "gallery", "--quick", "--workdir", str(tmp_path), "--keep"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --workdir: {tmp_path}: cannot write here: Permission denied"), line
    assert _listing(tmp_path) == []


@pytest.mark.parametrize("keep", [["--keep"], []], ids=["kept", "temporary"])
def test_a_shape_given_twice_is_refused(tmp_path, capsys, no_work, keep):
    """Old code scored it twice, into the same file, and listed it twice."""
    argv = ["bench", "gallery", "--shapes", "quick,quick", "--workdir", str(tmp_path), *keep]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --shapes: quick is given twice: each shape is scored once"
    )
    assert _listing(tmp_path) == []


def test_run_gallery_refuses_a_shape_kept_twice(tmp_path, no_work):
    with pytest.raises(ConfigError, match="quick is given twice"):
        gallery.run_gallery(shapes=["quick", "1k", "quick"], workdir=tmp_path, keep=True)
