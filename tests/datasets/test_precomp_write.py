"""``write_precomp_split`` replaces a split as one set: a full disk keeps the old files whole, and a write
stopped at any step never leaves new features beside old captions for ``load_precomp_split`` to read.

The reviewer's cases: a full disk inside ``np.save`` left a truncated ``test_ims.npy`` under its final
name (the old features lost); a failure while the captions were written left new features beside the old
captions, which loaded silently as one split.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kill_support import Killed, kept, stopping
from patchword import fileio
from patchword.data import precomp
from patchword.data.precomp import load_precomp_split, write_precomp_split
from patchword.errors import DataError

N_IMG, REGIONS, DIM = 4, 3, 8
OLD_IDS = ["a", "b", "c", "d"]


def _captions(tag: str) -> list[str]:
    return [f"{tag} caption {i}" for i in range(2 * N_IMG)]  # two per image


def _write_old(root: Path) -> None:
    boxes = np.full((N_IMG, REGIONS, 4), 0.5, np.float32)
    write_precomp_split(
        root, "test", np.ones((N_IMG, REGIONS, DIM)), _captions("old"), image_ids=OLD_IDS, boxes=boxes
    )


def _write_new(root: Path) -> None:
    write_precomp_split(root, "test", np.full((N_IMG, REGIONS, DIM), 2.0), _captions("new"))


def _loaded(root: Path) -> str:
    """Which whole split ``root`` holds ("old" or "new"), or the error that refuses it; fails on a mix."""
    try:
        split = load_precomp_split(root, "test", mmap=False, captions_per_image=2)
    except (FileNotFoundError, ValueError, DataError) as err:
        return f"refused: {err}"
    features = {float(v) for v in np.unique(np.asarray(split.images))}
    captions = {c.split()[0] for c in split.captions}
    state = {
        ("old", frozenset({1.0}), frozenset({"old"}), tuple(OLD_IDS)),
        ("new", frozenset({2.0}), frozenset({"new"}), ("0", "1", "2", "3")),
    }
    found = (frozenset(features), frozenset(captions), tuple(split.image_ids))
    for tag, *expected in state:
        if tuple(expected) == found:
            return tag
    raise AssertionError(f"a mixed split loaded without an error: features {features}, captions {captions}")


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _full_disk(path: os.PathLike | str) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", os.fspath(path))


def test_a_full_disk_inside_the_features_keeps_the_old_split(tmp_path, monkeypatch):
    _write_old(tmp_path)
    before = _names(tmp_path)
    real_save = np.save

    def half_then_full(file, array, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(buffer, array)
        data = buffer.getvalue()
        if hasattr(file, "write"):
            file.write(data[: len(data) // 2])
        else:
            Path(file).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")  # atomic_write names the file

    monkeypatch.setattr(np, "save", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        _write_new(tmp_path)
    monkeypatch.undo()
    assert _loaded(tmp_path) == "old"
    assert _names(tmp_path) == before  # no staging folder or temporary file left either


def test_a_failure_while_the_captions_are_written_keeps_the_old_split(tmp_path, monkeypatch):
    _write_old(tmp_path)
    real_atomic_write, real_write_text = fileio.atomic_write, Path.write_text

    def failing_atomic_write(path, write):
        if str(path).endswith("_caps.txt"):
            raise _full_disk(path)
        return real_atomic_write(path, write)

    def failing_write_text(self, *args, **kwargs):
        if self.name.endswith("_caps.txt"):
            raise _full_disk(self)
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(fileio, "atomic_write", failing_atomic_write)
    monkeypatch.setattr(Path, "write_text", failing_write_text)
    with pytest.raises(OSError, match="No space left"):
        _write_new(tmp_path)
    monkeypatch.undo()
    assert _loaded(tmp_path) == "old"


def test_a_write_stopped_at_any_step_never_loads_as_a_mixed_split(tmp_path, monkeypatch):
    """Stop the write before each file-system change (replace, unlink) in turn until one runs to its end:
    the split loads as the old one, the new one, or not at all; the rerun writes the new one and removes
    what the stopped write left (its staging folder, the old ids and boxes, which describe other images)."""
    completed = 0
    for stop_at in range(1, 30):
        root = tmp_path / f"stop{stop_at}"
        _write_old(root)
        calls = {"n": 0, "stop_at": stop_at}
        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", stopping(os.replace, calls))
            patch.setattr(os, "unlink", stopping(os.unlink, calls))
            patch.setattr(precomp, "shutil", SimpleNamespace(rmtree=kept), raising=False)
            try:
                _write_new(root)
            except Killed:
                pass
            else:
                completed = stop_at
                break
        state = _loaded(root)
        # stopped while the files were moved in: no captions, and the error says what happened
        assert state in ("old", "new") or "was stopped while it replaced the files" in state, (stop_at, state)
        _write_new(root)
        assert _loaded(root) == "new"
        assert _names(root) == ["test_caps.txt", "test_ims.npy"]
    assert completed > 1, "the write never ran to its end"
    assert _loaded(root) == "new"
