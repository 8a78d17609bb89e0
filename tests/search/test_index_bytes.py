"""The bytes an index takes per image leave out the rows no entry reads: an update that deletes files keeps
their rows until a compaction (a quarter of the rows dead), and old code counted them, in
``SearchIndex.bytes_per_image`` and in ``patchword report --index``, as if they were images'."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from patchword.experiments.cost import index_bytes_per_image
from patchword.search.index import build_index
from patchword.search.shards import shard_files
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_update_not_compacted_counts_the_bytes_of_its_live_rows_only(env, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    names = sorted(p.name for p in env.export.files["images"].iterdir())[:10]
    for name in names:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    updated, fresh = tmp_path / "updated", tmp_path / "fresh"
    build_index(env.run, folder, updated, shard_size=4)  # shards of 4, 4 and 2 rows
    (folder / names[0]).unlink()
    report = build_index(env.run, folder, updated, update=True, shard_size=4)
    assert (report.removed, report.compacted) == (1, False)  # 1 dead row of 10: kept until a compaction
    build_index(env.run, folder, fresh, shard_size=4)  # the same 9 images, no dead row
    index = SearchIndex.open(updated)
    assert sum(s["rows"] for s in index.manifest.shards) == 10 and len(index) == 9
    assert index.bytes_per_image() == SearchIndex.open(fresh).bytes_per_image()

    # report --index: every file of the index, less the dead row of each shard array
    dead_shard = next(
        s["id"] for s in index.manifest.shards if s["rows"] > sum(e.shard == s["id"] for e in index.entries)
    )
    row = sum(
        np.load(f, mmap_mode="r")[0].nbytes for f in shard_files(updated, dead_shard).values() if f.is_file()
    )
    total = sum(f.stat().st_size for f in updated.rglob("*") if f.is_file())
    run, per_image = index_bytes_per_image(updated)
    assert run == str(env.run_dir) and per_image == (total - row) / 9
