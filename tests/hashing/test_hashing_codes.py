"""Binary codes: packed popcount distances equal the float formula, exact top-k with the stable tie
rule, index persistence, the optional FAISS backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from patchword.hashing import (
    HammingIndex,
    binarize,
    cosine_topk,
    hamming_distance,
    hamming_distance_packed,
    hamming_topk,
    pack_codes,
    unpack_codes,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def random_codes(n: int, bits: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(np.array([-1, 1], dtype=np.int8), size=(n, bits))


@pytest.mark.parametrize("bits", [1, 8, 12, 16, 24, 32, 64, 100, 128])
def test_packed_distance_equals_float_formula(bits: int):
    q, db = random_codes(23, bits, bits), random_codes(71, bits, bits + 1)
    want = (bits - q.astype(np.int64) @ db.T.astype(np.int64)) // 2  # (K - q.b) / 2
    np.testing.assert_array_equal(hamming_distance_packed(pack_codes(q), pack_codes(db)), want)
    np.testing.assert_array_equal(hamming_distance(q, db).numpy(), want)
    np.testing.assert_array_equal(unpack_codes(pack_codes(q), bits), q)


def test_pack_layout_and_hand_distance():
    codes = np.array([[1, -1, -1, -1, -1, -1, -1, 1, 1, 1], [-1] * 10])
    packed = pack_codes(codes)
    np.testing.assert_array_equal(packed, [[0b10000001, 0b11000000], [0, 0]])
    assert hamming_distance_packed(packed[:1], packed[1:]).tolist() == [[4]]


@pytest.mark.parametrize("bits", [16, 64, 128])
def test_topk_is_stable_order(bits: int):
    q, db = random_codes(40, bits, 3), random_codes(3000, bits, 4)
    db[1000:1100] = db[5]  # many exact ties
    dist = hamming_distance(q, db).numpy()
    want = np.argsort(dist, axis=1, kind="stable")[:, :25]
    d, i = hamming_topk(pack_codes(q), pack_codes(db), 25, block_elements=3000 * 7)  # several blocks
    np.testing.assert_array_equal(i, want)
    np.testing.assert_array_equal(d, np.take_along_axis(dist, want, axis=1))


def test_topk_ties_by_database_position():
    db = np.array([[1, 1], [-1, -1], [1, 1], [1, -1], [1, 1]])
    d, i = hamming_topk(pack_codes(np.array([[1, 1]])), pack_codes(db), 4)
    assert i.tolist() == [[0, 2, 4, 3]] and d.tolist() == [[0, 0, 0, 1]]
    d, i = hamming_topk(pack_codes(np.array([[1, 1]])), pack_codes(db), 10)  # k > N is clipped
    assert i.tolist() == [[0, 2, 4, 3, 1]]


def test_binarize_maps_zero_to_plus_one():
    assert binarize(torch.tensor([[-0.5, 0.0, 0.2]])).tolist() == [[-1.0, 1.0, 1.0]]


def test_index_search_save_load(tmp_path):
    db, q = random_codes(500, 32, 1), random_codes(7, 32, 2)
    index = HammingIndex(32)
    index.add(db[:200])
    index.add(pack_codes(db[200:]))  # packed input too
    assert index.ntotal == 500 and index.nbytes == 500 * 4
    d, i = index.search(q, 5)
    np.testing.assert_array_equal(
        i, np.argsort(hamming_distance(q, db).numpy(), axis=1, kind="stable")[:, :5]
    )
    index.save(tmp_path / "idx.npz")
    d2, i2 = HammingIndex.load(tmp_path / "idx.npz").search(q, 5)
    np.testing.assert_array_equal(i, i2)
    np.testing.assert_array_equal(d, d2)
    with pytest.raises(ValueError, match="\\(N, 32\\) codes"):
        index.add(random_codes(3, 16, 0))
    with pytest.raises(ValueError, match="empty"):
        HammingIndex(8).search(random_codes(1, 8, 0), 1)


def test_faiss_backend_same_distances():
    pytest.importorskip("faiss")
    db, q = random_codes(2000, 64, 5), random_codes(30, 64, 6)
    index = HammingIndex(64)
    index.add(db)
    fa = HammingIndex(64, backend="faiss")
    fa.add(db)
    d1, i1 = index.search(q, 10)
    d2, i2 = fa.search(q, 10)
    np.testing.assert_array_equal(d1, d2)
    full = hamming_distance(q, db).numpy()
    np.testing.assert_array_equal(np.take_along_axis(full, i2, axis=1), d2)  # faiss ties may differ


def test_cosine_topk_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    db = torch.nn.functional.normalize(torch.randn(300, 16, generator=gen), dim=1)
    q = torch.randn(9, 16, generator=gen)
    scores, idx = cosine_topk(q, db, 7, block_elements=300 * 4)
    brute = torch.nn.functional.normalize(q, dim=1) @ db.T
    torch.testing.assert_close(scores, brute.topk(7, dim=1).values)
    assert torch.equal(idx, brute.topk(7, dim=1).indices)
