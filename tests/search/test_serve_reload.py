"""A server follows its index on disk: after ``index build --update`` the next request answers from the new
index (old code: the one opened at start, for as long as the server ran: a deleted image still found, a new
one never, ids naming other images than the files served), ``/healthz`` says which version it answers
from, an index that cannot be reopened is a 503 rather than the old answers, and the page reads ``--max-k``
and the default ``k`` from the server."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from patchword.search.index import build_index
from patchword.search.manifest import MANIFEST_FILE, rows_digest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


def _results(client: TestClient, query: str, k: int) -> list[tuple[int, str, float]]:
    response = client.get("/api/search", params={"q": query, "k": k})
    assert response.status_code == 200, response.text
    return [(r["id"], r["path"], r["score"]) for r in response.json()["results"]]


def _indexed_copy(env, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], folder)
    build_index(env.run, folder, tmp_path / "idx", shard_size=10)
    return folder, tmp_path / "idx"


def test_the_next_request_after_an_update_answers_from_the_updated_index(env, tmp_path):
    folder, out = _indexed_copy(env, tmp_path)
    captions, _ = caption_queries(env)
    initial = rows_digest(SearchIndex.open(out).manifest)
    with TestClient(create_app(Searcher(SearchIndex.open(out), env.run))) as client:
        before = client.get("/healthz").json()
        assert _results(client, captions[0], 24)
        names = sorted(p.name for p in folder.iterdir())
        deleted = names[0]
        (folder / deleted).unlink()
        with Image.open(folder / names[5]) as image:  # a new file, other pixels
            image.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(folder / "new.png")
        build_index(env.run, folder, out, update=True, shard_size=10)

        got = _results(client, captions[0], 24)
        fresh = Searcher(SearchIndex.open(out), env.run)
        want = [(h.id, h.path, h.score) for h in fresh.search(captions[0], k=24).hits]
        paths = [path for _, path, _ in got]
        assert "new.png" in paths and deleted not in paths and len(got) == 24
        assert [(i, p) for i, p, _ in got] == [(i, p) for i, p, _ in want]
        assert [s for *_, s in got] == pytest.approx([s for *_, s in want], abs=1e-6)
        new_id = next(i for i, p, _ in got if p == "new.png")
        assert client.get(f"/api/image/{new_id}").content == (folder / "new.png").read_bytes()
        explained = client.get("/api/explain", params={"q": captions[0], "id": new_id}).json()
        assert explained["path"] == "new.png"
        assert explained["score"] == pytest.approx(dict((p, s) for _, p, s in want)["new.png"], abs=1e-4)

        # /healthz names the version answered from, and an update not yet reopened
        after = client.get("/healthz").json()
        assert before["version"] == initial
        assert (before["images"], after["images"]) == (24, 24) and "changed_on_disk" not in after
        assert after["version"] == rows_digest(fresh.index.manifest) != before["version"]
        (folder / names[1]).unlink()
        build_index(env.run, folder, out, update=True, shard_size=10)
        assert client.get("/healthz").json()["changed_on_disk"] is True  # the next request reopens it
        assert len(_results(client, captions[0], 24)) == 23
        assert client.get("/healthz").json()["images"] == 23


def test_an_index_that_cannot_be_reopened_is_a_503_until_it_can(env, tmp_path, caplog):
    folder, out = _indexed_copy(env, tmp_path)
    captions, _ = caption_queries(env)
    manifest = (out / MANIFEST_FILE).read_bytes()
    with TestClient(create_app(Searcher(SearchIndex.open(out), env.run))) as client:
        (out / MANIFEST_FILE).write_text("{not json")
        for _ in range(2):  # logged once for this version of the files
            response = client.get("/api/search", params={"q": captions[0]})
            assert response.status_code == 503 and response.headers["retry-after"] == "5"
            assert response.json()["error"].startswith("the index changed on disk and cannot be opened")
        assert sum("cannot be opened as it is now" in r.getMessage() for r in caplog.records) == 1
        assert "malformed index manifest" in caplog.text
        health = client.get("/healthz").json()
        assert health["status"] == "ok" and health["changed_on_disk"] is True and "error" in health
        (out / MANIFEST_FILE).write_bytes(manifest)  # a new inode: reopened
        assert _results(client, captions[0], 3)
        assert "error" not in client.get("/healthz").json()


def test_the_page_takes_max_k_and_the_default_k_from_the_server(env, searcher):
    with TestClient(create_app(searcher, ServeLimits(max_k=7))) as client:
        health = client.get("/healthz").json()
        assert (health["max_k"], health["default_k"]) == (7, 7)
        page = client.get("/").text
        script = client.get("/static/app.js").text
    assert 'id="k"' in page and 'max="100"' not in page and 'value="10"' not in page
    assert "Math.min(100" not in script and "health.max_k" in script and "health.default_k" in script
