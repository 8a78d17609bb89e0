"""A shard array of the right shape but another dtype than the index writes (int32 or float64 tokens in a
float32 index, float64 global embeddings...): old code read it, converted it and scored with it, every score
silently changed (int32 tokens: truncated to integers). It is now refused as other damaged shards are, one
line naming the file, and ``index build --update`` encodes that shard's images again."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import one_error_line
from patchword.cli.search import main_index, main_search
from patchword.errors import DataError
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

DTYPE_DAMAGE = {
    "int32 tokens": ("00001.tokens.npy", np.int32, "holds int32 values, an index of --store float32 keeps "),
    "float64 tokens": ("00001.tokens.npy", np.float64, "holds float64 values, an index of --store float32 "),
    "float16 global": ("00001.global.npy", np.float16, "holds float16 values, an index keeps its global "),
    "int64 dense lengths": (
        "00001.dense_lens.npy",
        np.int64,
        "holds int64 values, an index keeps its dense_lens",
    ),
}


@pytest.mark.parametrize("damage", list(DTYPE_DAMAGE))
def test_a_shard_array_of_another_dtype_is_one_line_and_update_repairs_it(env, tmp_path, capsys, damage):
    index_dir = Path(shutil.copytree(env.index_dir, tmp_path / "idx"))
    tokens = SearchIndex.open(index_dir).image_tokens(np.arange(24)).clone()
    name, dtype, problem = DTYPE_DAMAGE[damage]
    shard = index_dir / "shards" / name
    np.save(shard, np.load(shard).astype(dtype))
    with pytest.raises(DataError) as err:
        SearchIndex.open(index_dir)
    assert str(err.value).startswith(f"{shard}: {problem}") and "--update" in str(err.value)
    captions, _ = caption_queries(env)
    assert main_search([str(index_dir), captions[0]]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"
    images = str(env.export.files["images"])
    args = ["build", str(env.run_dir), "--images", images, "--out", str(index_dir), "--update"]
    assert main_index(args) == 0
    assert "24 images (10 encoded, 14 kept, 0 removed)" in capsys.readouterr().out
    repaired = SearchIndex.open(index_dir)
    order = {e.path: i for i, e in enumerate(repaired.entries)}
    same = [order[e.path] for e in SearchIndex.open(env.index_dir).entries]
    torch.testing.assert_close(repaired.image_tokens(same), tokens, rtol=1e-5, atol=1e-5)
    assert main_search([str(index_dir), captions[0]]) == 0


def test_either_byte_order_of_the_written_dtype_is_read(env, tmp_path):
    """numpy reads a big-endian float32 array right: the check compares kind and size, not byte order."""
    index_dir = Path(shutil.copytree(env.index_dir, tmp_path / "idx"))
    shard = index_dir / "shards" / "00001.tokens.npy"
    np.save(shard, np.load(shard).astype(">f4"))
    torch.testing.assert_close(
        SearchIndex.open(index_dir).image_tokens(np.arange(24)),
        SearchIndex.open(env.index_dir).image_tokens(np.arange(24)),
    )
