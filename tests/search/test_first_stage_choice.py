"""Choosing a local index's first stage: the IVF lists benchmarks/scale_search.py builds ahead are the ones a
search loads (it named them by a digest of the shard list, the searcher by ``rows_digest``: a server spent
minutes building its own and deleted the benchmark's), and ``search`` / ``serve --first-stage`` choose the
searcher's backend (the CLI had no way to: above 200k images its users could get neither exact nor HNSW
search, and ``--exact`` pointed them at the library's ``backend='exact'``)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from conftest import one_error_line
from patchword.cli.search import main_search
from patchword.eval.two_stage import faiss_available
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from project_paths import BENCHMARKS
from search_support import caption_queries

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not faiss_available(), reason="faiss is an optional extra (pip install faiss-cpu)"),
]


def test_the_scale_benchmark_keeps_its_ivf_lists_where_a_search_loads_them(env, tmp_path, monkeypatch):
    from patchword.eval import two_stage

    spec = importlib.util.spec_from_file_location("scale_search_script", BENCHMARKS / "scale_search.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "idx"
    shutil.copytree(env.index_dir, out)
    script.first_stage(out, queries=4, k=5)
    kept = sorted(p.name for p in out.glob("global.*.ivf"))
    assert len(kept) == 1
    monkeypatch.setattr(two_stage.GlobalIndex, "__init__", lambda *a, **k: pytest.fail("IVF lists rebuilt"))
    searcher = Searcher(SearchIndex.open(out), env.run, backend="faiss_ivf")  # loads the benchmark's lists
    assert searcher.global_index.backend == "faiss_ivf"
    assert sorted(p.name for p in out.glob("global.*.ivf")) == kept  # not replaced by its own


def test_search_chooses_the_first_stage(env, tmp_path, capsys, monkeypatch):
    from patchword.search import query

    out = tmp_path / "idx"
    shutil.copytree(env.index_dir, out)
    monkeypatch.setattr(query, "APPROXIMATE_ABOVE", 10)  # 24 images: "large", auto takes IVF
    caption = caption_queries(env)[0][0]
    stages = {}
    for stage in ("auto", "exact", "faiss_flat", "faiss_hnsw"):
        assert main_search([str(out), caption, "-k", "3", "--json", "--first-stage", stage]) == 0
        stages[stage] = json.loads(capsys.readouterr().out)["index"]["first_stage"]
    assert stages == {
        "auto": "faiss_ivf",
        "exact": "exact",
        "faiss_flat": "faiss_flat",
        "faiss_hnsw": "faiss_hnsw",
    }
    assert main_search([str(out), caption, "--first-stage", "exact", "--qdrant"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --first-stage: chooses a local index's shortlist: with --qdrant"), line
    # --exact without --qdrant points at the flag that does it for a local index
    assert main_search([str(out), caption, "--exact"]) == 2
    assert "--first-stage faiss_flat or exact keeps it exact" in one_error_line(capsys.readouterr().err)


def test_serve_takes_the_first_stage_as_search_does(env, capsys):
    pytest.importorskip("fastapi")
    from patchword.cli.search import open_searcher
    from patchword.cli.serve import _parser, main_serve

    args = _parser().parse_args([str(env.index_dir), "--first-stage", "faiss_hnsw", "--device", "cpu"])
    assert open_searcher(args).backend == "faiss_hnsw"
    assert main_serve([str(env.index_dir), "--first-stage", "exact", "--qdrant", "--port", "0"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --first-stage: chooses a local index's")
