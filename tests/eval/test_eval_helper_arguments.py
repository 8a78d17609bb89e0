"""The public eval helpers beside the full score matrix: the model's mode and the arguments they take.

``encode_image_tokens``, ``encode_text_tokens`` and ``global_embeddings`` run the model in eval mode and
restore its mode (as the full score matrix does; dropout left on made encoding the same text twice differ),
take lengths as a sequence too, and ``two_stage_scores`` refuses a malformed ``k``, budget or device by name.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from patchword.eval import (
    GlobalIndex,
    encode_image_tokens,
    encode_text_tokens,
    global_embeddings,
    two_stage_scores,
)
from patchword.matching import build_matcher
from patchword.matching.vse import VSEConfig, VSEMatcher

pytestmark = pytest.mark.usefixtures("one_thread")

C = 16


class _DropoutModel(nn.Module):
    """A model whose encoders apply dropout (as BERT's does in training mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, C)
        self.proj = nn.Linear(3, C)
        self.drop = nn.Dropout(0.5)

    def encode_texts(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(ids))

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(pixels.flatten(2).transpose(1, 2)))


class _Images:
    """An image set as the encoders read it (``batch(indices, train=False)``)."""

    def __init__(self, pixels: torch.Tensor) -> None:
        self.pixels = pixels

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def batch(self, indices: torch.Tensor, train: bool) -> torch.Tensor:
        return self.pixels[indices]


def _text_batch():
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, 50, (5, 7), generator=g), torch.tensor([7, 3, 5, 2, 6])


@pytest.mark.parametrize("training", [True, False])
def test_encode_text_tokens_runs_in_eval_mode_and_restores_the_mode(training):
    torch.manual_seed(0)
    model = _DropoutModel().train(training)
    ids, lens = _text_batch()
    first = encode_text_tokens(model, ids, lens)
    second = encode_text_tokens(model, ids, lens)
    assert torch.equal(first, second)  # no dropout: the same tokens every time
    model.eval()
    want = encode_text_tokens(model, ids, lens)
    assert torch.equal(first, want)
    model.train(training)
    encode_text_tokens(model, ids, lens)
    assert model.training is training and model.drop.training is training


def test_encode_image_tokens_runs_in_eval_mode_and_restores_the_mode():
    torch.manual_seed(0)
    model = _DropoutModel().train()
    images = _Images(torch.rand(4, 3, 2, 2))
    first = encode_image_tokens(model, images, batch_size=3)
    assert torch.equal(first, encode_image_tokens(model, images, batch_size=3))
    assert model.training and model.drop.training
    with torch.no_grad():
        want = model.eval().encode_images(images.pixels)
    # one batch of 4 against batches of 3 and 1: the products round alike on some CPUs only (Intel's
    # kernels block them by batch size); dropout would change them by far more
    torch.testing.assert_close(first, want, rtol=0, atol=1e-6)


def test_encode_image_tokens_takes_the_images_as_one_tensor():
    """A tensor of the encoder's inputs is encoded as the image set holding it is (docs: "a tensor or an
    image set"); anything else, or a batch size that is not a positive int, is refused by name."""
    torch.manual_seed(0)
    model = _DropoutModel().eval()
    pixels = torch.rand(5, 3, 2, 2)
    got = encode_image_tokens(model, pixels, batch_size=2)
    assert torch.equal(got, encode_image_tokens(model, _Images(pixels), batch_size=2))
    with torch.no_grad():  # batches of 2 against one of 5: equal up to the CPU's rounding (see above)
        torch.testing.assert_close(got, model.encode_images(pixels), rtol=0, atol=1e-6)
    with pytest.raises(TypeError, match="images must be a tensor"):
        encode_image_tokens(model, pixels.tolist())
    with pytest.raises(ValueError, match="batch_size"):
        encode_image_tokens(model, pixels, batch_size=0)


def test_encode_text_tokens_takes_lengths_as_a_sequence():
    model = _DropoutModel().eval()
    ids, lens = _text_batch()
    assert torch.equal(encode_text_tokens(model, ids, lens.tolist()), encode_text_tokens(model, ids, lens))
    with pytest.raises(ValueError, match="lens"):
        encode_text_tokens(model, ids, [7, 3])


class _ModeRecordingVSE(VSEMatcher):
    """VSE whose global embeddings record the mode they were computed in."""

    modes: list[bool]

    def global_image(self, img_tokens):
        self.modes.append(self.training)
        return super().global_image(img_tokens)

    def global_text(self, cap_tokens, cap_lens):
        self.modes.append(self.training)
        return super().global_text(cap_tokens, cap_lens)


def _split(n_img=3, n_txt=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, 5, C, generator=g)
    cap = torch.randn(n_txt, 6, C, generator=g)
    return img, cap, torch.tensor([6, 3, 4, 2, 5, 1][:n_txt])


def test_global_embeddings_run_in_eval_mode_and_restore_the_mode():
    m = _ModeRecordingVSE(VSEConfig(embed_dim=C)).train()
    m.modes = []
    img, cap, lens = _split()
    global_embeddings(m, img, cap, lens)
    assert m.modes and not any(m.modes)
    assert m.training
    m.modes = []
    two_stage_scores(m, img, cap, lens, k=2)  # its first stage as well
    assert m.modes and not any(m.modes)
    assert m.training


def test_global_embeddings_take_lengths_as_a_sequence():
    m = build_matcher("vse", embed_dim=C).eval()
    img, cap, lens = _split()
    want = global_embeddings(m, img, cap, lens)
    got = global_embeddings(m, img, cap, lens.tolist())
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="cap_lens"):
        global_embeddings(m, img, cap, [6, 3])


@pytest.mark.parametrize("k", [5.0, (3,), (3, 2, 1), (3, 0), 0, -1, True, "3", (2.0, 2), None])
def test_two_stage_scores_refuses_a_malformed_k(k):
    m = build_matcher("vse", embed_dim=C).eval()
    with pytest.raises(ValueError, match="^k must be a positive int or a pair"):
        two_stage_scores(m, *_split(), k=k)


def test_two_stage_scores_takes_k_as_one_int_or_a_pair():
    m = build_matcher("vse", embed_dim=C).eval()
    one = two_stage_scores(m, *_split(), k=2)
    pair = two_stage_scores(m, *_split(), k=[2, 2])
    assert torch.equal(one.sims_i2t, pair.sims_i2t) and torch.equal(one.sims_t2i, pair.sims_t2i)
    assert one.i2t_candidates.shape == (3, 2) and one.t2i_candidates.shape == (4, 2)
    both = two_stage_scores(m, *_split(), k=(3, 1))
    assert both.i2t_candidates.shape == (3, 3) and both.t2i_candidates.shape == (4, 1)


@pytest.mark.parametrize("budget", [math.nan, math.inf, -1.0, 0])
def test_two_stage_scores_refuses_a_budget_that_is_not_positive_and_finite(budget):
    m = build_matcher("vse", embed_dim=C).eval()
    with pytest.raises(ValueError, match="^max_memory_mb must be a positive"):
        two_stage_scores(m, *_split(), k=2, max_memory_mb=budget)
    with pytest.raises(ValueError, match="^max_memory_mb must be a positive"):
        global_embeddings(m, *_split(), max_memory_mb=budget)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("fn", [two_stage_scores, global_embeddings])
def test_an_unavailable_device_is_a_value_error_naming_device(fn):
    m = build_matcher("vse", embed_dim=C).eval()
    with pytest.raises(ValueError, match="^device: cuda requested but CUDA is not available"):
        fn(m, *_split(), device="cuda")
    with pytest.raises(ValueError, match="^device: not a torch device: 'gpu'"):
        fn(m, *_split(), device="gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_the_encoders_refuse_an_unavailable_device_by_name():
    model = _DropoutModel()
    ids, lens = _text_batch()
    with pytest.raises(ValueError, match="^device: cuda requested"):
        encode_text_tokens(model, ids, lens, device="cuda")
    with pytest.raises(ValueError, match="^device: cuda requested"):
        encode_image_tokens(model, _Images(torch.rand(2, 3, 2, 2)), device="cuda")


def test_the_exact_index_ranks_in_float32_under_autocast():
    """The shortlist is a top-k: a caller's bfloat16 autocast must not round its scores (near-equal
    candidates would swap)."""
    g = torch.Generator().manual_seed(0)
    db = torch.nn.functional.normalize(torch.randn(200, C, generator=g), dim=-1)
    queries = torch.nn.functional.normalize(torch.randn(7, C, generator=g), dim=-1)
    index = GlobalIndex(db)
    want = index.search(queries, 20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = index.search(queries, 20)
    assert got[0].dtype == torch.float32
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
