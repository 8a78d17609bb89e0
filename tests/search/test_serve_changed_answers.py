"""What a server answers for an image file changed since indexing and for ids of an older index version.

An indexed file replaced by a JPEG cut short after its header is a 404 saying it changed (old code: Pillow's
``verify`` accepts it, decoding no pixel, and it was sent as ``200 image/jpeg``), even when the process
turned Pillow's ``LOAD_TRUNCATED_IMAGES`` on. A 409 (an id of an older version) names the version served
now, so a client searches again without asking ``/healthz`` (old code: ``{"error"}`` alone)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFile

from patchword.search.index import build_index
from patchword.search.manifest import rows_digest
from patchword.search.store import SearchIndex
from search_support import STALE_VERSION as STALE
from search_support import caption_queries, served_copy

pytestmark = pytest.mark.usefixtures("one_thread")

CHANGED = "the file of image {} changed since it was indexed and cannot be read; run index build --update"


def _half_a_jpeg() -> bytes:
    """A real JPEG (Pillow's) cut in half: its header whole, half of its pixel data gone."""
    pixels = np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    data = buf.getvalue()
    return data[: len(data) // 2]


def test_an_indexed_file_replaced_by_a_truncated_jpeg_is_a_404(env, tmp_path, monkeypatch):
    half = _half_a_jpeg()
    with Image.open(io.BytesIO(half)) as image:  # what the old check accepted
        assert image.format == "JPEG"
        image.verify()
    folder, out, client = served_copy(env, tmp_path)
    index = SearchIndex.open(out)
    with client:
        (folder / index.path(0)).write_bytes(half)
        truncated = client.get("/api/image/0")
        assert truncated.status_code == 404 and truncated.json() == {"error": CHANGED.format(0)}
        assert client.head("/api/image/0").status_code == 404
        # an application embedding the server turned Pillow's global on: still refused, the flag kept
        monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
        assert client.get("/api/image/0").json() == {"error": CHANGED.format(0)}
        assert ImageFile.LOAD_TRUNCATED_IMAGES is True

        # the same JPEG whole: sent, as what it is now
        pixels = np.random.default_rng(0).integers(0, 256, (128, 128, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / index.path(1), format="JPEG", quality=90)
        whole = client.get("/api/image/1")
        assert whole.status_code == 200 and whole.headers["content-type"] == "image/jpeg"
        assert whole.content == (folder / index.path(1)).read_bytes()


def test_a_409_names_the_version_served_now(env, tmp_path):
    folder, out, client = served_copy(env, tmp_path)
    query = caption_queries(env)[0][0]
    with client:
        old = client.get("/api/search", params={"q": query, "k": 3}).json()["version"]
        (folder / SearchIndex.open(out).path(0)).unlink()
        build_index(env.run, folder, out, update=True, shard_size=10)
        now = rows_digest(SearchIndex.open(out).manifest)
        assert now != old
        stale = client.get("/api/explain", params={"q": query, "id": 1, "version": old})
        assert stale.status_code == 409 and stale.json() == {"error": STALE, "version": now}
        image = client.get("/api/image/1", params={"version": old})
        assert image.status_code == 409 and image.json() == {"error": STALE, "version": now}
        assert client.get("/healthz").json()["version"] == now
        # the version given back is one the server takes
        fresh = client.get("/api/explain", params={"q": query, "id": 1, "version": now})
        assert fresh.status_code == 200 and fresh.json()["version"] == now
