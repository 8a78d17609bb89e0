"""A shard's dense caption lengths out of range (a damaged ``dense_lens`` file of the right shape): one line
naming the file when the index is opened, and ``--update`` repairs it. Old code opened the index and a
search failed with a ``ValueError`` naming no file (length 0) or read past the dense tokens."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import one_error_line
from patchword.cli.search import main_index, main_search
from patchword.errors import DataError
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("length", [0, -3, 10_000])
def test_a_dense_length_out_of_range_names_the_file_and_update_repairs_it(env, tmp_path, capsys, length):
    index_dir = Path(shutil.copytree(env.index_dir, tmp_path / "idx"))
    path = index_dir / "shards" / "00001.dense_lens.npy"
    lens = np.load(path)
    width = np.load(index_dir / "shards" / "00001.dense.npy", mmap_mode="r").shape[1]
    lens[3] = length
    np.save(path, lens)
    with pytest.raises(DataError) as err:
        SearchIndex.open(index_dir)
    assert str(err.value).startswith(
        f"{path}: holds the dense caption length {length} at row 3, outside 1..{width} (the width of the "
        "shard's dense tokens); repair the index with"
    )
    caption = env.export.files["caps"].read_text().splitlines()[0]
    assert main_search([str(index_dir), caption]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"

    images = str(env.export.files["images"])
    update = ["build", str(env.run_dir), "--images", images, "--out", str(index_dir), "--update"]
    assert main_index(update) == 0
    assert "(10 encoded, 14 kept, 0 removed)" in capsys.readouterr().out
    assert len(SearchIndex.open(index_dir)) == 24
