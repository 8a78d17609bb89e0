"""Which index version a server's ids belong to, and image files changed since indexing.

``/api/search`` and ``/api/explain`` say the ``version`` (the rows digest ``/healthz`` reports) their ids
belong to, and ``/api/explain`` / ``/api/image/{id}`` given a search's ``version`` answer 409 once the index
was updated (old code: no version anywhere, and the old id answered with the image and heatmap of another
file, so the page drew one image's picture under another's path and score). An indexed PNG replaced by
other content is a 404 saying it changed (old code: sent as ``200 image/png``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from patchword.search.index import build_index
from patchword.search.manifest import rows_digest
from patchword.search.store import SearchIndex
from patchword.serve.app import create_app
from search_support import STALE_VERSION as STALE
from search_support import caption_queries, served_copy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ids_of_an_older_version_are_a_409_not_another_image(env, tmp_path):
    folder, out, client = served_copy(env, tmp_path)
    query = caption_queries(env)[0][0]
    with client:
        version = client.get("/healthz").json()["version"]
        found = client.get("/api/search", params={"q": query, "k": 24}).json()
        assert found["version"] == version == rows_digest(SearchIndex.open(out).manifest)
        # the last id: every id before it moves when the first file is removed
        last = max(r["id"] for r in found["results"])
        last_path = next(r["path"] for r in found["results"] if r["id"] == last)
        explained = client.get("/api/explain", params={"q": query, "id": last, "version": version})
        assert explained.status_code == 200 and explained.json()["version"] == version
        assert explained.json()["path"] == last_path
        image = client.get(f"/api/image/{last}", params={"version": version})
        assert image.status_code == 200 and image.content == (folder / last_path).read_bytes()
        etag = image.headers["etag"]
        again = client.get(f"/api/image/{last}", params={"version": version}, headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.headers["etag"] == etag

        first = SearchIndex.open(out).path(0)
        (folder / first).unlink()
        build_index(env.run, folder, out, update=True, shard_size=10)
        moved = SearchIndex.open(out)
        assert last >= len(moved) or moved.path(last) != last_path  # the old id names another image now

        current = rows_digest(moved.manifest)  # a 409 names it: the client searches again
        stale = client.get("/api/explain", params={"q": query, "id": last, "version": version})
        assert stale.status_code == 409 and stale.json() == {"error": STALE, "version": current}
        for headers in ({}, {"If-None-Match": etag}, {"If-None-Match": "*"}):  # never a 304 for it either
            old = client.get(f"/api/image/{last}", params={"version": version}, headers=headers)
            assert old.status_code == 409 and old.json() == {"error": STALE, "version": current}, headers
            assert old.headers["cache-control"] == "no-store"
        assert client.head(f"/api/image/{last}", params={"version": version}).status_code == 409

        # a search again: the new version, whose ids read the files they name
        now = client.get("/api/search", params={"q": query, "k": 23}).json()
        assert now["version"] == rows_digest(moved.manifest) == client.get("/healthz").json()["version"]
        assert now["version"] != version
        hit = now["results"][0]
        fresh = client.get("/api/explain", params={"q": query, "id": hit["id"], "version": now["version"]})
        assert fresh.status_code == 200 and fresh.json()["path"] == hit["path"]
        assert fresh.json()["version"] == now["version"]
        picture = client.get(f"/api/image/{hit['id']}", params={"version": now["version"]})
        assert picture.status_code == 200 and picture.content == (folder / hit["path"]).read_bytes()

        # without a version: as before (the id read in the index as it is now)
        plain = client.get("/api/explain", params={"q": query, "id": 0})
        assert plain.status_code == 200 and plain.json()["path"] == moved.path(0)
        assert client.get("/api/image/0").content == (folder / moved.path(0)).read_bytes()
        # a bad version is a 409 too, an empty or repeated one a 400 naming it
        assert client.get("/api/image/0", params={"version": "nope"}).status_code == 409
        empty = client.get("/api/image/0?version=")
        assert empty.status_code == 400 and "'version'" in empty.json()["error"]
        twice = client.get(f"/api/image/0?version={now['version']}&version={now['version']}")
        assert twice.status_code == 400 and "'version'" in twice.json()["error"]


def test_the_page_asks_images_and_explanations_of_the_searchs_version(env, searcher):
    with TestClient(create_app(searcher)) as client:
        script = client.get("/static/app.js").text
    assert "state.version = body.version" in script
    assert "/api/image/${result.id}${versionParam(version, true)}" in script
    assert "&id=${id}${versionParam(version, false)}" in script


def test_an_indexed_png_replaced_by_other_content_is_a_404(env, tmp_path):
    folder, out, client = served_copy(env, tmp_path)
    index = SearchIndex.open(out)
    assert index.entries[0].format == "PNG"
    changed = "the file of image {} changed since it was indexed and cannot be read; run index build --update"
    with client:
        (folder / index.path(0)).write_bytes(b"<html>not an image</html>")
        garbage = client.get("/api/image/0")
        assert garbage.status_code == 404 and garbage.json() == {"error": changed.format(0)}
        assert client.head("/api/image/0").status_code == 404

        data = (folder / index.path(1)).read_bytes()
        (folder / index.path(1)).write_bytes(data[: len(data) // 2])  # truncated
        truncated = client.get("/api/image/1")
        assert truncated.status_code == 404 and truncated.json() == {"error": changed.format(1)}

        # still an image (edited in place): sent, as what it is now
        with Image.open(folder / index.path(2)) as image:
            flipped = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        flipped.save(folder / index.path(2), format="JPEG")
        edited = client.get("/api/image/2")
        assert edited.status_code == 200 and edited.headers["content-type"] == "image/jpeg"
        assert edited.content == (folder / index.path(2)).read_bytes()

        untouched = client.get("/api/image/3")
        assert untouched.status_code == 200 and untouched.headers["content-type"] == "image/png"
        assert untouched.content == (folder / index.path(3)).read_bytes()
