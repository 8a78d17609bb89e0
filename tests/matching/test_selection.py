"""Patch-selection quality: object patch masks from the scene geometry, the metrics, and a model's run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import tiny_model
from patchword.data.pipeline import ArrayImages, encode_split
from patchword.data.synthetic import (
    COLOURS,
    SyntheticConfig,
    generate_split,
    object_label_map,
    object_patch_masks,
    split_layout,
    split_object_patches,
)
from patchword.data.tokenizers import WordVocab
from patchword.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from patchword.eval.selection import SelectionCounts, evaluate_selection, selection_metrics
from patchword.matching import MatcherOutput

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the metrics on hand-made masks -------------------------------------------------------------------------


def test_selection_metrics_by_hand():
    """Two pairs, 8 patches each. Objects: pair 0 patches {0, 1, 2}, pair 1 patches {5, 6}.

    Branch "caption" keeps {0, 1, 3, 4} and {5, 6, 7, 0}: object patches kept 2 + 2 = 4 of 5 (80 %), kept
    8 of 16 patches (50 %), lift 1.6. Branch "dense" keeps {3, 4, 5, 6} and {1, 2, 3, 4}: 0 + 0 of 5.
    """
    objects = torch.zeros(2, 8, dtype=torch.bool)
    objects[0, [0, 1, 2]] = True
    objects[1, [5, 6]] = True
    caption = torch.zeros(2, 8)
    caption[0, [0, 1, 3, 4]] = 1.0
    caption[1, [5, 6, 7, 0]] = 1.0
    dense = torch.zeros(2, 8, dtype=torch.bool)
    dense[0, [3, 4, 5, 6]] = True
    dense[1, [1, 2, 3, 4]] = True
    got = selection_metrics([caption, dense], objects)
    assert got["caption"] == pytest.approx(
        {"selection_object_recall": 80.0, "selection_chance": 50.0, "selection_lift": 1.6}
    )
    assert got["dense"]["selection_object_recall"] == 0.0 and got["dense"]["selection_chance"] == 50.0


def test_selection_metrics_broadcast_image_masks_over_captions():
    """(B_v, B_t, N) decisions against (B_v, 1, N) image masks equal the same pairs listed one by one."""
    gen = torch.Generator().manual_seed(0)
    decisions = torch.rand(3, 4, 10, generator=gen) > 0.5
    masks = torch.rand(3, 1, 10, generator=gen) > 0.6
    broadcast = selection_metrics([decisions], masks, names=["b"])
    flat = selection_metrics([decisions.reshape(12, 10)], masks.expand(3, 4, 10).reshape(12, 10), names=["b"])
    assert broadcast == flat
    counts = SelectionCounts()
    for v in range(3):  # accumulated block by block: the same pooled shares
        counts.add(decisions[v], masks[v])
    assert counts.metrics() == pytest.approx(broadcast["b"])
    with pytest.raises(ValueError, match="no object patches"):
        selection_metrics([decisions], torch.zeros(3, 1, 10, dtype=torch.bool))


# -- geometry against the rendered pixels ------------------------------------------------------------------


@pytest.mark.parametrize("image_size, grid", [(64, 8), (32, 4), (48, 6)])
def test_object_masks_match_the_rendered_pixels(image_size, grid):
    cfg = SyntheticConfig(seed=4, image_size=image_size, num_train=2, num_dev=2, num_test=60)
    split = generate_split(cfg, "test")
    labels = object_label_map(split.scenes, cfg, split_layout(cfg, "test", split.scenes))
    # Object pixels are the ones that differ from the background (mild noise aside), exactly.
    off_background = np.abs(split.images.astype(int) - np.array(cfg.background)).max(-1) > 40
    assert np.array_equal(labels >= 0, off_background)
    # ... and each has its object's colour.
    n, y, x = np.nonzero(labels >= 0)
    palette = np.array([COLOURS[c] for c in cfg.colours])
    expected = palette[split.scenes.colour[n, labels[n, y, x]]]
    assert np.abs(split.images[n, y, x].astype(int) - expected).max() <= 15
    # Patch level: a patch is masked iff one of its pixels is off the background.
    masks = split_object_patches(split.scenes, cfg, "test", grid)
    assert np.array_equal(masks, object_patch_masks(labels, grid))
    side = image_size // grid
    has_object = (
        off_background.reshape(len(labels), grid, side, grid, side).any((2, 4)).reshape(len(labels), -1)
    )
    assert np.array_equal(masks.any(1), has_object)
    # per object: the patches holding pixels of that object's cell
    for cell in range(9):
        own = (
            (labels == cell).reshape(len(labels), grid, side, grid, side).any((2, 4)).reshape(len(labels), -1)
        )
        assert np.array_equal(masks[:, cell], own)
    empty = split.scenes.shape < 0
    assert not masks[empty].any() and masks[~empty].any(-1).all()


# -- a model's selection on its ground-truth pairs ---------------------------------------------------------

CFG = SyntheticConfig(seed=2, image_size=32, num_train=2, num_dev=2, num_test=20)


@pytest.fixture(scope="module")
def data():
    split = generate_split(CFG, "test")
    vocab = WordVocab.build(split.captions + split.dense_captions)
    encoded = encode_split(
        split.to_retrieval_split(),
        vocab,
        ArrayImages(split.images),
        max_caption_len=40,
        max_dense_len=160,
        use_dense=True,
    )
    return split, vocab, encoded


@pytest.mark.parametrize(
    "model_args",
    [
        dict(matcher="seps", variant="paper"),  # image-tied dense branch: (B_v, 1, N) decisions
        dict(matcher="seps", variant="code", dense_pairing="caption"),  # two (B_v, B_t, N) branches
        dict(matcher="laps", variant="code"),
    ],
)
def test_evaluate_selection_equals_the_ground_truth_pairs_of_a_full_forward(data, model_args):
    split, vocab, encoded = data
    model = tiny_model(vocab, **model_args)
    masks = split_object_patches(split.scenes, CFG, "test", grid=4).any(1)
    got = evaluate_selection(model, encoded, masks, image_block=3)
    # reference: every image against every caption in one forward, then the diagonal (own) pairs
    with torch.no_grad():
        images = encoded.images.batch(torch.arange(encoded.num_images), train=False)
        pairing = model.matcher.config.dense_pairing
        dense_rows = encoded.txt2img if pairing == "caption" else torch.arange(encoded.num_images)
        out = model(
            images,
            encoded.cap_ids,
            encoded.cap_lens,
            encoded.dense_ids[dense_rows],
            encoded.dense_lens[dense_rows],
        )
    own = encoded.txt2img
    decisions = [d[own, torch.arange(len(own))] if d.shape[1] > 1 else d[own, 0] for d in out.decisions]
    expected = selection_metrics(decisions, torch.as_tensor(masks)[own])
    assert got.keys() == expected.keys() and len(got) == len(out.decisions)
    for name in expected:
        assert got[name] == pytest.approx(expected[name]), name
    k = model.matcher.config.num_keep
    assert got["caption"]["selection_chance"] == pytest.approx(100.0 * k / 16)


class _KeepMarkedPatches(nn.Module):
    """Keeps the patches whose token is 1, for every caption."""

    consumes_dense = False
    dense_pairing = "image"
    selection_branches = ("caption",)

    def forward(self, img, cap, cap_lens, dense=None, dense_lens=None):
        keep = img[..., 0][:, None, :].expand(-1, cap.shape[0], -1)
        return MatcherOutput(sims=torch.zeros(img.shape[0], cap.shape[0]), decisions=[keep])


class _PixelSelector(nn.Module):
    """Keeps exactly the patches that hold a pixel off the background: a perfect object finder."""

    def __init__(self, background, grid: int) -> None:
        super().__init__()
        bg = (torch.tensor(background) / 255.0 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
        self.register_buffer("background", bg.view(1, 3, 1, 1))
        self.grid = grid
        self.matcher = _KeepMarkedPatches()

    def encode_images(self, images):  # (B, 3, H, W) -> (B, N, 1): 1 where the patch is off-background
        off = ((images - self.background).abs().amax(1) > 0.5).float()
        side = images.shape[-1] // self.grid
        return off.view(len(images), self.grid, side, self.grid, side).amax((2, 4)).view(len(images), -1, 1)

    def encode_texts(self, ids, lens):
        return torch.zeros(ids.shape[0], ids.shape[1], 1)


def test_a_perfect_object_finder_recalls_every_object_patch(data):
    split, _, encoded = data
    masks = split_object_patches(split.scenes, CFG, "test", grid=4).any(1)
    got = evaluate_selection(_PixelSelector(CFG.background, 4), encoded, masks, image_block=7)
    assert got["caption"]["selection_object_recall"] == pytest.approx(100.0)
    # it keeps exactly the object patches: chance is their share of all patches, pooled over the pairs
    per_caption = masks[encoded.txt2img.numpy()]
    assert got["caption"]["selection_chance"] == pytest.approx(100.0 * per_caption.mean())
    with pytest.raises(ValueError, match="patches but object_masks has"):
        evaluate_selection(_PixelSelector(CFG.background, 4), encoded, np.zeros((20, 9), bool))
