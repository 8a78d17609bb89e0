"""Atomic writes make the new name durable, not only the new bytes: the directory is synced after the
rename (a power loss could otherwise bring back the old file, or none, under a name whose bytes were
synced)."""

from __future__ import annotations

import errno
import logging
import os
import stat

import pytest

from patchword import fileio


@pytest.fixture
def synced(monkeypatch):
    """The paths ``os.fsync`` was called on, in order, directories marked with a trailing ``/``."""
    calls: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append(path + "/" if stat.S_ISDIR(os.fstat(fd).st_mode) else path)
        real(fd)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name a descriptor's file")  # CI runs Linux, where this never skips
    monkeypatch.setattr(os, "fsync", record)
    return calls


def test_atomic_write_syncs_the_directory_after_the_rename(tmp_path, synced):
    fileio.atomic_write_text(tmp_path / "a.json", "{}")
    assert synced[-1] == f"{tmp_path}/"
    assert synced[-2].startswith(f"{tmp_path}/.a.json.")  # the temporary file's bytes, before the rename


def test_append_line_syncs_the_directory_only_when_it_creates_the_file(tmp_path, synced):
    fileio.append_line(tmp_path / "m.jsonl", "{}")
    assert synced == [f"{tmp_path}/m.jsonl", f"{tmp_path}/"]
    synced.clear()
    fileio.append_line(tmp_path / "m.jsonl", "{}")
    assert synced == [f"{tmp_path}/m.jsonl"]


def test_replace_directory_syncs_the_parent(tmp_path, synced):
    final = tmp_path / "model"
    final.mkdir()
    (final / "old").write_text("x")
    stage = fileio.staging_dir(final, "export")
    (tmp_path / os.path.basename(stage) / "new").write_text("y")
    fileio.replace_directory(stage, final)
    assert sorted(os.listdir(final)) == ["new"]
    assert synced[-1] == f"{tmp_path}/"


def test_a_directory_that_cannot_be_synced_is_a_warning_after_a_complete_write(tmp_path, monkeypatch, caplog):
    """The rename is done when the directory's sync fails: the file is there, whole, and the command's
    result stands (an error would send the user to rerun a finished job); the warning says what is
    unconfirmed. A file system that cannot sync directories at all (EINVAL) is silent."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for code, warned in ((errno.EIO, True), (errno.EINVAL, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="patchword.fileio"):
            fileio.atomic_write_text(tmp_path / "a.json", f"{code}")
        assert (tmp_path / "a.json").read_text() == f"{code}"
        assert (f"{tmp_path}: the directory could not be synced" in caplog.text) == warned, caplog.text
