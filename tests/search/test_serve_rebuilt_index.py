"""An index deleted and built again in its folder from other files is another version of the index.

Old code: the version (``rows_digest``) hashed the weights, the shard list and each entry's (shard, row)
only, so an index rebuilt from as many other files had the version of the old one: ``/api/explain`` and
``/api/image`` given an id of a search made before answered ``200`` with another image (``other03.png``
under the old search's ``img03.png``), and ``/healthz`` named the same version. A random ``build_id``, drawn
when an index is made and kept by its updates, now tells two builds apart; an index written before it was
recorded still opens, with the digest it had (what was derived from it, a Qdrant upload, still matches).
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from patchword.errors import DataError
from patchword.search.index import build_index
from patchword.search.manifest import MANIFEST_FILE, Manifest, rows_digest
from patchword.search.store import SearchIndex
from search_support import STALE_VERSION, caption_queries, served_copy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ids_of_an_index_built_again_from_other_files_are_a_409(env, tmp_path):
    folder, out, client = served_copy(env, tmp_path)
    query = caption_queries(env)[0][0]
    with client:
        version = client.get("/healthz").json()["version"]
        before = client.get("/api/explain", params={"q": query, "id": 3, "version": version})
        assert before.status_code == 200 and not before.json()["path"].startswith("other")

        for file in sorted(folder.iterdir()):  # as many files, each under another name
            file.rename(folder / f"other{file.name}")
        shutil.rmtree(out)
        build_index(env.run, folder, out, shard_size=10)
        rebuilt = SearchIndex.open(out)
        assert len(rebuilt) == 24 and rebuilt.path(3).startswith("other")

        now = rows_digest(rebuilt.manifest)
        assert now != version
        stale = client.get("/api/explain", params={"q": query, "id": 3, "version": version})
        assert stale.status_code == 409 and stale.json() == {"error": STALE_VERSION, "version": now}
        assert client.get("/healthz").json()["version"] == now  # the index reopened by that request
        image = client.get("/api/image/3", params={"version": version})
        assert image.status_code == 409 and image.json() == {"error": STALE_VERSION, "version": now}
        fresh = client.get("/api/explain", params={"q": query, "id": 3, "version": now})
        assert fresh.status_code == 200 and fresh.json()["path"] == rebuilt.path(3)


def test_an_update_keeps_the_build_id_and_an_index_without_one_opens_as_before(env, tmp_path):
    folder, out, _ = served_copy(env, tmp_path)
    built = Manifest.read(out)
    assert isinstance(built.build_id, str) and len(built.build_id) == 16
    (folder / SearchIndex.open(out).path(0)).unlink()
    build_index(env.run, folder, out, update=True, shard_size=10)
    assert Manifest.read(out).build_id == built.build_id  # ids moved: the digest says so without it

    # an index written before the build id was recorded: searched, and digested as it was then
    payload = json.loads((out / MANIFEST_FILE).read_text())
    del payload["build_id"]
    (out / MANIFEST_FILE).write_text(json.dumps(payload))
    old = SearchIndex.open(out)
    assert old.manifest.build_id is None and len(old) == 23
    digest = hashlib.sha256(json.dumps([old.manifest.model["weights_sha256"], old.manifest.shards]).encode())
    digest.update(np.array([(e.shard, e.row) for e in old.entries], dtype=np.int64).tobytes())
    assert rows_digest(old.manifest) == digest.hexdigest()[:16]
    old.manifest.write(out)  # rewritten by an update: still without one
    assert "build_id" in json.loads((out / MANIFEST_FILE).read_text())
    assert Manifest.read(out).build_id is None

    payload["build_id"] = 7
    (out / MANIFEST_FILE).write_text(json.dumps(payload))
    with pytest.raises(DataError, match="field 'build_id' is not a string"):
        Manifest.read(out)
