"""Hashing metrics: mAP@K on a hand-computed example (ties, zero-relevant queries), the official
``calculate_top_map`` as a loop reference, precision / recall / PR curve values, input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from patchword.hashing import (
    map_at_all,
    map_at_k,
    plot_pr_curves,
    precision_at_k,
    precision_recall_curve,
    recall_at_k,
    retrieval_report,
)

pytestmark = pytest.mark.usefixtures("one_thread")


# Hand example, K = 4 bits.
#   q0 = ++++ : distances to d0..d4 = 1, 0, 2, 1, 0 -> order (distance, position): d1 d4 d0 d3 d2
#   q1 = ---- : distances           = 3, 4, 2, 3, 4 -> order: d2 d0 d3 d1 d4
DB = np.array([[1, 1, 1, -1], [1, 1, 1, 1], [-1, 1, 1, -1], [1, -1, 1, 1], [1, 1, 1, 1]])
Q = np.array([[1, 1, 1, 1], [-1, -1, -1, -1]])
DB_LABELS = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 1]])
Q_LABELS = np.array([[1, 0, 0], [0, 0, 1]])
# q0 relevant: d0 d2 d4 -> ranked relevance [d1 0, d4 1, d0 1, d3 0, d2 1]
# q1 relevant: d3 d4    -> ranked relevance [d2 0, d0 0, d3 1, d1 0, d4 1]


def official_top_map(qB, rB, qL, rL, topk):
    """UCMFH evaluate.calculate_top_map, verbatim except for a stable argsort (the official sort is not)."""
    num_query = qL.shape[0]
    topkmap = 0
    for it in range(num_query):
        gnd = (np.dot(qL[it, :], rL.transpose()) > 0).astype(np.float32)
        hamm = 0.5 * (rB.shape[1] - np.dot(qB[it, :], rB.transpose()))
        ind = np.argsort(hamm, kind="stable")
        gnd = gnd[ind]
        tgnd = gnd[0:topk]
        tsum = np.sum(tgnd)
        if tsum == 0:
            continue
        count = np.linspace(1, tsum, int(tsum))
        tindex = np.asarray(np.where(tgnd == 1)) + 1.0
        topkmap += np.mean(count / tindex)
    return topkmap / num_query


def test_map_hand_example_with_ties():
    # k=3: q0 top3 rel [0,1,1] -> AP = (1/2 + 2/3) / 2 = 7/12; q1 [0,0,1] -> AP = 1/3.
    assert map_at_k(Q, DB, Q_LABELS, DB_LABELS, 3) == pytest.approx((7 / 12 + 1 / 3) / 2, abs=1e-12)
    # Ties decide it: breaking q0's distance-0 tie the other way (d4 before d1) would give AP 1 at k=2.
    value, per_query = map_at_k(Q, DB, Q_LABELS, DB_LABELS, 2, return_per_query=True)
    np.testing.assert_allclose(per_query, [1 / 2, 0.0])
    # q1 has no relevant item in its top 2: AP 0, and it still counts in the mean.
    assert value == pytest.approx(0.25, abs=1e-12)
    # k = all: q0 [0,1,1,0,1] -> (1/2 + 2/3 + 3/5) / 3; q1 [0,0,1,0,1] -> (1/3 + 2/5) / 2.
    want_all = ((1 / 2 + 2 / 3 + 3 / 5) / 3 + (1 / 3 + 2 / 5) / 2) / 2
    assert map_at_all(Q, DB, Q_LABELS, DB_LABELS) == pytest.approx(want_all, abs=1e-12)
    assert map_at_k(Q, DB, Q_LABELS, DB_LABELS, 5) == pytest.approx(want_all, abs=1e-12)
    assert map_at_k(Q, DB, Q_LABELS, DB_LABELS, 500) == pytest.approx(want_all, abs=1e-12)  # k clipped


def test_map_query_without_any_relevant_item_counts_as_zero():
    q_labels = np.array([[1, 0, 0], [0, 0, 0]])  # q1 has no label at all
    assert map_at_k(Q, DB, q_labels, DB_LABELS, 3) == pytest.approx(7 / 12 / 2, abs=1e-12)


def test_map_with_pair_ids_is_reciprocal_rank():
    # ids: q0's only relevant item is d4 (rank 2 in q0's order), q1's is d3 (rank 3).
    assert map_at_k(Q, DB, np.array([4, 3]), np.arange(5), 50) == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert map_at_k(Q, DB, np.array([4, 3]), np.arange(5), 2) == pytest.approx(1 / 4)


def test_precision_recall_at_k_hand_values():
    # k=3: q0 2 hits of 3 relevant, q1 1 hit of 2 relevant.
    assert precision_at_k(Q, DB, Q_LABELS, DB_LABELS, [1, 3]) == pytest.approx(
        {1: 0.0, 3: (2 / 3 + 1 / 3) / 2}
    )
    assert recall_at_k(Q, DB, Q_LABELS, DB_LABELS, [3, 5]) == pytest.approx({3: (2 / 3 + 1 / 2) / 2, 5: 1.0})
    rep = retrieval_report(Q, DB, Q_LABELS, DB_LABELS, map_k=3, ks=[3])
    assert rep["map"] == pytest.approx((7 / 12 + 1 / 3) / 2)
    assert rep["queries_without_relevant"] == 0


@pytest.mark.parametrize("bits", [8, 16, 32])
@pytest.mark.parametrize("k", [1, 50, 400])
def test_map_matches_official_loop(bits: int, k: int):
    rng = np.random.default_rng(bits * 1000 + k)
    q = rng.choice([-1, 1], size=(60, bits))
    db = rng.choice([-1, 1], size=(400, bits))
    ql = (rng.random((60, 6)) < 0.2).astype(np.int64)
    dbl = (rng.random((400, 6)) < 0.2).astype(np.int64)
    assert map_at_k(q, db, ql, dbl, k) == pytest.approx(official_top_map(q, db, ql, dbl, k), abs=1e-12)
    # torch inputs give the same value
    assert map_at_k(torch.from_numpy(q).float(), torch.from_numpy(db), torch.from_numpy(ql), dbl, k) == (
        pytest.approx(map_at_k(q, db, ql, dbl, k), abs=1e-15)
    )


def test_cosine_measure_for_float_embeddings():
    x = np.eye(4, dtype=np.float32) + 0.01
    assert map_at_k(x, x, np.arange(4), np.arange(4), 50, measure="cosine") == pytest.approx(1.0)
    assert recall_at_k(x, x[::-1].copy(), np.arange(4), np.arange(4)[::-1].copy(), 1, measure="cosine") == {
        1: 1.0
    }


def test_pr_curve_hand_values(tmp_path):
    curve = precision_recall_curve(Q[:1], DB, Q_LABELS[:1], DB_LABELS)
    # q0 radius 0: {d1, d4} 1 relevant; radius 1: + {d0, d3}: 2 of 4; radius 2: all 5, 3 relevant.
    np.testing.assert_allclose(curve.precision, [1 / 2, 1 / 2, 3 / 5, 3 / 5, 3 / 5])
    np.testing.assert_allclose(curve.recall, [1 / 3, 2 / 3, 1, 1, 1])
    both = precision_recall_curve(Q, DB, Q_LABELS, DB_LABELS)
    # q1 retrieves nothing within radius 0 and 1: precision there averages q0 only.
    assert both.precision[0] == pytest.approx(1 / 2)
    assert both.precision[2] == pytest.approx((3 / 5 + 0 / 1) / 2)
    assert both.recall[4] == pytest.approx(1.0)
    plot_pr_curves({"I->T": both}, tmp_path / "pr.png")
    assert (tmp_path / "pr.png").stat().st_size > 1000


def test_query_blocks_give_the_unblocked_results(monkeypatch):
    """Queries are ranked in blocks of ``_BLOCK_ELEMENTS // Ndb``: five blocks (7, 7, 7, 7, 2 queries) give
    the one-block mAP, precision / recall@k and PR curve (every block counts, the last one included)."""
    from patchword.hashing import metrics

    rng = np.random.default_rng(7)
    q = rng.choice([-1, 1], size=(30, 16))
    db = rng.choice([-1, 1], size=(200, 16))
    ql = (rng.random((30, 5)) < 0.25).astype(np.int64)
    ql[np.arange(30), rng.integers(0, 5, 30)] = 1
    ql[:3] = 0  # queries without a relevant item: they count as 0 in mAP, are left out of recall
    dbl = (rng.random((200, 5)) < 0.25).astype(np.int64)

    def everything():
        return (
            map_at_k(q, db, ql, dbl, 20, return_per_query=True),
            map_at_all(q, db, ql, dbl),
            retrieval_report(q, db, ql, dbl, map_k=50, ks=[1, 5, 50]),
            precision_recall_curve(q, db, ql, dbl),
        )

    (want_map, want_ap), want_all, want_report, want_curve = everything()
    calls = []
    relevance = metrics._relevance
    monkeypatch.setattr(metrics, "_relevance", lambda *a: calls.append(len(a[0])) or relevance(*a))
    monkeypatch.setattr(metrics, "_BLOCK_ELEMENTS", 200 * 7)
    (got_map, got_ap), got_all, got_report, got_curve = everything()
    assert calls == [7, 7, 7, 7, 2] * 4  # the blocks of each of the four calls
    assert got_map == want_map and got_all == want_all and got_report == want_report
    np.testing.assert_array_equal(got_ap, want_ap)
    assert want_report["queries_without_relevant"] == 3
    np.testing.assert_allclose(got_curve.precision, want_curve.precision, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_curve.recall, want_curve.recall, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got_curve.radius, want_curve.radius)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q_codes": np.array([[1, 0, 1, 1]])}, "only -1 and \\+1"),
        ({"q_codes": np.ones((2, 3))}, "bits"),
        ({"q_labels": np.ones((3, 3))}, "one row per code"),
        ({"q_labels": np.array([0, 1])}, "must both be ids"),
        ({"k": 0}, "k must be"),
    ],
)
def test_validation_errors(kwargs, match):
    args = {"q_codes": Q, "db_codes": DB, "q_labels": Q_LABELS, "db_labels": DB_LABELS, "k": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        map_at_k(**args)
