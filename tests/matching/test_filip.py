"""FILIP's token-wise similarity against a pair-by-pair reference, and its chunking."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from patchword.matching import build_matcher


def _reference(img, cap, lens, has_cls=True, global_weight=0.5):
    """Pair by pair: mean over patches of the best word, mean over words of the best patch, averaged;
    plus the global cosine (CLS, mean of the valid words)."""
    out = torch.zeros(img.shape[0], cap.shape[0], dtype=torch.float64)
    for i in range(img.shape[0]):
        patches = F.normalize(img[i, int(has_cls) :], dim=-1)
        for j in range(cap.shape[0]):
            words = F.normalize(cap[j, : lens[j]], dim=-1)
            cos = patches @ words.T  # (N, L)
            token = (cos.max(1).values.mean() + cos.max(0).values.mean()) / 2
            glob = F.cosine_similarity(img[i, 0], cap[j, : lens[j]].mean(0), dim=0)
            out[i, j] = global_weight * glob + (1 - global_weight) * token
    return out


def test_scores_equal_the_pair_by_pair_definition_in_any_chunking():
    g = torch.Generator().manual_seed(0)
    img = torch.randn(4, 1 + 9, 8, generator=g, dtype=torch.float64)
    cap = torch.randn(5, 6, 8, generator=g, dtype=torch.float64)
    lens = torch.tensor([6, 3, 4, 2, 5])
    want = _reference(img, cap, lens)
    for max_pair in (2**26, 1):  # all captions at once, one caption per block
        m = build_matcher("filip", embed_dim=8, num_patches=9, has_cls=True, max_pair_elements=max_pair)
        got = m.double()(img, cap, lens).sims
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    token_only = build_matcher("filip", embed_dim=8, num_patches=9, has_cls=True, global_weight=0.0).double()
    torch.testing.assert_close(token_only(img, cap, lens).sims, _reference(img, cap, lens, global_weight=0.0))


def test_a_word_that_matches_one_patch_finds_it():
    """The token-wise term rewards a caption word whose patch is present: the image that shows it wins."""
    c = 8
    word = F.normalize(torch.randn(c, generator=torch.Generator().manual_seed(1), dtype=torch.float64), dim=0)
    img = torch.randn(2, 1 + 4, c, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.1
    img[0, 3] = word  # image 0 has a patch showing the word
    cap = word.expand(1, 3, c).clone()
    m = build_matcher("filip", embed_dim=c, num_patches=4, has_cls=True, global_weight=0.0).double()
    sims = m(img, cap, torch.tensor([3])).sims
    assert sims[0, 0] > sims[1, 0] and float(sims[0, 0]) > 0.5
