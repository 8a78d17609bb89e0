"""A Qdrant collection uploaded again under a process that opened it, and the errors of a store that cannot
be used.

Old code: after ``index build --update --qdrant`` renumbered the ids, a searcher (a ``serve --qdrant``)
opened before mapped the new points through its old manifest and showed other images than those it scored;
``search --qdrant`` / ``index build --qdrant`` on an embedded store another process held, or on a server that
refuses connections, ended in a traceback, and the upload removed ``qdrant.json`` before connecting (a
failed connection left an index that no search would open)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import one_error_line
from patchword.cli import main
from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex, StaleIndexError
from patchword.serve.app import create_app
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
qdrant_client = pytest.importorskip("qdrant_client")


def _uploaded(env, tmp_path: Path) -> tuple[Path, Path, Path]:
    """An index of a copy of the exported images, uploaded to an embedded store: (images, index, store)."""
    folder, out, store = tmp_path / "imgs", tmp_path / "idx", tmp_path / "store"
    shutil.copytree(env.export.files["images"], folder)
    build_index(env.run, folder, out, dense=env.export.files["dense"], shard_size=10)
    qdrant.upload_index(out, str(store), "idx")
    return folder, out, store


def _renumbered_upload(env, folder: Path, out: Path, client, store: Path) -> dict:
    """What `index build --update --qdrant` does while a process holds the collection: the first image is
    deleted (every later id moves), the index updated, and its points written to the same collection (with
    the holder's client: an embedded store admits one). Returns the record the upload would write."""
    (folder / sorted(p.name for p in folder.iterdir())[0]).unlink()
    build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, shard_size=10)
    return qdrant._upload(SearchIndex.open(out), client, qdrant_client.models, str(store), "idx", 64)


def _hits(searcher: Searcher, query: str) -> list[tuple[int, str]]:
    return [(h.id, h.path) for h in searcher.search(query, k=5).hits]


def test_a_searcher_refuses_a_collection_uploaded_again_since_it_opened_it(env, tmp_path):
    folder, out, store = _uploaded(env, tmp_path)
    searcher = Searcher(qdrant.QdrantIndex.open(out), env.run)
    captions, _ = caption_queries(env)
    old_path_of_3 = searcher.index.path(3)
    assert _hits(searcher, captions[0])
    _renumbered_upload(env, folder, out, searcher.index.client, store)
    with pytest.raises(StaleIndexError, match="was uploaded again since this index was opened") as err:
        searcher.search(captions[0], k=5)
    assert "restart `patchword serve`" in str(err.value)
    with pytest.raises(StaleIndexError, match=f"which the index opened here calls '{old_path_of_3}'"):
        searcher.explain(captions[0], 3)  # retrieved by id: checked too
    searcher.index.client.close()


def test_a_qdrant_server_follows_its_collection_uploaded_again(env, tmp_path):
    folder, out, store = _uploaded(env, tmp_path)
    searcher = Searcher(qdrant.QdrantIndex.open(out), env.run)
    captions, _ = caption_queries(env)
    with TestClient(create_app(searcher)) as client:
        assert client.get("/api/search", params={"q": captions[0]}).status_code == 200
        record = _renumbered_upload(env, folder, out, searcher.index.client, store)
        # the manifest changed, the record of the upload not yet: no answer from either version
        waiting = client.get("/api/search", params={"q": captions[0], "k": 5})
        assert waiting.status_code == 503, waiting.text
        (out / qdrant.QDRANT_FILE).write_text(json.dumps(record))  # the upload's last write
        response = client.get("/api/search", params={"q": captions[0], "k": 5})
        assert response.status_code == 200, response.text
        got = [(r["id"], r["path"], r["score"]) for r in response.json()["results"]]
        health = client.get("/healthz").json()
    local = Searcher(SearchIndex.open(out), env.run).search(captions[0], k=5).hits
    assert [(i, p) for i, p, _ in got] == [(h.id, h.path) for h in local]
    assert [s for *_, s in got] == pytest.approx([h.score for h in local], abs=1e-4)
    assert health["images"] == 23 and health["index"]["first_stage"] == "qdrant_embedded"
    searcher.index.client.close()


def test_a_collection_replaced_under_unchanged_files_is_a_503_never_other_images(env, tmp_path):
    folder, out, store = _uploaded(env, tmp_path)
    searcher = Searcher(qdrant.QdrantIndex.open(out), env.run)
    other = tmp_path / "other"  # another index's points, written to the collection this server reads
    shutil.copytree(folder, tmp_path / "imgs2")
    (tmp_path / "imgs2" / sorted(p.name for p in folder.iterdir())[0]).unlink()
    build_index(env.run, tmp_path / "imgs2", other, dense=env.export.files["dense"], shard_size=10)
    qdrant._upload(
        SearchIndex.open(other), searcher.index.client, qdrant_client.models, str(store), "idx", 64
    )
    captions, _ = caption_queries(env)
    with TestClient(create_app(searcher)) as client:
        first = client.get("/api/search", params={"q": captions[0], "k": 5})
        assert first.status_code == 503 and first.json()["error"].startswith("the index changed while")
        # opened again, the collection holds 23 points for an index of 24: refused until uploaded again
        again = client.get("/api/search", params={"q": captions[0], "k": 5})
        assert again.status_code == 503 and "cannot be opened" in again.json()["error"]
    searcher.index.client.close()


def test_an_embedded_store_in_use_is_one_error_line_and_the_record_stays(env, tmp_path, capsys):
    folder, out, store = _uploaded(env, tmp_path)
    record = (out / qdrant.QDRANT_FILE).read_text()
    captions, _ = caption_queries(env)
    holder = qdrant.connect(str(store))  # another process serving it
    build = ["index", "build", str(env.run_dir), "--images", str(folder), "--out", str(out)]
    build += ["--dense", str(env.export.files["dense"]), "--shard-size", "10"]
    try:
        capsys.readouterr()
        assert main(["search", str(out), captions[0], "--qdrant"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: the embedded Qdrant store {store} is in use by another process")
        assert main([*build, "--update", "--qdrant", str(store)]) == 2
        assert "is in use by another process" in one_error_line(capsys.readouterr().err)
        assert (out / qdrant.QDRANT_FILE).read_text() == record  # connected first: nothing removed
    finally:
        holder.close()
    assert main(["search", str(out), captions[0], "--qdrant", "-k", "2"]) == 0


def test_a_server_that_refuses_connections_is_one_error_line_and_the_record_stays(env, tmp_path, capsys):
    folder, out, store = _uploaded(env, tmp_path)
    record = (out / qdrant.QDRANT_FILE).read_text()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    build = ["index", "build", str(env.run_dir), "--images", str(folder), "--out", str(out)]
    build += ["--dense", str(env.export.files["dense"]), "--shard-size", "10", "--update"]
    capsys.readouterr()
    assert main([*build, "--qdrant", url]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot use Qdrant collection 'idx' at {url}: ") and "refused" in line
    assert (out / qdrant.QDRANT_FILE).read_text() == record
    # a record naming that server: search refuses it in one line too
    (out / qdrant.QDRANT_FILE).write_text(json.dumps({**json.loads(record), "location": url}))
    captions, _ = caption_queries(env)
    assert main(["search", str(out), captions[0], "--qdrant"]) == 2
    assert f"cannot use Qdrant collection 'idx' at {url}" in one_error_line(capsys.readouterr().err)
