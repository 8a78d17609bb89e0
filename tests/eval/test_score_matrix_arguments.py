"""``score_matrix`` names a device or a budget it cannot use (two_stage_scores already did), and the
``txt2img`` and ``alpha`` it and ``two_stage_scores`` take; the SEPS reference refuses what its matcher does.

Old code: ``score_matrix`` read ``txt2img`` with ``torch.as_tensor(txt2img).long()``, so float ids were
truncated (0.9 -> dense row 0) and a bool mask read as rows 0 and 1: under caption-tied dense pairing
captions were scored with another caption's dense text, without a word; under image-tied pairing it was not
looked at (a length or an id of 99 for 3 images went through). ``two_stage_scores(alpha=nan)`` returned NaN
scores, ``alpha="1"`` failed with a TypeError deep in the arithmetic. ``seps_reference_scores`` scored
lengths past the token axis as the shorter length, 20 image tokens of a 16-patch matcher as CLS + 19
patches, and failed on a length of 0 with an IndexError.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from patchword.eval import retrieval_metrics, score_matrix, two_stage_scores
from patchword.matching import build_matcher
from patchword.testing import seps_reference_scores

pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs():
    g = torch.Generator().manual_seed(0)
    m = build_matcher("vse", embed_dim=8).eval()
    return m, torch.randn(3, 5, 8, generator=g), torch.randn(4, 6, 8, generator=g), torch.tensor([6, 3, 2, 5])


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 0, -1.0])
def test_a_budget_that_is_not_positive_and_finite_is_named(budget):
    """Defect: ``max_memory_mb=nan`` was 'cannot convert float NaN to integer'."""
    m, img, cap, lens = _inputs()
    with pytest.raises(ValueError, match="max_memory_mb must be a positive finite number"):
        score_matrix(m, img, cap, lens, max_memory_mb=budget)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_named():
    """Defect: ``device="cuda"`` without CUDA was torch's bare AssertionError."""
    m, img, cap, lens = _inputs()
    with pytest.raises(ValueError, match="device"):
        score_matrix(m, img, cap, lens, device="cuda")
    with pytest.raises(ValueError, match="device: not a torch device"):
        score_matrix(m, img, cap, lens, device="gpu0")


def test_valid_arguments_score_as_before():
    m, img, cap, lens = _inputs()
    want = m(img, cap, lens).sims
    got = score_matrix(m, img, cap, lens, device="cpu", max_memory_mb=1)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


C = 16


def _seps_inputs(pairing: str):
    """A SEPS matcher with ``pairing`` dense text, 3 images of 16 patches + CLS, 4 captions, one dense row
    per image."""
    g = torch.Generator().manual_seed(0)
    m = build_matcher("seps", embed_dim=C, num_patches=16, has_cls=True, dense_pairing=pairing).eval()
    img, cap = torch.randn(3, 17, C, generator=g), torch.randn(4, 6, C, generator=g)
    dense = torch.randn(3, 8, C, generator=g)
    return m, img, cap, torch.tensor([6, 3, 2, 5]), dense, torch.tensor([8, 4, 5])


NOT_A_MAP = [
    (torch.tensor([0.0, 0.9, 1.2, 2.7]), "txt2img must hold integer indices, got dtype torch.float32"),
    (torch.tensor([True, False, True, True]), "txt2img must hold integer indices, got dtype torch.bool"),
    (np.array([0.0, 0.0, 1.0, 2.0]), "txt2img must hold integer indices, got dtype torch.float64"),
    (torch.tensor([0, 0, 1]), r"txt2img has size 3 on axis 0, expected 4"),
    (torch.tensor([[0, 0, 1, 2]]), "txt2img must have 1 dimensions"),
    (torch.tensor([0, -1, 1, 2]), r"txt2img has values in \[-1, 2\], negative"),
    (["a", "b", "c", "d"], "txt2img must be a 1-D integer tensor"),
]


@pytest.mark.parametrize("txt2img, message", NOT_A_MAP)
@pytest.mark.parametrize("pairing", ["caption", "image"])
def test_a_txt2img_that_is_not_a_caption_to_row_map_is_refused_by_name(pairing, txt2img, message):
    m, img, cap, lens, dense, dlens = _seps_inputs(pairing)
    if pairing == "caption" and "negative" in message:
        message = r"txt2img has values in \[-1, 2\], outside the 3 dense rows"
    with pytest.raises(ValueError, match=message):
        score_matrix(m, img, cap, lens, dense, dlens, txt2img=txt2img)
    with pytest.raises(ValueError, match=message):  # the same check: the re-ranker's inputs
        two_stage_scores(m, img, cap, lens, dense, dlens, txt2img=txt2img, k=2)


def test_the_caption_tied_map_is_checked_against_the_dense_rows_it_indexes():
    m, img, cap, lens, dense, dlens = _seps_inputs("caption")
    with pytest.raises(ValueError, match=r"txt2img has values in \[0, 3\], outside the 3 dense rows"):
        score_matrix(m, img, cap, lens, dense, dlens, txt2img=torch.tensor([0, 1, 2, 3]))
    # a block of images against the dense rows of other images (bench.gallery): rows, not images, bound it
    ids = torch.tensor([0, 2, 2, 1])
    block = score_matrix(m, img[1:], cap, lens, dense, dlens, txt2img=ids, engine="forward")
    assert torch.allclose(block, score_matrix(m, img, cap, lens, dense, dlens, txt2img=ids)[1:], atol=1e-5)


def test_integer_maps_of_any_kind_score_as_the_dense_rows_they_name():
    m, img, cap, lens, dense, dlens = _seps_inputs("caption")
    ids = [0, 0, 1, 2]
    want = m(img, cap, lens, dense[ids], dlens[ids]).sims
    for txt2img in (torch.tensor(ids), torch.tensor(ids, dtype=torch.int32), np.array(ids), ids):
        got = score_matrix(m, img, cap, lens, dense, dlens, txt2img=txt2img)
        assert (got - want).abs().max() <= 1e-5


def test_an_image_tied_block_of_images_keeps_the_splits_map():
    """Each process of a distributed evaluation scores its block of the images with the whole split's
    ``txt2img`` (``protocol._encode_shard``): ids past the block are no error where the map is not read."""
    m, img, cap, lens, dense, dlens = _seps_inputs("image")
    full = score_matrix(m, img, cap, lens, dense, dlens, txt2img=torch.tensor([0, 1, 2, 2]))
    block = score_matrix(m, img[:1], cap, lens, dense[:1], dlens[:1], txt2img=torch.tensor([0, 1, 2, 2]))
    assert torch.allclose(block, full[:1], atol=1e-5)


def test_metrics_refuse_the_same_maps_with_the_same_words():
    sims = torch.randn(3, 4)
    for txt2img, message in NOT_A_MAP[:4]:
        with pytest.raises(ValueError, match=message):
            retrieval_metrics(sims, txt2img)
    with pytest.raises(ValueError, match=r"txt2img has values in \[0, 3\], outside the 3 images of sims"):
        retrieval_metrics(sims, torch.tensor([0, 1, 2, 3]))


@pytest.mark.parametrize(
    "alpha", [float("nan"), float("inf"), -float("inf"), "1", None, True, torch.tensor(1.0)]
)
def test_two_stage_scores_refuses_an_alpha_that_is_not_a_finite_number(alpha):
    m, img, cap, lens, dense, dlens = _seps_inputs("image")
    with pytest.raises(ValueError, match="^alpha must be a finite number"):
        two_stage_scores(m, img, cap, lens, dense, dlens, k=2, alpha=alpha)


def test_two_stage_scores_takes_alpha_as_any_finite_real():
    m, img, cap, lens, dense, dlens = _seps_inputs("image")
    fine = two_stage_scores(m, img, cap, lens, dense, dlens, k=2, alpha=0)
    plain = two_stage_scores(m, img, cap, lens, dense, dlens, k=2, alpha=0.5)
    assert not torch.equal(plain.sims_i2t, fine.sims_i2t)
    for alpha in (np.float32(0.5), np.float64(0.5), 0.5):
        got = two_stage_scores(m, img, cap, lens, dense, dlens, k=2, alpha=alpha)
        assert torch.allclose(got.sims_i2t, plain.sims_i2t) and torch.allclose(got.sims_t2i, plain.sims_t2i)
    assert torch.isfinite(plain.sims_i2t[plain.sims_i2t > -float("inf")]).all()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lens": torch.tensor([6, 9, 2, 5])}, "cap_lens has a length 9 longer than the token axis"),
        ({"lens": torch.tensor([6, 0, 2, 5])}, "cap_lens has a length 0 below the minimum of 1"),
        ({"img": torch.randn(3, 20, C)}, "img_tokens has 20 tokens per image, the matcher expects 17"),
        ({"img": torch.randn(3, 17, C + 1)}, "img_tokens has size 17 on axis 2, expected 16"),
        ({"dlens": torch.tensor([8, 9, 5])}, "dense_lens has a length 9 longer than the token axis"),
        ({"dlens": None}, "dense_lens must be"),
        ({"dense": torch.randn(4, 8, C)}, "dense_tokens has size 4 on axis 0, expected 3"),
        ({"cap": torch.full((4, 6, C), float("nan"))}, "cap_tokens"),
    ],
)
def test_the_seps_reference_refuses_what_the_matcher_refuses(change, message):
    m, img, cap, lens, dense, dlens = _seps_inputs("image")
    args = {"img": img, "cap": cap, "lens": lens, "dense": dense, "dlens": dlens, **change}
    with pytest.raises(ValueError, match=message):
        m(*args.values())
    with pytest.raises(ValueError, match=message):
        seps_reference_scores(m, *args.values())


def test_the_seps_reference_checks_its_dense_index():
    m, img, cap, lens, dense, dlens = _seps_inputs("caption")
    with pytest.raises(ValueError, match="dense_index must hold integer indices"):
        seps_reference_scores(m, img, cap, lens, dense, dlens, dense_index=torch.tensor([0.0, 0.9, 1.2, 2.7]))
    with pytest.raises(ValueError, match=r"dense_index has values in \[0, 3\], outside the 3 dense rows"):
        seps_reference_scores(m, img, cap, lens, dense, dlens, dense_index=torch.tensor([0, 1, 2, 3]))
    ids = torch.tensor([0, 0, 1, 2])
    want = m(img, cap, lens, dense[ids], dlens[ids]).sims
    assert (
        seps_reference_scores(m, img, cap, lens, dense, dlens, dense_index=ids) - want
    ).abs().max() <= 1e-5
