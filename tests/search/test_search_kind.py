"""What ``search`` and ``serve`` say about the index they answer from.

Old code: approximate indexes (a pq store, pruned patches, float16 / int8, an IVF shortlist) looked exact
everywhere (``/healthz``, ``search --json``, the text output, the pq build report); an index built without
``--dense`` for a model that reads dense captions was searched without a word although every ranking
differed; a query cut inside a word said that word was left out whole; ``search FILE`` printed ``[Errno 20]
Not a directory``; a build that encoded nothing printed ``(0.0 images/s encoding)``; and the build report
counted a changed file (encoded again) as removed."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from fastapi.testclient import TestClient

from conftest import one_error_line
from patchword.cli.search import main_search
from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import create_app
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


def _search_cli(capsys, index_dir, query: str, *extra: str) -> str:
    assert main_search([str(index_dir), query, "-k", "3", *extra]) == 0
    return capsys.readouterr().out


def test_a_pq_index_says_it_is_approximate_in_search_healthz_and_its_build_report(env, tmp_path, capsys):
    images, dense = env.export.files["images"], env.export.files["dense"]
    report = build_index(env.run, images, tmp_path / "pq", dense=dense, dtype="pq", pq_bytes=8)
    assert "tokens product-quantised (--store pq, 8 bytes per token): search scores are an approximation" in (
        report.summary()
    )
    captions, _ = caption_queries(env)
    out = _search_cli(capsys, tmp_path / "pq", captions[0])
    note = out.strip().splitlines()[-1]
    assert note.startswith(
        "note: not the exact float32 search: tokens product-quantised (--store pq, 8 bytes"
    )
    body = json.loads(_search_cli(capsys, tmp_path / "pq", captions[0], "--json"))
    assert body["index"]["store"] == "pq" and body["index"]["exact"] is False
    assert (
        body["index"]["notes"][0].startswith("tokens product-quantised") and body["index"]["warnings"] == []
    )
    searcher = Searcher(SearchIndex.open(tmp_path / "pq"), env.run)
    with TestClient(create_app(searcher)) as client:
        health = client.get("/healthz").json()
    assert health["index"] == body["index"]

    # the float32 index: exact, no note
    out = _search_cli(capsys, env.index_dir, captions[0])
    assert "note:" not in out and out.strip().splitlines()[-1].startswith("3 results in ")
    body = json.loads(_search_cli(capsys, env.index_dir, captions[0], "--json"))
    assert body["index"]["exact"] is True and body["index"]["notes"] == []


def test_pruned_int8_and_ivf_searches_name_each_approximation(env, tmp_path, capsys):
    images, dense = env.export.files["images"], env.export.files["dense"]
    build_index(env.run, images, tmp_path / "pruned", dense=dense, keep_patches=0.75, dtype="int8")
    index = SearchIndex.open(tmp_path / "pruned")
    n = index.manifest.model["num_patches"]
    notes = [
        "tokens stored as int8 (--store int8): fine scores rounded",
        f"patches pruned at build time (12 of {n} kept per image, --keep-patches 0.75): approximate fine "
        "scores",
    ]
    captions, _ = caption_queries(env)
    note = _search_cli(capsys, tmp_path / "pruned", captions[0]).strip().splitlines()[-1]
    assert note == f"note: not the exact float32 search: {'; '.join(notes)} (docs/search.md, section 7)"
    kind = Searcher(index, env.run).kind
    assert kind["store"] == "int8" and kind["pruning"] == {"kept": 12, "of": n, "fraction": 0.75}
    assert kind["notes"] == notes and kind["exact"] is False

    pytest.importorskip("faiss")
    shutil.copytree(env.index_dir, tmp_path / "ivf")  # the IVF lists are kept beside the index
    ivf = Searcher(SearchIndex.open(tmp_path / "ivf"), env.run, backend="faiss_ivf").kind
    assert (ivf["first_stage"], ivf["exact"]) == ("faiss_ivf", False)
    assert ivf["notes"] == [
        "approximate first stage (faiss_ivf): the shortlist may miss images an exact one holds"
    ]


def test_an_index_without_the_dense_captions_its_model_reads_is_warned_of_at_every_open(
    env, tmp_path, caplog
):
    assert env.run.config.data.dense and env.run.model.matcher.consumes_dense
    build_index(env.run, env.export.files["images"], tmp_path / "nodense")
    expected = (
        f"the run {env.run.run_dir.name}'s model reads dense captions, but the index nodense was built "
        "without them: every ranking differs from the model's evaluated one; build the index with --dense "
        "FILE"
    )
    for _ in range(2):  # every open, not once per process
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="patchword.search.query"):
            searcher = Searcher.open(tmp_path / "nodense")
        assert [r.getMessage() for r in caplog.records] == [expected]
    assert searcher.warnings == [expected]
    with TestClient(create_app(searcher)) as client:
        assert client.get("/healthz").json()["index"]["warnings"] == [expected]
    # an index with them: nothing to say
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="patchword.search.query"):
        assert Searcher.open(env.index_dir).warnings == []
    assert not caplog.records


def test_a_query_cut_inside_a_word_says_that_word_is_read_in_part(env, searcher):
    max_tokens = env.run.config.data.max_caption_len
    # one token per "red", then a word of two tokens across the limit, then two words past it
    words = ["red"] * (max_tokens - 3) + ["blue,circle", "green", "square"]
    result = searcher.search(" ".join(words), k=3)
    assert result.warning == (
        f"the query is longer than the {max_tokens} tokens the model reads (data.max_caption_len): "
        "'blue,circle' is read in part and the 2 words after it were left out"
    )
    assert (result.dropped_words, result.cut_word) == (2, "blue,circle")
    body = result.to_json()
    assert (body["dropped_words"], body["cut_word"]) == (2, "blue,circle")
    # what the model reads: every "red" and "blue", the first token of the cut word
    query = searcher.encode_query(" ".join(words))
    kept, _ = env.run.tokenize([" ".join(words[:-2])])
    assert query.ids.tolist() == kept.tolist() and len(query.ids[0]) == max_tokens
    # the cut word is the last one: nothing after it is left out
    last = searcher.search(" ".join(words[:-2]), k=3)
    assert (last.dropped_words, last.cut_word) == (0, "blue,circle")
    assert last.warning.endswith(": its last word, 'blue,circle', is read in part")
    # a limit that falls between words is said as before
    whole = searcher.search(" ".join(["red"] * (max_tokens - 2) + ["green", "square"]), k=3)
    assert (whole.dropped_words, whole.cut_word) == (2, None)
    assert whole.warning.endswith(": its last 2 words were left out") and "cut_word" not in whole.to_json()


def test_searching_a_file_is_one_line_saying_it_is_not_an_index_directory(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("hello\n")
    assert main_search([str(file), "a red circle"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {file} is not a search index: it is a file, not an index directory"
    )


def test_an_update_that_encodes_nothing_reports_no_encoding_rate(env, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], folder)
    first = build_index(env.run, folder, tmp_path / "idx", dense=env.export.files["dense"])
    assert " images/s encoding)" in first.summary()
    again = build_index(env.run, folder, tmp_path / "idx", dense=env.export.files["dense"], update=True)
    line = again.summary().splitlines()[0]
    assert "images/s" not in line and "(0 encoded, 24 kept, 0 removed) in " in line
    assert line.endswith(" s")
