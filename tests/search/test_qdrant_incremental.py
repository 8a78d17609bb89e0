"""An upload to a collection that holds an earlier upload of the same index writes only the points whose
stored rows changed, and a float16 index keeps float16 tokens in Qdrant.

Old code: every `index build --update --qdrant` deleted the collection and uploaded every point again (a
no-op update of 4,000 images: 47 s with --qdrant, 5 s without), and every store's tokens went up as
float32 (a float16 index doubled in Qdrant)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from patchword.search.index import build_index
from patchword.search.query import Searcher
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
qdrant_client = pytest.importorskip("qdrant_client")


@pytest.fixture
def writes(monkeypatch) -> dict[str, list]:
    """The image points every ``upsert`` writes (ids; the marker point left out) and the collections
    deleted, recorded as the client is called."""
    seen: dict[str, list] = {"ids": [], "dropped": []}
    upsert, drop = qdrant_client.QdrantClient.upsert, qdrant_client.QdrantClient.delete_collection

    def recorded_upsert(self, collection_name, points, **kwargs):
        seen["ids"] += [p.id for p in points if isinstance(p.id, int)]
        return upsert(self, collection_name, points=points, **kwargs)

    def recorded_drop(self, collection_name, **kwargs):
        seen["dropped"].append(collection_name)
        return drop(self, collection_name, **kwargs)

    monkeypatch.setattr(qdrant_client.QdrantClient, "upsert", recorded_upsert)
    monkeypatch.setattr(qdrant_client.QdrantClient, "delete_collection", recorded_drop)
    return seen


def _same_rankings(env, index_dir: Path) -> None:
    """The collection answers as the local index: same ids, paths and scores."""
    remote, local = Searcher.open(index_dir, qdrant=True), Searcher.open(index_dir)
    try:
        for caption in caption_queries(env)[0][:6]:
            got, want = remote.search(caption, k=8).hits, local.search(caption, k=8).hits
            assert [(h.id, h.path) for h in got] == [(h.id, h.path) for h in want], caption
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
    finally:
        remote.index.client.close()


def test_an_update_uploads_only_the_points_whose_rows_changed(env, tmp_path, writes):
    folder, out, store = tmp_path / "imgs", tmp_path / "idx", str(tmp_path / "store")
    shutil.copytree(env.export.files["images"], folder)
    dense = env.export.files["dense"]
    build_index(env.run, folder, out, dense=dense, shard_size=10)
    qdrant.upload_index(out, store, "idx")
    assert sorted(writes["ids"]) == list(range(24))
    writes["ids"].clear()

    build_index(env.run, folder, out, dense=dense, update=True, shard_size=10)  # nothing changed
    record = qdrant.upload_index(out, store, "idx")
    assert writes["ids"] == [] and writes["dropped"] == []
    assert record["points"] == 24 and record["written"] == 0
    _same_rankings(env, out)

    names = sorted(p.name for p in folder.iterdir())  # entries in path order: names[-1] is id 23
    shutil.copyfile(folder / names[0], folder / names[-1])  # other pixels under the same name
    os.utime(folder / names[-1], ns=(1, 1))
    build_index(env.run, folder, out, dense=dense, update=True, shard_size=10)
    assert qdrant.upload_index(out, store, "idx")["written"] == 1
    assert writes["ids"] == [23] and writes["dropped"] == []
    _same_rankings(env, out)

    writes["ids"].clear()
    (folder / names[-1]).unlink()  # the last id: its point deleted, no other written
    build_index(env.run, folder, out, dense=dense, update=True, shard_size=10)
    record = qdrant.upload_index(out, store, "idx")
    assert writes["ids"] == [] and writes["dropped"] == [] and record["points"] == 23
    _same_rankings(env, out)

    # an image removed before others renumbers them (ids are positions): their points are written again
    (folder / names[0]).unlink()
    build_index(env.run, folder, out, dense=dense, update=True, shard_size=10)
    assert qdrant.upload_index(out, store, "idx")["written"] == 22
    assert writes["ids"] == list(range(22)) and writes["dropped"] == []
    _same_rankings(env, out)


def test_an_upload_stopped_part_way_is_finished_by_the_next(env, tmp_path, writes, monkeypatch):
    """The points a stopped upload wrote are kept by the next one (their payload names their rows)."""
    folder, out, store = tmp_path / "imgs", tmp_path / "idx", str(tmp_path / "store")
    shutil.copytree(env.export.files["images"], folder)
    build_index(env.run, folder, out, dense=env.export.files["dense"], shard_size=10)
    upsert, calls = qdrant_client.QdrantClient.upsert, []

    def stopped_after_two_batches(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 3:  # the marker, then two batches of points
            raise KeyboardInterrupt
        return upsert(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(qdrant_client.QdrantClient, "upsert", stopped_after_two_batches)
        with pytest.raises(KeyboardInterrupt):
            qdrant.upload_index(out, store, "idx", batch=5)
    writes["ids"].clear()
    qdrant.upload_index(out, store, "idx", batch=5)
    assert sorted(writes["ids"]) == list(range(10, 24)) and writes["dropped"] == []
    _same_rankings(env, out)


def test_a_float16_index_keeps_float16_tokens_in_qdrant(env, tmp_path):
    out, store = tmp_path / "idx16", str(tmp_path / "store")
    build_index(
        env.run,
        env.export.files["images"],
        out,
        dense=env.export.files["dense"],
        dtype="float16",
        shard_size=10,
    )
    qdrant.upload_index(out, store, "idx16")
    client = qdrant.connect(store)
    vectors = client.get_collection("idx16").config.params.vectors
    client.close()
    assert vectors["tokens"].datatype == qdrant_client.models.Datatype.FLOAT16
    assert vectors["dense"].datatype == qdrant_client.models.Datatype.FLOAT16
    assert vectors["global"].datatype in (None, qdrant_client.models.Datatype.FLOAT32)
    _same_rankings(env, out)  # float16 -> float16: nothing lost
