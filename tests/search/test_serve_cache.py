"""What ``patchword serve`` lets browsers cache, and its defaults: an image is revalidated by ETag (index ids
name other images after an update; old code: ``Cache-Control: private, max-age=3600`` and no validator, so a
browser showed the old image under a moved id for an hour), ``/api/search`` without ``k`` keeps within
``--max-k`` (old code: 10 results with ``max_k=3``), and an MPO photo (a JPEG with extra frames) is sent as
stored (old code: decoded and re-encoded as PNG on every request)."""

from __future__ import annotations

import io
import os
import shutil

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app

pytestmark = pytest.mark.usefixtures("one_thread")


def _client(searcher: Searcher, limits: ServeLimits | None = None) -> TestClient:
    return TestClient(create_app(searcher, limits), raise_server_exceptions=False)


def test_an_image_is_revalidated_by_its_etag(env, searcher):
    with _client(searcher) as client:
        first = client.get("/api/image/0")
        etag = first.headers["etag"]
        assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
        assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
        assert first.content == (searcher.index.images_root / searcher.index.path(0)).read_bytes()
        for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            again = client.get("/api/image/0", headers={"If-None-Match": header})
            assert again.status_code == 304 and again.content == b"", header
            assert again.headers["etag"] == etag and again.headers["cache-control"] == "no-cache"
        other = client.get("/api/image/0", headers={"If-None-Match": '"other"'})
        assert other.status_code == 200 and other.content == first.content
        assert client.get("/api/image/1").headers["etag"] != etag  # each image its own
        head = client.head("/api/image/0")
        assert head.status_code == 200 and head.headers["etag"] == etag and head.content == b""


def test_an_id_that_names_another_image_after_an_update_gets_a_new_etag(env, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], folder)
    out = tmp_path / "idx"
    build_index(env.run, folder, out, dense=env.export.files["dense"], shard_size=10)
    before = Searcher(SearchIndex.open(out), env.run)
    with _client(before) as client:
        old = client.get("/api/image/0")
    (folder / before.index.path(0)).unlink()
    build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, shard_size=10)
    after = Searcher(SearchIndex.open(out), env.run)  # the server restarted on the updated index
    assert after.index.path(0) != before.index.path(0)
    with _client(after) as client:
        new = client.get("/api/image/0", headers={"If-None-Match": old.headers["etag"]})
    assert new.status_code == 200 and new.headers["etag"] != old.headers["etag"]
    assert new.content == (folder / after.index.path(0)).read_bytes() != old.content


def test_a_changed_file_gets_a_new_etag(env, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], folder)
    out = tmp_path / "idx"
    build_index(env.run, folder, out, dense=env.export.files["dense"], shard_size=10)
    searcher = Searcher(SearchIndex.open(out), env.run)
    path = folder / searcher.index.path(0)
    with _client(searcher) as client:
        etag = client.get("/api/image/0").headers["etag"]
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # edited in place
        changed = client.get("/api/image/0", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag


@pytest.mark.parametrize(("max_k", "results"), [(3, 3), (100, 10)])
def test_a_search_without_k_stays_within_max_k(searcher, max_k, results):
    with _client(searcher, ServeLimits(max_k=max_k)) as client:
        response = client.get("/api/search", params={"q": "a red circle"})
        assert response.status_code == 200 and len(response.json()["results"]) == results
        assert client.get("/api/search", params={"q": "a red circle", "k": max_k + 1}).status_code == 400


def test_an_mpo_photo_is_sent_as_the_jpeg_it_is(env, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    first, second = Image.new("RGB", (32, 32), "red"), Image.new("RGB", (32, 32), "blue")
    first.save(folder / "photo.jpg", format="MPO", save_all=True, append_images=[second])
    shutil.copy2(next(env.export.files["images"].iterdir()), folder / "other.png")
    out = tmp_path / "idx"
    build_index(env.run, folder, out)
    searcher = Searcher(SearchIndex.open(out), env.run)
    image_id = [e.path for e in searcher.index.entries].index("photo.jpg")
    assert searcher.index.entries[image_id].format == "MPO"
    with _client(searcher) as client:
        response = client.get(f"/api/image/{image_id}")
    assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
    assert response.content == (folder / "photo.jpg").read_bytes()
    assert Image.open(io.BytesIO(response.content)).getpixel((16, 16))[0] > 200  # the first frame
