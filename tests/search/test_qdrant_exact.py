"""An exact search forced on the Qdrant backend (``QdrantIndex.open(..., exact=True)``,
``Searcher.open(..., qdrant=True, exact=True)``, ``patchword search --qdrant --exact``): every query carries
``SearchParams(exact=True)``, the answers are the exact search's, and the first stage is reported exact
even on a server whose collection has an HNSW index. Old code had no such option (a server's HNSW index
could only be taken as approximate).

The server is an embedded store behind a client that answers ``get_collection`` as a server would, as in
test_qdrant_server_stage.py; embedded Qdrant searches exactly either way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patchword.cli.search import main_search
from patchword.errors import ConfigError
from patchword.search.manifest import Manifest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
pytest.importorskip("qdrant_client")

URL = "http://qdrant.test:6333"
real_connect = qdrant.connect


class Recording:
    """A client of an embedded store that records the ``search_params`` of every ``query_points`` and
    counts ``get_collection`` calls; ``indexed`` vectors in an HNSW index is what ``get_collection`` says,
    as a server's does."""

    def __init__(self, store: Path, indexed: int = 0) -> None:
        self._client = real_connect(str(store))
        self.indexed, self.params, self.described = indexed, [], 0

    def query_points(self, *args, **kwargs):
        self.params.append(kwargs.get("search_params"))
        return self._client.query_points(*args, **kwargs)

    def get_collection(self, name: str):
        self.described += 1
        info = self._client.get_collection(name)
        return info.model_copy(update={"indexed_vectors_count": self.indexed, "status": "green"})

    def __getattr__(self, name: str):
        return getattr(self._client, name)


def _hits(searcher: Searcher, caption: str, k: int = 5) -> list[tuple[int, str, float]]:
    return [(h.id, h.path, round(h.score, 4)) for h in searcher.search(caption, k=k).hits]


@pytest.fixture
def uploaded(env, tmp_path, monkeypatch):
    """A copy of the shared index uploaded to an embedded store whose client records its queries:
    (index dir, the client)."""
    out, store = tmp_path / "idx", tmp_path / "store"
    shutil.copytree(env.index_dir, out)
    qdrant.upload_index(out, str(store), "idx")
    client = Recording(store)
    monkeypatch.setattr(qdrant, "connect", lambda location: client)
    yield out, client
    client.close()


@pytest.fixture
def served(uploaded):
    """:func:`uploaded`, recorded as served at :data:`URL` by a server with 40 vectors HNSW-indexed."""
    out, client = uploaded
    record = json.loads((out / qdrant.QDRANT_FILE).read_text())
    (out / qdrant.QDRANT_FILE).write_text(json.dumps({**record, "location": URL}))
    client.indexed = 40
    return out, client


def test_an_exact_embedded_search_sends_exact_and_answers_the_exact_search(env, uploaded):
    out, client = uploaded
    captions, _ = caption_queries(env)
    exact = Searcher(SearchIndex.open(out), env.run, backend="exact")
    searcher = Searcher(qdrant.QdrantIndex.open(out, exact=True), env.run)
    assert searcher.kind["first_stage"] == "qdrant_embedded" and searcher.kind["exact"] is True
    for caption in captions[:4]:
        assert _hits(searcher, caption) == _hits(exact, caption), caption
    assert len(client.params) == 4 and all(p is not None and p.exact is True for p in client.params)
    client.params.clear()
    default = Searcher(qdrant.QdrantIndex.open(out), env.run)  # without it: the server's own parameters
    assert _hits(default, captions[0]) == _hits(exact, captions[0]) and client.params == [None]
    client.params.clear()
    opened = Searcher.open(out, qdrant=True, exact=True)
    assert _hits(opened, captions[1]) == _hits(exact, captions[1]) and client.params[0].exact is True


def test_exact_on_a_server_with_an_hnsw_index_is_an_exact_first_stage(env, served, capsys):
    out, client = served
    assert Searcher(qdrant.QdrantIndex.open(out), env.run).kind["exact"] is False  # 40 vectors indexed
    described = client.described
    searcher = Searcher(qdrant.QdrantIndex.open(out, exact=True), env.run)
    assert client.described == described  # the server is not asked: its index does not matter
    assert searcher.kind["first_stage"] == "qdrant_server_exact"
    assert searcher.kind["exact"] is True and searcher.kind["notes"] == []
    assert searcher.index_info["summary"] is None
    reopened = searcher.reopen()  # a server reloading the index keeps the option
    assert reopened.kind["first_stage"] == "qdrant_server_exact" and reopened.index.exact is True
    captions, _ = caption_queries(env)
    client.params.clear()
    assert main_search([str(out), captions[0], "-k", "3", "--qdrant", "--exact", "--json"]) == 0
    index = json.loads(capsys.readouterr().out)["index"]
    assert index["first_stage"] == "qdrant_server_exact" and index["exact"] is True
    assert index["summary"] is None and client.params[-1].exact is True
    assert main_search([str(out), captions[0], "-k", "3", "--qdrant", "--exact"]) == 0
    assert "note:" not in capsys.readouterr().out
    assert main_search([str(out), captions[0], "-k", "3", "--qdrant"]) == 0  # without it: approximate
    assert "note: not the exact float32 search: first stage in a Qdrant server's HNSW index" in (
        capsys.readouterr().out
    )


def test_exact_without_qdrant_is_refused_in_one_line(env, capsys):
    captions, _ = caption_queries(env)
    assert main_search([str(env.index_dir), captions[0], "--exact"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: --exact: makes Qdrant search exactly: give --qdrant too"), err
    with pytest.raises(ConfigError, match="--exact"):
        Searcher.open(env.index_dir, exact=True)


def test_open_for_upload_checks_the_manifest_its_caller_read(env, tmp_path, monkeypatch):
    """The build passes the manifest it read (old code read it again from the index directory)."""
    out = tmp_path / "idx"
    shutil.copytree(env.index_dir, out)
    manifest = Manifest.read(out)

    def no_read(*args, **kwargs):
        raise AssertionError("the manifest is read again")

    monkeypatch.setattr(Manifest, "read", no_read)
    client = qdrant.open_for_upload(out, str(tmp_path / "store"), "idx", manifest=manifest)
    client.close()
    manifest.dense["store"] = "scores"  # what the backend cannot hold is refused, from the manifest given
    with pytest.raises(ConfigError, match="keeps dense scores"):
        qdrant.open_for_upload(out, str(tmp_path / "store"), "idx", manifest=manifest)


def test_serve_takes_exact_as_search_does(env, capsys):
    """``serve --exact`` reaches the searcher as ``search --exact`` does: refused in one line without
    ``--qdrant``, before the port is bound."""
    pytest.importorskip("fastapi")
    from patchword.cli.serve import main_serve

    assert main_serve([str(env.index_dir), "--exact", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --exact: makes Qdrant search exactly"), err
