"""What a Qdrant server's first stage is said to be: what the server does with the collection.

Old code: a server's first stage was always reported approximate ("approximate (HNSW) once a segment passes
the server's indexing threshold"), though a collection with no HNSW index yet is searched exactly (every
vector scanned) and an indexed one's note did not say how much of it is indexed. The server is an embedded
store behind a client that answers ``get_collection`` as a server would (``indexed_vectors_count``,
``status``); embedded Qdrant itself indexes nothing (``indexed_vectors_count=0``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patchword.cli.search import main_search
from patchword.search.query import Searcher
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
pytest.importorskip("qdrant_client")

URL = "http://qdrant.test:6333"
real_connect = qdrant.connect


class ServerLike:
    """An embedded store's client whose ``get_collection`` says ``indexed`` vectors are in an HNSW index and
    the collection's ``status`` is ``status``, as a server's does."""

    def __init__(self, store: Path, indexed: int | None, status: str = "green") -> None:
        self._client = real_connect(str(store))
        self.indexed, self.status = indexed, status

    def get_collection(self, name: str):
        info = self._client.get_collection(name)
        return info.model_copy(update={"indexed_vectors_count": self.indexed, "status": self.status})

    def __getattr__(self, name: str):
        return getattr(self._client, name)


@pytest.fixture
def served(env, tmp_path, monkeypatch):
    """A copy of the shared index uploaded to an embedded store, recorded as served at :data:`URL` whose
    client is the returned :class:`ServerLike` (0 vectors indexed, green: set its attributes)."""
    out, store = tmp_path / "idx", tmp_path / "store"
    shutil.copytree(env.index_dir, out)
    record = qdrant.upload_index(out, str(store), "idx")
    (out / qdrant.QDRANT_FILE).write_text(json.dumps({**record, "location": URL}))
    server = ServerLike(store, 0)
    monkeypatch.setattr(
        qdrant, "connect", lambda location: server if location == URL else real_connect(location)
    )
    yield out, server, record["points"]
    server.close()


def test_a_collection_without_an_hnsw_index_is_an_exact_first_stage(env, served, capsys):
    out, server, _ = served
    searcher = Searcher(qdrant.QdrantIndex.open(out), env.run)
    assert searcher.kind["first_stage"] == "qdrant_server_unindexed"
    assert searcher.kind["exact"] is True and searcher.kind["notes"] == []
    assert searcher.index_info["summary"] is None  # old code: "approximate: qdrant_server first stage"
    captions, _ = caption_queries(env)
    assert main_search([str(out), captions[0], "-k", "3", "--qdrant", "--json"]) == 0
    index = json.loads(capsys.readouterr().out)["index"]
    assert index["first_stage"] == "qdrant_server_unindexed" and index["exact"] is True
    assert main_search([str(out), captions[0], "-k", "3", "--qdrant"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_an_indexed_collection_says_how_much_of_it_is_indexed(env, served):
    out, server, points = served
    server.indexed = 40
    kind = Searcher(qdrant.QdrantIndex.open(out), env.run).kind
    vectors = 3 * points  # global, tokens and dense per point
    assert kind["first_stage"] == "qdrant_server" and kind["exact"] is False
    assert kind["notes"] == [
        f"first stage in a Qdrant server's HNSW index (40 of the collection's {vectors} vectors indexed when "
        "the index was opened): approximate, so the shortlist may miss images an exact one holds"
    ]


def test_a_collection_being_optimized_or_not_described_is_approximate(env, served):
    out, server, _ = served
    server.status = "yellow"  # the optimizer may be building an HNSW index
    kind = Searcher(qdrant.QdrantIndex.open(out), env.run).kind
    assert kind["first_stage"] == "qdrant_server" and kind["exact"] is False
    assert kind["notes"][0].startswith(
        "first stage in a Qdrant server whose collection is being optimized (status yellow; no vector "
        "HNSW-indexed when the index was opened)"
    )
    server.status, server.indexed = "green", None  # a server that does not say
    kind = Searcher(qdrant.QdrantIndex.open(out), env.run).kind
    assert (
        kind["exact"] is False and "did not say whether the collection has HNSW indexes" in kind["notes"][0]
    )


def test_a_reopened_searcher_asks_the_server_again(env, served):
    out, server, _ = served
    searcher = Searcher(qdrant.QdrantIndex.open(out), env.run)
    assert searcher.kind["exact"] is True
    server.indexed = 5  # the collection got an HNSW index since (a re-upload past the threshold)
    reopened = searcher.reopen()
    assert reopened.kind["first_stage"] == "qdrant_server" and reopened.kind["exact"] is False
    assert reopened.index_info["summary"] == "approximate: qdrant_server first stage"


def test_an_embedded_store_stays_exact(env, tmp_path):
    out, store = tmp_path / "idx", tmp_path / "store"
    shutil.copytree(env.index_dir, out)
    qdrant.upload_index(out, str(store), "idx")
    index = qdrant.QdrantIndex.open(out)
    try:
        kind = Searcher(index, env.run).kind
        assert kind["first_stage"] == "qdrant_embedded" and kind["exact"] is True and index.server is None
    finally:
        index.client.close()
