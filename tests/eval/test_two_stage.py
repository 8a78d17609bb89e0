"""Two-stage search: global shortlist + fine re-ranking; misses count as misses; hybrid; FAISS."""

from __future__ import annotations

import math

import pytest
import torch

from patchword.eval import GlobalIndex, global_embeddings, retrieval_metrics, score_matrix, two_stage_scores
from patchword.eval.two_stage import faiss_available
from patchword.matching import build_matcher

DIM = 32


pytestmark = pytest.mark.usefixtures("one_thread")


def _split(n_img, per_image=5, seed=0, n_patches=49):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, n_patches, DIM, generator=g)
    n_txt = n_img * per_image
    caps = torch.randn(n_txt, 12, DIM, generator=g)
    lens = torch.randint(4, 13, (n_txt,), generator=g)
    txt2img = torch.arange(n_txt) // per_image
    return img, caps, lens, txt2img


def _seps():
    torch.manual_seed(0)
    return build_matcher(
        "seps", embed_dim=DIM, num_patches=49, has_cls=False, sparse_ratio=0.8, aggr_ratio=0.6, variant="code"
    ).eval()


def test_random_embeddings_give_chance_recall_and_misses_are_misses():
    n_img, k, top = 120, 12, 5
    img, caps, lens, txt2img = _split(n_img)
    n_txt = caps.shape[0]
    res = two_stage_scores(_seps(), img, caps, lens, k=k)
    metrics = retrieval_metrics(res.sims, txt2img)
    # t2i: the ground truth is shortlisted with probability k/N_img, then ranks < top among k with
    # probability top/k: chance top/N_img overall, as exhaustive search. Counting a missed shortlist as a
    # hit (official TGDT) would give ~ (1 - k/N_img) + top/N_img instead.
    p = top / n_img
    tol = 4 * math.sqrt(p * (1 - p) / n_txt)
    assert abs(metrics["t2i_r5"] / 100 - p) <= tol
    shortlisted = (res.t2i_candidates == txt2img[:, None]).any(dim=1).float().mean().item()
    assert abs(shortlisted - k / n_img) <= 4 * math.sqrt(k / n_img / n_txt)
    assert metrics["t2i_r10"] / 100 <= shortlisted + 1e-9  # nothing outside the shortlist is found
    # i2t: at least one of 5 ground-truth captions in the top `top`, hypergeometric chance.
    p_i2t = 1 - math.prod((n_txt - top - j) / (n_txt - j) for j in range(5))
    assert abs(metrics["i2t_r5"] / 100 - p_i2t) <= 4 * math.sqrt(p_i2t * (1 - p_i2t) / n_img)
    assert metrics["t2i_medr"] > n_img / 2  # most ground truths are missed: rank N_img


def test_a_ground_truth_outside_the_shortlist_is_a_miss():
    img, caps, lens, txt2img = _split(8, per_image=1, seed=3)
    m = build_matcher("vse", embed_dim=DIM, has_cls=False, pool="mean").eval()
    # Make every caption's global embedding point away from its own image: with k=1 its shortlist holds
    # another image, so every t2i query misses (the official TGDT evaluator would report R@1 = 100).
    caps = -img.mean(dim=1, keepdim=True).expand(-1, 12, -1).clone() + 0.01 * caps
    res = two_stage_scores(m, img, caps, lens, k=1)
    assert (res.t2i_candidates[:, 0] != txt2img).all()
    metrics = retrieval_metrics(res.sims, txt2img)
    assert metrics["t2i_r1"] == metrics["t2i_r10"] == 0.0
    assert metrics["t2i_medr"] == 9.0  # rank N_img + 1 (1-based)


def test_full_shortlist_equals_exhaustive_and_hybrid_adds_alpha_global():
    img, caps, lens, txt2img = _split(10, seed=1)
    m = _seps()
    full = score_matrix(m, img, caps, lens)
    res = two_stage_scores(m, img, caps, lens, k=1000)
    assert res.pairs_scored == full.numel()
    assert torch.allclose(res.sims_i2t, full, atol=1e-5) and torch.allclose(res.sims_t2i, full, atol=1e-5)
    assert retrieval_metrics(res.sims, txt2img) == retrieval_metrics(full, txt2img)

    alpha = 0.7
    hybrid = two_stage_scores(m, img, caps, lens, k=(7, 3), alpha=alpha)
    img_emb, txt_emb = global_embeddings(m, img, caps, lens)
    want = alpha * img_emb @ txt_emb.T + full
    assert hybrid.i2t_candidates.shape == (10, 7) and hybrid.t2i_candidates.shape == (50, 3)
    shown = torch.isfinite(hybrid.sims_i2t)
    assert int(shown.sum()) == 10 * 7 and (shown.sum(dim=1) == 7).all()
    assert torch.allclose(hybrid.sims_i2t[shown], want[shown], atol=1e-5)
    shown = torch.isfinite(hybrid.sims_t2i)
    assert (shown.sum(dim=0) == 3).all()
    assert torch.allclose(hybrid.sims_t2i[shown], want[shown], atol=1e-5)
    # the shortlist is the global top-k
    top = (img_emb @ txt_emb.T).topk(7, dim=1).indices
    assert torch.equal(top.sort(dim=1).values, hybrid.i2t_candidates.sort(dim=1).values)


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_re_ranking_equals_one_thread(threads):
    img, caps, lens, _ = _split(24, seed=2)
    m = _seps()
    # a tiny budget forces one image per block, so every worker gets several blocks
    one = two_stage_scores(m, img, caps, lens, k=(9, 4), max_memory_mb=0.6)
    torch.set_num_threads(threads)
    many = two_stage_scores(m, img, caps, lens, k=(9, 4), max_memory_mb=0.6)
    assert torch.get_num_threads() == threads  # restored after the workers
    assert torch.equal(torch.isfinite(one.sims_i2t), torch.isfinite(many.sims_i2t))
    shown = torch.isfinite(one.sims_i2t)
    assert torch.allclose(one.sims_i2t[shown], many.sims_i2t[shown], atol=1e-6)
    shown = torch.isfinite(one.sims_t2i)
    assert torch.allclose(one.sims_t2i[shown], many.sims_t2i[shown], atol=1e-6)
    full = score_matrix(m, img, caps, lens)
    shown = torch.isfinite(many.sims_i2t)
    assert torch.allclose(many.sims_i2t[shown], full[shown], atol=1e-5)


def test_exact_index_blocks_and_validation():
    g = torch.Generator().manual_seed(0)
    db = torch.nn.functional.normalize(torch.randn(300, 16, generator=g), dim=1)
    q = torch.nn.functional.normalize(torch.randn(40, 16, generator=g), dim=1)
    scores, idx = GlobalIndex(db, max_memory_mb=0.01).search(q, 5)  # many small query blocks
    want = (q @ db.T).topk(5, dim=1)
    assert torch.equal(idx, want.indices) and torch.allclose(scores, want.values)
    assert GlobalIndex(db).search(q, 10_000)[1].shape == (40, 300)  # k clipped to the database
    with pytest.raises(ValueError, match="backend"):
        GlobalIndex(db, backend="annoy")
    with pytest.raises(ValueError, match="queries"):
        GlobalIndex(db).search(q[:, :8], 3)


@pytest.mark.skipif(not faiss_available(), reason="faiss is an optional extra (pip install faiss-cpu)")
def test_faiss_flat_equals_exact_and_the_approximate_indexes_are_close():
    g = torch.Generator().manual_seed(0)
    db = torch.nn.functional.normalize(torch.randn(500, 24, generator=g), dim=1)
    q = torch.nn.functional.normalize(torch.randn(60, 24, generator=g), dim=1)
    exact_scores, exact_idx = GlobalIndex(db).search(q, 10)
    flat_scores, flat_idx = GlobalIndex(db, backend="faiss_flat").search(q, 10)
    assert torch.equal(flat_idx, exact_idx) and torch.allclose(flat_scores, exact_scores, atol=1e-5)
    _, hnsw_idx = GlobalIndex(db, backend="faiss_hnsw", ef_search=128).search(q, 10)
    overlap = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(hnsw_idx, exact_idx, strict=True))
    assert overlap / exact_idx.numel() >= 0.9
    # IVF scanning every list is exact; by default it scans nlist // 8 of them
    ivf = GlobalIndex(db, backend="faiss_ivf", nlist=8, nprobe=8)
    ivf_scores, ivf_idx = ivf.search(q, 10)
    assert torch.equal(ivf_idx, exact_idx) and torch.allclose(ivf_scores, exact_scores, atol=1e-5)
    default = GlobalIndex(db, backend="faiss_ivf", nlist=16)
    batch_scores, batch_idx = default.search(q, 10)
    assert default._index.nprobe == 2
    # one query (a search) splits its lists over FAISS's threads instead of the batch: the same hits
    for row in (0, 17, 59):
        one_scores, one_idx = default.search(q[row : row + 1], 10)
        assert default._index.parallel_mode == 1
        assert torch.equal(one_idx[0], batch_idx[row])
        torch.testing.assert_close(one_scores[0], batch_scores[row], atol=1e-6, rtol=0)

    img, caps, lens, txt2img = _split(12, seed=2)
    m = _seps()
    exact = two_stage_scores(m, img, caps, lens, k=4)
    flat = two_stage_scores(m, img, caps, lens, k=4, backend="faiss_flat")
    assert torch.equal(exact.sims_i2t, flat.sims_i2t) and torch.equal(exact.sims_t2i, flat.sims_t2i)


@pytest.mark.skipif(not faiss_available(), reason="faiss is an optional extra (pip install faiss-cpu)")
def test_an_ivf_shortlist_it_cannot_fill_is_shorter_and_its_empty_slots_are_no_pairs():
    """FAISS IVF marks the slots a query's scanned lists cannot fill with label -1 (score -3.4e38): they are
    dropped (the pairs stay -inf, misses), never read as caption N_txt - 1 of the previous image or as
    negative pair ids, and ``pairs_scored`` counts the real pairs only."""
    img, caps, lens, _ = _split(60, seed=4)
    m = build_matcher("vse", embed_dim=DIM, has_cls=False, pool="mean").eval()
    img_emb, txt_emb = global_embeddings(m, img, caps, lens)
    ivf = GlobalIndex(img_emb, backend="faiss_ivf", nlist=6, nprobe=1)
    scores, ids = ivf.search(txt_emb, 40)
    assert (ids < 0).any(), "the test needs shortlists IVF cannot fill"
    assert torch.equal(ids < 0, scores == float("-inf"))  # no -3.4e38 passed off as a score
    options = {"nlist": 6, "nprobe": 1}
    res = two_stage_scores(m, img, caps, lens, k=40, backend="faiss_ivf", index_options=options)
    full = score_matrix(m, img, caps, lens)
    for sims, candidates, by_row in (
        (res.sims_i2t, res.i2t_candidates, True),
        (res.sims_t2i, res.t2i_candidates, False),
    ):
        want = torch.zeros_like(full, dtype=torch.bool)
        for query, row in enumerate(candidates.tolist()):
            real = [c for c in row if c >= 0]
            if by_row:
                want[query, real] = True
            else:
                want[real, query] = True
        assert torch.equal(torch.isfinite(sims), want)
        assert torch.allclose(sims[want], full[want], atol=1e-5)
    assert (res.t2i_candidates < 0).any()
    real_pairs = torch.isfinite(res.sims_i2t) | torch.isfinite(res.sims_t2i)
    assert res.pairs_scored == int(real_pairs.sum())
