"""What the server tells a client of itself: the longest query, the shortlist, the index's warnings.

Old code: ``/healthz`` did not give ``--max-query-chars`` (the page hard-coded 512); the warnings of
``/healthz`` and every ``/api/search`` answer named the run and the index by the server's absolute paths
(``/srv/runs/tiny's model reads dense captions, but /srv/idx was built without them``) although ``run``
names the run by its folder only; ``/favicon.ico`` was a 404; docs/search.md did not say that ``/healthz``'s
``shortlist`` is a minimum a larger ``k`` widens (``--shortlist 5``, ``k=20``: ``"shortlist": 20``).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app
from project_paths import ROOT

pytestmark = pytest.mark.usefixtures("one_thread")


def test_healthz_gives_the_longest_query_and_the_page_takes_it(searcher):
    with TestClient(create_app(searcher, ServeLimits(max_query_chars=20))) as client:
        assert client.get("/healthz").json()["max_query_chars"] == 20
        assert client.get("/api/search", params={"q": "a red circle left of it"}).status_code == 400
        page, script = client.get("/").text, client.get("/static/app.js").text
        icon = client.get("/favicon.ico")
        assert icon.status_code == 204 and icon.content == b""
    assert "maxlength" not in page and "health.max_query_chars" in script  # the page's limit: the server's


def test_the_served_warnings_name_the_run_and_index_by_folder_name(env, tmp_path):
    out = tmp_path / "bare"
    build_index(env.run, env.export.files["images"], out)  # without the dense captions the model reads
    searcher = Searcher(SearchIndex.open(out), env.run)
    served = [
        "the run tiny's model reads dense captions, but the index bare was built without them: every ranking "
        "differs from the model's evaluated one; build the index with --dense FILE"
    ]
    assert searcher.index_info["warnings"] == served  # the CLI's too: one sentence
    with TestClient(create_app(searcher)) as client:
        health = client.get("/healthz").json()
        assert health["index"]["warnings"] == served and health["run"] == "tiny"
        found = client.get("/api/search", params={"q": "a red circle", "k": 3}).json()
        assert found["index"]["warnings"] == served
        assert found["index"]["summary"] == searcher.index_info["summary"] == "dense captions missing"
    assert str(tmp_path) not in str(health) + str(found) and str(env.root) not in str(health) + str(found)


def test_an_index_opened_as_dot_is_named_by_its_folder(env, tmp_path, monkeypatch):
    """A first fix replaced the paths in the served text by their folder names: an index opened as ``.``
    (``patchword serve .``) has the name "", and every "." of the sentence went."""
    out = tmp_path / "bare.v2"
    build_index(env.run, env.export.files["images"], out)
    monkeypatch.chdir(out)
    warning = Searcher(SearchIndex.open("."), env.run).index_info["warnings"][0]
    assert warning.startswith("the run tiny's model reads dense captions, but the index bare.v2 was built")


def test_healthz_shortlist_is_the_least_a_search_re_ranks(env):
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run, shortlist=5)
    with TestClient(create_app(searcher, ServeLimits(max_k=20))) as client:
        assert client.get("/healthz").json()["shortlist"] == 5
        assert client.get("/api/search", params={"q": "a red circle", "k": 3}).json()["shortlist"] == 5
        assert client.get("/api/search", params={"q": "a red circle", "k": 20}).json()["shortlist"] == 20
    docs = (ROOT / "docs" / "search.md").read_text()
    serving = docs[docs.index("## 4. Serving") : docs.index("## 5. ")]
    assert "`max(--shortlist, k)`" in serving and "the least a search re-ranks" in serving
