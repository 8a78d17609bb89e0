"""``/api/search`` answers carry the ``index`` object ``/healthz`` and ``search --json`` carry, with a
one-line ``summary`` the page shows above the results.

Old code: ``/api/search`` had no ``index`` object (a client of the API could not tell a pq store or an index
missing its dense captions from the exact search), and the index object had no short line to show."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

import patchword.search.query as query_module
from patchword.cli.search import main_search
from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import create_app
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


def test_api_search_carries_the_index_object_of_healthz_and_search_json(env, tmp_path, capsys, monkeypatch):
    build_index(env.run, env.export.files["images"], tmp_path / "int8", dtype="int8")  # no --dense
    opened = []
    real = getattr(query_module, "describe_index", None)  # absent in old code: never called there

    def counted(*args, **kwargs):
        opened.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(query_module, "describe_index", counted, raising=False)
    searcher = Searcher(SearchIndex.open(tmp_path / "int8"), env.run)
    captions, _ = caption_queries(env)
    with TestClient(create_app(searcher)) as client:
        bodies = [client.get("/api/search", params={"q": q, "k": 3}).json() for q in captions[:3]]
        health = client.get("/healthz").json()
    warning = (
        f"the run {env.run.run_dir.name}'s model reads dense captions, but the index int8 was built without "
        "them: every ranking differs from the model's evaluated one; build the index with --dense FILE"
    )
    assert bodies[0]["index"] == {
        "store": "int8",
        "pruning": None,
        "first_stage": searcher.kind["first_stage"],
        "exact": False,
        "notes": ["tokens stored as int8 (--store int8): fine scores rounded"],
        "warnings": [warning],
        "summary": "approximate: int8 store; dense captions missing",
    }
    assert bodies[1]["index"] == bodies[2]["index"] == health["index"] == bodies[0]["index"]
    assert len(opened) == 1  # computed once for the opened index, not per answer
    assert main_search([str(tmp_path / "int8"), captions[0], "-k", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["index"] == bodies[0]["index"]


def test_an_exact_index_answers_with_no_summary(env, searcher):
    with TestClient(create_app(searcher)) as client:
        body = client.get("/api/search", params={"q": caption_queries(env)[0][0], "k": 2}).json()
    assert body["index"]["exact"] is True and body["index"]["warnings"] == []
    assert body["index"]["summary"] is None


def test_the_summary_names_each_approximation_in_a_few_words():
    from patchword.search.fidelity import index_summary

    kind = {"store": "pq", "pruning": {"kept": 12, "of": 16, "fraction": 0.75}, "first_stage": "faiss_ivf"}
    assert index_summary(kind, []) == ("approximate: pq store, 12 of 16 patches kept, faiss_ivf first stage")
    exact = {"store": "float32", "pruning": None, "first_stage": "qdrant_embedded"}
    assert index_summary(exact, []) is None
    assert index_summary(exact, ["dense captions missing"]) == "dense captions missing"
    server = {"store": "float32", "pruning": None, "first_stage": "qdrant_server"}
    assert index_summary(server, []) == "approximate: qdrant_server first stage"
