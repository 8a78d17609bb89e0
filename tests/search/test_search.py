"""Search and explain on a tiny trained index: the ranking is the library's two-stage search, the recall is
the run's, and explanations equal the matcher's own selection and alignment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from patchword.cli.search import main_search
from patchword.eval import evaluate
from patchword.eval.two_stage import faiss_available
from patchword.matching import build_matcher
from patchword.matching.ops import length_mask
from patchword.search.explain import explain_pair
from patchword.search.query import Searcher
from patchword.search.results import QueryError
from patchword.search.store import SearchIndex
from search_support import (
    assert_ranked_as,
    caption_queries,
    library_t2i_scores,
    rank_bounds,
    train_code_variant,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("shortlist", [None, 8])
def test_every_caption_ranks_as_in_the_library_two_stage_search(env, shortlist):
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run, shortlist=shortlist)
    n = len(searcher)
    assert searcher.shortlist == (n if shortlist is None else 8) and searcher.use_dense
    expected, global_sims = library_t2i_scores(env, searcher.shortlist)
    captions, truth = caption_queries(env)
    for j, caption in enumerate(captions):
        result = searcher.search(caption, k=searcher.shortlist)
        column = expected[:, j]
        ids = [h.id for h in result.hits]
        assert_ranked_as(ids, column, global_sims[:, j], shortlist)
        finite = [i for i in ids if torch.isfinite(column[i])]
        got = torch.tensor([h.score for h in result.hits if h.id in finite])
        torch.testing.assert_close(got, column[finite], rtol=1e-5, atol=1e-5)
        assert [h.rank for h in result.hits] == list(range(1, len(ids) + 1))
        assert all(h.path == searcher.index.path(h.id) for h in result.hits)
        # The ground truth is found where the library ranks it, up to near ties (or missed by both).
        if truth[j] in finite:
            low, high = rank_bounds(column, truth[j])
            assert low <= ids.index(truth[j]) + 1 <= high, caption


def test_recall_through_search_equals_the_run_evaluation(env, searcher):
    """Recall from the search's ranks equals the run's own evaluation, up to near ties: both lie between
    the recalls of the library's exhaustive scores with every near tie resolved against and for the truth."""
    from patchword.train.runner import prepare_data

    data = prepare_data(env.config.data, tokenizer=env.run.tokenizer)
    metrics = evaluate(env.run.model, data.splits["test"], env.config.eval)
    scores, _ = library_t2i_scores(env, len(searcher))
    captions, truth = caption_queries(env)
    ranks, bounds = [], []
    for j, (caption, gt) in enumerate(zip(captions, truth, strict=True)):
        ids = [h.id for h in searcher.search(caption, k=len(searcher)).hits]
        ranks.append(ids.index(gt) + 1)
        bounds.append(rank_bounds(scores[:, j], gt))
    assert sum(high - low for low, high in bounds) <= len(bounds) // 10  # few near ties
    for k in (1, 5, 10):
        recall = 100.0 * sum(r <= k for r in ranks) / len(ranks)
        worst = 100.0 * sum(high <= k for _, high in bounds) / len(bounds)
        best = 100.0 * sum(low <= k for low, _ in bounds) / len(bounds)
        assert worst - 1e-9 <= recall <= best + 1e-9, k
        assert worst - 1e-9 <= metrics[f"t2i_r{k}"] <= best + 1e-9, k


def test_explanation_score_is_the_search_score_with_a_global_term(env):
    """Old code: with ``alpha`` (a TGDT hybrid plan: fine + alpha * global) the explanation's score left the
    global term out (search 1.6956, explain 1.9069 on a TGDT index)."""
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run, alpha=0.7)
    captions, _ = caption_queries(env)
    for caption in captions[:3]:
        for hit in searcher.search(caption, k=3).hits:
            explained = searcher.explain(caption, hit.id)
            assert explained.score == pytest.approx(hit.score, abs=1e-5)
            assert hit.score != pytest.approx(hit.score - 0.7 * hit.global_score, abs=1e-4)


def test_explanation_is_the_matchers_own_selection_and_alignment(env, searcher):
    matcher = searcher.fine
    captions, truth = caption_queries(env)
    checked_heat = 0
    for caption, image_id in [(captions[0], truth[0]), (captions[7], 3), (captions[30], truth[30])]:
        explanation = searcher.explain(caption, image_id)
        query = searcher.encode_query(caption)
        img = searcher.index.image_tokens([image_id])
        dense, dense_lens = searcher.index.dense_tokens([image_id])
        with torch.no_grad():
            out = matcher(img, query.tokens, query.lens, dense, dense_lens)
        # the pair's score is the fine score the search ranks with
        assert explanation.score == pytest.approx(float(out.sims[0, 0]), abs=1e-5)
        assert explanation.score == pytest.approx(
            float(searcher.rerank(query, torch.tensor([image_id]))[0]), abs=1e-5
        )
        # kept patches: one mask per branch, K of N each, equal to the forward's decisions
        assert [b.name for b in explanation.branches] == ["sparse", "dense"]
        assert explanation.grid == (4, 4) and explanation.num_keep == matcher.num_keep == 8
        for branch, decision in zip(explanation.branches, out.decisions, strict=True):
            assert branch.kept.shape == (16,) and branch.kept_count == 8
            assert torch.equal(branch.kept, decision[0, 0] > 0.5)
        # HRPA of the explained cosine matrix is the score (paper variant: the sparse alignment only)
        valid = length_mask(query.lens, explanation.alignment.shape[1])[None, :, None]
        with torch.no_grad():
            hrpa = matcher.hrpa(explanation.alignment[None, None], valid)
        assert float(hrpa[0, 0]) == pytest.approx(explanation.score, abs=1e-5)
        # each word's heat splits its HRPA term over the patches of its best token
        kept_any = explanation.branches[0].kept | explanation.branches[1].kept
        kept_both = explanation.branches[0].kept & explanation.branches[1].kept
        assert len(explanation.words) == int(query.lens[0])
        for w, word in enumerate(explanation.words):
            best = float(explanation.alignment[:, w].max())
            assert word.cosine == pytest.approx(best, abs=1e-6)
            if word.best_token == "cls":
                assert torch.count_nonzero(word.heat) == 0
                continue
            checked_heat += 1
            assert float(word.heat.sum()) == pytest.approx(best, abs=1e-5)
            if word.best_token.startswith("aggregated"):
                assert torch.count_nonzero(word.heat[~kept_any]) == 0
            else:  # fusion token: a mixture of dropped patches
                assert torch.count_nonzero(word.heat[kept_both]) == 0
        body = explanation.to_json()
        assert body["grid"] == [4, 4] and [len(r) for r in body["branches"][0]["kept"]] == [4] * 4
        assert [w["text"] for w in body["words"]][0] == "<start>" and body["words"][0]["special"]
    assert checked_heat > 0


def test_matchers_without_selection_get_token_cosines():
    torch.manual_seed(0)
    matcher = build_matcher("vse", embed_dim=8, num_patches=4, has_cls=True).eval()
    img, cap = torch.randn(5, 8), torch.randn(3, 8)
    explanation = explain_pair(matcher, img, cap, 3, token_strings=["<start>", "dog", "<end>"], grid=(2, 2))
    assert explanation.method == "token_cosine" and explanation.branches == [] and explanation.grid == (2, 2)
    cos = torch.nn.functional.normalize(img[1:], dim=-1) @ torch.nn.functional.normalize(cap, dim=-1).T
    for w, word in enumerate(explanation.words):
        torch.testing.assert_close(word.heat, cos[:, w])
    assert [w.special for w in explanation.words] == [True, False, True]


def test_bad_queries_are_user_errors(searcher):
    for text in ("", "   ", "!!! ???"):
        with pytest.raises(QueryError):
            searcher.search(text)
    for k in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="k must be"):
            searcher.search("a red circle", k=k)


def test_search_cli_prints_rank_score_path_and_latency(env, searcher, capsys):
    captions, _ = caption_queries(env)
    expected = searcher.search(captions[0], k=3)
    assert main_search([str(env.index_dir), captions[0], "-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["#", "score", "global", "path"]
    rows = [line.split() for line in lines[1:4]]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[3] for r in rows] == [h.path for h in expected.hits]
    assert [float(r[1]) for r in rows] == pytest.approx([h.score for h in expected.hits], abs=1e-4)
    assert lines[4].startswith("3 results in ") and " ms " in lines[4]
    assert main_search([str(env.index_dir), captions[0], "-k", "3", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["query"] == captions[0] and body["ms"] > 0
    assert [r["id"] for r in body["results"]] == [h.id for h in expected.hits]
    assert main_search([str(env.index_dir), "", "-k", "3"]) == 2
    assert "error: the query is empty" in capsys.readouterr().err
    assert main_search([str(env.root / "nowhere"), "x"]) == 2
    assert f"search index not found: {env.root / 'nowhere'} does not exist" in capsys.readouterr().err


def test_a_query_with_no_known_word_is_refused_naming_the_words(env, searcher, capsys):
    """It used to return confident results for the <unk> token alone."""
    from conftest import one_error_line

    for call in (lambda: searcher.search("zzzqqq, xxyyzz zzzqqq"), lambda: searcher.explain("xxyyzz", 0)):
        with pytest.raises(QueryError, match=r"knows none of the query's words \('(zzzqqq', ')?xxyyzz'\)"):
            call()
    assert searcher.encode_query("zzzqqq a").unknown_words == ["zzzqqq"]
    with pytest.raises(QueryError) as err:
        searcher.search("zzzqqq xxyyzz")
    assert err.value.unknown_words == ["zzzqqq", "xxyyzz"]
    assert main_search([str(env.index_dir), "zzzqqq xxyyzz"]) == 2
    captured = capsys.readouterr()
    assert one_error_line(captured.err) == f"error: {err.value}" and captured.out == ""


def test_a_query_with_some_unknown_words_answers_with_a_warning(env, searcher, capsys):
    """Unknown words are encoded as <unk>: the answer is that of any other unknown word there, flagged."""
    query = "a small red zzzqqq circle"
    result = searcher.search(query, k=5)
    same = searcher.search("a small red qqqxyz circle", k=5)
    assert [h.id for h in result.hits] == [h.id for h in same.hits]
    assert [h.score for h in result.hits] == [h.score for h in same.hits]
    assert result.unknown_words == ["zzzqqq"] and same.unknown_words == ["qqqxyz"]
    body = result.to_json()
    assert body["unknown_words"] == ["zzzqqq"]
    assert body["warning"] == (  # old wording: "the results rest on the other words", though <unk> is scored
        "the model does not know 'zzzqqq': it reads the unknown token in its place, which means nothing to "
        "the model but is scored with the query's other words"
    )
    assert "<unk>" in [w.text for w in searcher.explain(query, result.hits[0].id).words]
    two = searcher.search("a small zzzqqq red qqqxyz circle", k=5).warning
    assert two.startswith("the model does not know 'zzzqqq', 'qqqxyz': it reads the unknown token in their")
    assert "warning" not in searcher.search("a small red circle", k=5).to_json()
    assert main_search([str(env.index_dir), query, "-k", "5", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["warning"] == body["warning"]
    assert captured.err.splitlines()[-1] == f"warning: {body['warning']}"
    assert main_search([str(env.index_dir), "a small red circle", "-k", "5"]) == 0
    assert "warning" not in capsys.readouterr().err


# The control characters a query may not hold: C0 (newline, tab, CR, NUL, ESC, backspace), DEL and C1.
CONTROL_CHARACTERS = ["\n", "\t", "\r", "\x00", "\x1b", "\x08", "\x7f", "\x85", "\x9b"]


def test_queries_with_control_characters_are_refused_naming_them(searcher):
    """docs/search.md said control characters are refused; the library searched "red\\ncircle"."""
    for char in CONTROL_CHARACTERS:
        expected = rf"^the query contains control characters \(U\+{ord(char):04X} at character 4\): "
        with pytest.raises(QueryError, match=expected):
            searcher.search(f"red{char}circle")
        with pytest.raises(QueryError, match=expected):
            searcher.explain(f"red{char}circle", 0)
    with pytest.raises(QueryError, match=r"\(U\+000A at character 11, U\+0009 at character 12\)"):
        searcher.search("red circle\n\t")  # trailing: not stripped away
    # Accents, CJK and other printable text are queries like any other.
    result = searcher.search("a red circle café 赤い円", k=3)
    assert len(result.hits) == 3 and result.unknown_words == ["café", "赤い円"]


def test_search_cli_refuses_control_characters_in_one_line_before_loading(env, capsys):
    from conftest import one_error_line

    for index_dir in (env.index_dir, env.root / "nowhere"):  # no index needed to say so
        for char in ("\n", "\x7f", "\x85"):
            assert main_search([str(index_dir), f"red{char}circle", "-k", "3"]) == 2
            captured = capsys.readouterr()
            assert one_error_line(captured.err) == (
                f"error: the query contains control characters (U+{ord(char):04X} at character 4): a query "
                "is one line of printable text"
            )
            assert captured.out == ""
    assert main_search([str(env.index_dir), "a red circle", "--shortlist", "0"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --shortlist: must be >= 1, got 0"


def test_search_cli_prints_no_faiss_loader_chatter(env):
    """Every search printed ~8 INFO lines of the FAISS loader trying builds this machine lacks
    (``Could not load library with AVX512 support due to: ModuleNotFoundError("No module named
    'faiss.swigfaiss_avx512'")``)."""
    pytest.importorskip("faiss")
    argv = [sys.executable, "-m", "patchword", "search", str(env.index_dir), "a red circle", "-k", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[0].split() == ["#", "score", "global", "path"], done.stdout
    assert "swigfaiss" not in done.stderr and "faiss.loader" not in done.stderr, done.stderr


def test_faiss_import_drops_the_loaders_info_and_keeps_its_errors(tmp_path):
    """The loader's logger is quiet for the import only: an error it logs (no build loads) still shows,
    an ImportError still says FAISS is unavailable, and the logger's level is left as it was."""
    fake = tmp_path / "faiss"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import logging\n"
        "log = logging.getLogger('faiss.loader')\n"
        "log.info(\"Could not load library with AVX512 support due to: ModuleNotFoundError('No module "
        "named faiss.swigfaiss_avx512')\")\n"
        "log.error('no build of faiss loads on this machine')\n"
        "raise ImportError('no build of faiss loads')\n"
    )
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)\n"
        "from patchword.eval.two_stage import faiss_available\n"
        "print(faiss_available(), logging.getLogger('faiss.loader').level)\n"
    )
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False 0\n"
    assert "ERROR:faiss.loader:no build of faiss loads on this machine" in done.stderr
    assert "swigfaiss" not in done.stderr, done.stderr


def _global_column(searcher, caption: str) -> torch.Tensor:
    """(N,) global similarities of every indexed image to ``caption``: what a first stage must report."""
    return searcher.index.global_embeddings() @ searcher.encode_query(caption).global_embedding[0]


@pytest.mark.skipif(not faiss_available(), reason="faiss is an optional extra (pip install faiss-cpu)")
def test_an_approximate_first_stage_kept_with_the_index_is_rebuilt_after_an_update_that_deletes_files(
    env, tmp_path
):
    """The HNSW graph / IVF lists kept beside the index describe its rows by index id; an update that only
    deletes files keeps the shards but moves the ids: the kept first stage must not be reused (old code: an
    IndexError, or another image's global score reported for a hit)."""
    import shutil

    from patchword.search.index import build_index

    images = tmp_path / "images"
    shutil.copytree(env.export.files["images"], images)
    dense = env.export.files["dense"]
    build_index(env.run, images, tmp_path / "idx", dense=dense, shard_size=100)
    captions, _ = caption_queries(env)
    backends = ("faiss_hnsw", "faiss_ivf")
    for backend in backends:  # built and kept for the 24 images
        Searcher(SearchIndex.open(tmp_path / "idx"), env.run, backend=backend).search(captions[0], k=3)
    for name in sorted(p.name for p in images.iterdir())[1:9:3]:
        (images / name).unlink()
    report = build_index(env.run, images, tmp_path / "idx", update=True, shard_size=100)
    assert (report.removed, report.added, report.num_images) == (3, 0, 21)
    index = SearchIndex.open(tmp_path / "idx")
    assert len(index.manifest.shards) == 1  # the same shard list: only the entries moved
    exact = Searcher(index, env.run, backend="exact", shortlist=len(index))
    for backend in backends:
        whole = Searcher(index, env.run, backend=backend, shortlist=len(index))
        short = Searcher(index, env.run, backend=backend, shortlist=5)
        for caption in captions[:6]:
            want = {h.id: h.score for h in exact.search(caption, k=len(index)).hits}
            got = {h.id: h.score for h in whole.search(caption, k=len(index)).hits}
            assert got.keys() == want.keys() and all(abs(got[i] - want[i]) < 1e-5 for i in want), backend
            truth = _global_column(exact, caption)
            hits = short.search(caption, k=5).hits
            for hit in hits:  # each hit's first-stage score is its own image's
                assert hit.global_score == pytest.approx(float(truth[hit.id]), abs=1e-5), backend
                assert hit.path == index.path(hit.id)
            boundary = float(truth.sort(descending=True).values[4])  # the exact top 5, up to near ties
            must = set((truth > boundary + 1e-5).nonzero().flatten().tolist())
            may = set((truth >= boundary - 1e-5).nonzero().flatten().tolist())
            assert must <= {h.id for h in hits} <= may, backend
    assert len(list((tmp_path / "idx").glob("global.*.hnsw"))) == 1  # the stale graph was replaced


@pytest.mark.skipif(not faiss_available(), reason="faiss is an optional extra (pip install faiss-cpu)")
def test_a_search_whose_ivf_lists_hold_fewer_images_than_its_shortlist_gets_a_shorter_one(env):
    """FAISS fills the slots an IVF scan cannot with id -1: no hit may be "image -1" (the last entry's path
    under another image's score), the shortlist is the images actually found."""
    from patchword.eval.two_stage import GlobalIndex

    index = SearchIndex.open(env.index_dir)
    searcher = Searcher(index, env.run, backend="exact", shortlist=len(index))
    searcher.global_index = GlobalIndex(index.global_embeddings(), backend="faiss_ivf", nlist=4, nprobe=1)
    captions, _ = caption_queries(env)
    short = 0
    for caption in captions[:6]:
        _, raw = searcher.global_index.search(searcher.encode_query(caption).global_embedding, len(index))
        found = raw[0][raw[0] >= 0].tolist()
        short += len(found) < len(index)
        result = searcher.search(caption, k=len(index))
        ids = [h.id for h in result.hits]
        assert sorted(ids) == sorted(found) and result.shortlist == len(found)
        truth = _global_column(searcher, caption)
        for hit in result.hits:
            assert hit.global_score == pytest.approx(float(truth[hit.id]), abs=1e-5)
            assert hit.path == index.path(hit.id)
    assert short, "the test needs queries whose scanned lists hold fewer images than the shortlist"


def test_an_explanation_on_a_dense_scores_index_scores_as_its_search(env, tmp_path):
    """--dense-store scores keeps the dense branch's score per image instead of its tokens: the explanation
    adds it as the search does (old code: the caption branch alone, about half the search's score)."""
    from patchword.search.index import build_index

    run = train_code_variant(env, tmp_path)
    images, dense = env.export.files["images"], env.export.files["dense"]
    build_index(run, images, tmp_path / "tokens", dense=dense, shard_size=10)
    build_index(run, images, tmp_path / "scores", dense=dense, dense_store="scores", shard_size=10)
    tokens = Searcher(SearchIndex.open(tmp_path / "tokens"), run)
    scores = Searcher(SearchIndex.open(tmp_path / "scores"), run)
    captions, _ = caption_queries(env)
    for caption in captions[:3]:
        for hit in scores.search(caption, k=3).hits:
            explained = scores.explain(caption, hit.id)
            assert explained.score == pytest.approx(hit.score, abs=1e-5)
            assert explained.score == pytest.approx(tokens.explain(caption, hit.id).score, abs=1e-5)
