"""Edges of the matcher contract every registered matcher keeps: a batch of no captions scores to (B_v, 0)
with the decisions and extras any other batch gets (as a batch of no images does), ``embed_dim < 1`` is
refused when the matcher is built, and a token-level matcher refuses image tokens that are a CLS alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from matcher_support import BUILTIN_MATCHERS
from patchword.matching import build_matcher, matcher_config_class

DIM, N_PATCHES, L_TXT = 32, 16, 9
N_IMG, N_TXT = 3, 5  # sizes no other axis has: an axis of N_TXT is the caption axis


def _takes_cls(name: str) -> bool:
    return "has_cls" in {f.name for f in dataclasses.fields(matcher_config_class(name))}


# Every registered matcher with its defaults, and the options that change what a caption block computes.
CASES = [(name, {}) for name in BUILTIN_MATCHERS] + [
    ("seps", {"dense_pairing": "caption"}),
    ("seps", {"variant": "paper"}),
    ("seps", {"variant": "paper", "dense_pairing": "caption"}),
    ("seps", {"caption_chunk": 2}),
    ("scan", {"direction": "i2t"}),
    ("scan", {"agg": "max"}),
    ("tgdt", {"inference": "global"}),
    ("tgdt", {"inference": "local"}),
]


def _forward(matcher, n_img: int, n_txt: int):
    g = torch.Generator().manual_seed(0)
    img = torch.randn(n_img, N_PATCHES + int(matcher.has_cls), DIM, generator=g)
    caps = torch.randn(n_txt, L_TXT, DIM, generator=g)
    lens = torch.tensor([9, 5, 7, 3, 9][:n_txt])
    n_dense = n_txt if matcher.dense_pairing == "caption" else n_img
    dense = torch.randn(n_dense, 12, DIM, generator=g)
    dense_lens = torch.tensor([12, 8, 10, 6, 5][:n_dense])
    return matcher(img, caps, lens, dense, dense_lens)


def _no_captions(shape: torch.Size) -> tuple[int, ...]:
    return tuple(0 if size == N_TXT else size for size in shape)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}{o or ''}" for n, o in CASES])
def test_no_captions_score_to_an_empty_column_block_with_every_output(name, options, training):
    """Old code: SEPS / LAPS "range() arg 3 must not be zero", SCAN / NAAF / TGDT / FILIP "torch.cat():
    expected a non-empty list"; VSE / CLIP already returned (B_v, 0)."""
    torch.manual_seed(0)
    matcher = build_matcher(name, embed_dim=DIM, num_patches=N_PATCHES, has_cls=_takes_cls(name), **options)
    matcher.train(training)
    full = _forward(matcher, N_IMG, N_TXT)
    empty = _forward(matcher, N_IMG, 0)
    assert empty.sims.shape == (N_IMG, 0) and empty.sims.dtype == full.sims.dtype == torch.float32
    assert [tuple(d.shape) for d in empty.decisions] == [_no_captions(d.shape) for d in full.decisions]
    assert {k: tuple(v.shape) for k, v in empty.extras.items()} == {
        k: _no_captions(v.shape) for k, v in full.extras.items()
    }
    if empty.sims.requires_grad:  # a training step's loss over no captions backpropagates
        empty.sims.sum().backward()
    assert _forward(matcher, 0, 0).sims.shape == (0, 0)
    assert _forward(matcher, 0, N_TXT).sims.shape == (0, N_TXT)


@pytest.mark.parametrize("name", BUILTIN_MATCHERS)
@pytest.mark.parametrize("embed_dim", [0, -3])
def test_every_matcher_refuses_a_width_below_one(name, embed_dim):
    """Old code: VSE, CLIP, SCAN, NAAF, TGDT and FILIP were built with embed_dim=0 (only SEPS refused)."""
    with pytest.raises(ValueError, match=rf"^embed_dim must be a positive int, got {embed_dim}$"):
        build_matcher(name, embed_dim=embed_dim)


def test_filip_refuses_a_cls_token_without_patches():
    """Old code: IndexError "amax(): Expected reduction dim 2 to have non-zero size"."""
    matcher = build_matcher("filip", embed_dim=8, has_cls=True).eval()
    with pytest.raises(
        ValueError,
        match=r"^img_tokens has 1 tokens per image, the matcher needs the CLS \(global slot\) and at least "
        r"one patch or region \(shape \(2, 1, 8\)\)$",
    ):
        matcher(torch.randn(2, 1, 8), torch.randn(3, 4, 8), [4, 4, 4])
    tgdt = build_matcher("tgdt", embed_dim=8, has_cls=True).eval()
    with pytest.raises(ValueError, match="the matcher needs the CLS .global slot. and at least one patch"):
        tgdt(torch.randn(2, 1, 8), torch.randn(3, 4, 8), [4, 4, 4])


def test_a_global_matcher_still_scores_a_cls_token_alone():
    """VSE pools the CLS: one token per image is all it reads (no patch needed); none at all is refused."""
    vse = build_matcher("vse", embed_dim=8, has_cls=True).eval()
    img, caps = torch.randn(2, 1, 8), torch.randn(3, 4, 8)
    assert vse(img, caps, [4, 4, 4]).sims.shape == (2, 3)
    with pytest.raises(ValueError, match=r"^img_tokens has 0 tokens per image, the matcher needs one token"):
        vse(torch.randn(2, 0, 8), caps, [4, 4, 4])
