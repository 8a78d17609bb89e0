"""``search --json`` prints the ``/api/search`` body (docs/search.md): it lacked ``version`` (which image
every id names, what ``/api/explain`` and ``/api/image`` check) and the index's image count the text output
gives ("re-rank of 24 of 24 images")."""

from __future__ import annotations

import json

import pytest

from patchword.cli.search import main_search
from patchword.search.manifest import Manifest, rows_digest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


def test_search_json_is_the_served_body_with_the_index_size_and_timings(env, capsys):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from patchword.serve.app import create_app

    caption = caption_queries(env)[0][0]
    assert main_search([str(env.index_dir), caption, "-k", "5", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    with TestClient(create_app(Searcher(SearchIndex.open(env.index_dir), env.run))) as client:
        served = client.get("/api/search", params={"q": caption, "k": 5}).json()
    assert set(body) - {"images", "timings_ms"} == set(served)
    assert body["version"] == served["version"] == rows_digest(Manifest.read(env.index_dir))
    assert body["images"] == env.export.num_images
    assert [r["id"] for r in body["results"]] == [r["id"] for r in served["results"]]
    assert body["index"].keys() == served["index"].keys()
