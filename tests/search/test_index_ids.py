"""Image ids given to an index's readers and to ``Searcher.explain`` are checked: integers in ``0 .. N - 1``.

Old code: the readers indexed numpy arrays and lists with whatever came, so ``image_tokens([-1])`` read the
last image, ``path(-1)`` named it, ``image_tokens(torch.tensor([1.7]))`` read image 1 and
``image_tokens([N])`` was a bare numpy ``IndexError``; ``explain(text, np.int64(3))`` was a ``KeyError`` for
a valid id. The Qdrant backend's readers take the same ids and refuse the same ones."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from patchword.errors import PatchwordError
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

#: Every reader of a local index that takes ids (k,), with the arguments before them.
READERS = {
    "image_tokens": (),
    "global_rows": (),
    "dense_tokens": (),
    "dense_scores": (),
    "patch_priors": (),
    "patch_ids": (),
    "prefetch": (),
    "non_finite_files": (),
    "gather": ("global",),
}


def _bad_ids(n: int):
    """(ids, what the refusal says) of ids no reader may take, for an index of ``n`` images."""
    return [
        ([-1], f"no image with id -1 \\(the index holds {n} images\\)"),
        ([0, n], f"no image with id {n} \\(the index holds {n} images\\)"),
        (torch.tensor([1.7]), "image ids are integers, got float32"),
        (np.array([1.0]), "image ids are integers, got float64"),
        ([True], "image ids are integers, got bool"),
    ]


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_of_a_local_index_refuses_ids_outside_it(env, reader):
    index = SearchIndex.open(env.index_dir)
    n = len(index)
    call = getattr(index, reader)
    for ids, message in _bad_ids(n):
        with pytest.raises(ValueError, match=message) as err:
            call(*READERS[reader], ids)
        assert str(env.index_dir) in str(err.value), reader
        assert isinstance(err.value, PatchwordError)  # the CLI's one-line error
    # any integer type reads the same rows; no id reads nothing
    want = index.image_tokens([3, n - 1])
    for ids in (
        np.array([3, n - 1], dtype=np.uint8),
        torch.tensor([3, n - 1], dtype=torch.int32),
        (3, n - 1),
    ):
        assert torch.equal(index.image_tokens(ids), want)
    assert (
        index.image_tokens([]).shape[0] == 0
        and index.global_rows(torch.tensor([], dtype=torch.long)).numel() == 0
    )


def test_path_takes_one_integer_id_inside_the_index(env):
    index = SearchIndex.open(env.index_dir)
    n = len(index)
    assert index.path(np.int64(3)) == index.path(torch.tensor(3)) == index.path(3) == index.entries[3].path
    for image_id, message in [
        (-1, f"no image with id -1 \\(the index holds {n} images\\)"),
        (n, f"no image with id {n} "),
        (1.0, "an image id is an integer, got 1.0"),
        (True, "an image id is an integer, got True"),
        (torch.tensor([3, 4]), "an image id is an integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            index.path(image_id)


def test_explain_takes_any_integer_id_and_refuses_ids_outside_the_index(env, searcher):
    caption = caption_queries(env)[0][0]
    want = searcher.explain(caption, 3).score
    assert searcher.explain(caption, np.int64(3)).score == want
    assert searcher.explain(caption, torch.tensor(3)).score == want
    for image_id in (-1, len(searcher), 3.0):
        with pytest.raises(
            ValueError, match=f"{env.index_dir}: (no image with id|an image id is an integer)"
        ):
            searcher.explain(caption, image_id)


def test_the_qdrant_readers_refuse_the_ids_a_local_index_refuses(env, tmp_path):
    qdrant = pytest.importorskip("patchword.search.qdrant")
    pytest.importorskip("qdrant_client")
    shutil.copytree(env.index_dir, tmp_path / "idx")
    qdrant.upload_index(tmp_path / "idx", str(tmp_path / "store"), "idx")
    index = qdrant.QdrantIndex.open(tmp_path / "idx")
    try:
        n = len(index)
        local = SearchIndex.open(env.index_dir)
        assert torch.equal(index.global_rows(np.array([3, 5], dtype=np.int64)), local.global_rows([3, 5]))
        assert torch.equal(index.image_tokens(torch.tensor([5], dtype=torch.int32)), local.image_tokens([5]))
        for reader in (
            "image_tokens",
            "global_rows",
            "dense_tokens",
            "dense_scores",
            "patch_priors",
            "prefetch",
        ):
            for ids, message in _bad_ids(n):
                with pytest.raises(ValueError, match=message):
                    getattr(index, reader)(ids)
        with pytest.raises(ValueError, match=f"no image with id -1 \\(the index holds {n} images\\)"):
            index.path(-1)
    finally:
        index.client.close()
