"""An update stopped part-way and resumed reports what the uninterrupted update does, plus "resumed": its
counts were taken from the pending manifest, so the images encoded before the stop counted as kept and the
deleted and changed files vanished from the report ("236 encoded, 914 kept, 0 removed, resumed" for "620
encoded (600 new, 20 changed), 530 kept, 250 removed")."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from patchword.search.index import build_index
from patchword.search.manifest import Manifest
from search_support import killed_after_shards

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = {"shard_size": 4, "batch_size": 4}


def _counts(report) -> tuple:
    return report.added, report.changed, report.kept, report.removed, report.num_images


def test_a_resumed_update_reports_the_update_it_continues(env, tmp_path, monkeypatch):
    folder = tmp_path / "imgs"
    folder.mkdir()
    names = sorted(p.name for p in env.export.files["images"].iterdir())
    for name in names[:12]:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    build_index(env.run, folder, tmp_path / "whole", **ARGS)
    for name in names[12:22]:  # 10 new
        shutil.copy2(env.export.files["images"] / name, folder / name)
    for name in names[:3]:  # 3 deleted
        (folder / name).unlink()
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / names[5])  # 1 changed
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")

    whole = build_index(env.run, folder, tmp_path / "whole", update=True, **ARGS)
    assert _counts(whole) == (11, 1, 8, 3, 19) and not whole.resumed
    with killed_after_shards(monkeypatch, 2), pytest.raises(KeyboardInterrupt):  # 8 of 11 encoded
        build_index(env.run, folder, tmp_path / "cut", update=True, **ARGS)
    resumed = build_index(env.run, folder, tmp_path / "cut", update=True, **ARGS)
    assert resumed.resumed and _counts(resumed) == _counts(whole)
    assert resumed.encoded_before == 8
    assert Manifest.read(tmp_path / "cut") == Manifest.read(tmp_path / "whole")
    said = "19 images (11 encoded (10 new, 1 changed), 8 kept, 3 removed"
    assert said + ") in " in whole.summary() and said + ", resumed) in " in resumed.summary()
