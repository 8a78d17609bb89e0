"""``/healthz`` gives the figures of one searcher: it read the matcher, run, shortlist and dense flag of the
searcher it looked up first, then the images, version and index kind of the one served at that moment, so
a reopen finishing on a worker thread in between answered one version's ``shortlist`` beside another's
``version`` (review S). Every figure is cheap: nothing is scanned per request."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import create_app
from patchword.serve.reload import ServedIndex

pytestmark = pytest.mark.usefixtures("one_thread")


def test_healthz_answers_from_one_searcher_when_a_reopen_lands_during_the_request(env, searcher, monkeypatch):
    reopened = Searcher(SearchIndex.open(env.index_dir), env.run, shortlist=3)
    assert searcher.shortlist == 24
    describe = ServedIndex.describe

    def reopen_lands_first(self):
        self._served = (reopened, "v-reopened")  # a reopen on a worker thread finishing just now
        return describe(self)

    monkeypatch.setattr(ServedIndex, "describe", reopen_lands_first)
    with TestClient(create_app(searcher)) as client:
        body = client.get("/healthz").json()
    assert (body["version"], body["shortlist"], body["images"]) == ("v-reopened", 3, 24)
    assert (body["matcher"], body["run"], body["dense"]) == ("seps", "tiny", True)
