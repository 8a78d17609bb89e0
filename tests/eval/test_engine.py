"""score_matrix: the fast engines equal the matchers' own forward pass, in bounded memory."""

from __future__ import annotations

import pytest
import torch

from matcher_support import ENGINE_DIM as DIM
from matcher_support import engine_inputs as _inputs
from matcher_support import engine_matcher as _matcher
from patchword.eval import score_matrix
from patchword.eval.engine import (
    ForwardEngine,
    ScoringEngine,
    SEPSEngine,
    TensorMemoryMeter,
    VSEEngine,
    engine_for,
)
from patchword.eval.engine.core import prepare_inputs
from patchword.matching import Matcher, MatcherOutput, build_matcher


def _forward(m, img, caps, lens, dense=None, dense_lens=None, txt2img=None):
    """The ground truth: the matcher's eval-mode forward on all pairs at once."""
    with torch.no_grad():
        if dense is not None and m.config.dense_pairing == "caption":
            dense, dense_lens = dense[txt2img], dense_lens[txt2img]
        return m(img, caps, lens, dense, dense_lens).sims


def _check(m, kind, dense, engine=None, **inputs_kw):
    img, caps, lens, d, dl, t2i = _inputs(kind, **inputs_kw)
    args = (d, dl) if dense else (None, None)
    want = _forward(m, img, caps, lens, *args, txt2img=t2i)
    got = score_matrix(m, img, caps, lens, *args, txt2img=t2i, engine=engine)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max().item() <= 1e-5
    return got


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("dense", [None, "image", "caption"])
@pytest.mark.parametrize("formulation", ["gram", "direct", "kdirect"])
def test_seps_engine_equals_forward(kind, variant, dense, formulation):
    m = _matcher(kind, variant, dense_pairing=dense or "image")
    _check(m, kind, dense, engine=SEPSEngine(m, formulation=formulation))


@pytest.mark.parametrize("variant", ["code", "paper"])
def test_uncached_texts_and_inline_dense_scores_give_the_same(variant):
    m = _matcher("swin", variant, dense_pairing="caption")
    engine = SEPSEngine(m, text_cache=False, dense_pass=False, max_image_block=2)
    _check(m, "swin", "caption", engine=engine, n_img=5, n_txt=11)
    assert not engine.last_plan.details["text_cache"] and not engine.last_plan.details["dense_pass"]


@pytest.mark.parametrize("dense", [None, "caption"])
def test_cpu_workers_score_every_image_block_into_its_rows(dense):
    """``workers=3`` on the CPU: blocks of two images go to three single-threaded threads (a shared
    queue); every block lands in its own rows, bit for bit what one worker writes (the module pins one
    torch thread, so both compute each block alike)."""
    m = _matcher("swin", "paper", dense_pairing=dense or "image")
    engine = SEPSEngine(m, workers=3, max_image_block=2)
    got = _check(m, "swin", dense, engine=engine, n_img=7, n_txt=11)
    assert engine.last_plan.details["workers"] == 3 and engine.last_plan.image_block == 2  # 4 blocks
    img, caps, lens, d, dl, t2i = _inputs("swin", n_img=7, n_txt=11)
    args = (d, dl) if dense else (None, None)
    one = score_matrix(
        m, img, caps, lens, *args, txt2img=t2i, engine=SEPSEngine(m, workers=1, max_image_block=2)
    )
    assert torch.equal(got, one)


@pytest.mark.parametrize(
    "switches",
    [
        dict(variant="paper", joint_score=True),
        dict(variant="paper", dense_mode="branch"),
        dict(variant="paper", aggregation="shared"),
        dict(variant="code", hrpa_topk=3, similarity="cosine"),
        dict(variant="code", dense_mode="guide", aggregation="dual"),
        dict(variant="paper", saliency="cls"),
        dict(variant="code", saliency="cls"),
    ],
)
@pytest.mark.parametrize("dense", ["image", "caption"])
def test_seps_engine_equals_forward_for_mixed_switches(switches, dense):
    m = _matcher("vit", dense_pairing=dense, **switches)
    _check(m, "vit", dense)


def test_laps_and_auto_engine():
    m = _matcher("vit", name="laps")
    assert isinstance(engine_for(m), SEPSEngine)
    _check(m, "vit", "image")  # LAPS ignores dense text, like its forward


@pytest.mark.parametrize("formulation", ["gram", "direct", "kdirect"])
def test_unstable_logits_fall_back_to_the_exact_softmax(formulation):
    """Each formulation has its own fallback (kdirect: over the kept patches only, ``_gathered``)."""
    m = _matcher("swin", variant="paper", dense_pairing="caption")
    with torch.no_grad():  # logit ranges of hundreds: exp(Lg - max) would underflow
        m.aggr_net.scale.fill_(500.0)
        m.aggr_net_dense.scale.fill_(500.0)
    engine = SEPSEngine(m, formulation=formulation)
    _check(m, "swin", "caption", engine=engine)
    assert engine.last_plan.details["formulation"] == formulation


def test_vse_and_forward_fallback_equal_forward():
    m = build_matcher("vse", embed_dim=DIM).eval()
    assert isinstance(engine_for(m), VSEEngine)
    _check(m, "vit", None)
    assert isinstance(engine_for(m, "forward"), ForwardEngine)
    _check(m, "vit", None, engine="forward")
    seps = _matcher("swin", dense_pairing="caption")
    _check(seps, "swin", "caption", engine="forward")


class _Dot(Matcher):
    """A matcher with no engine: mean-token cosine."""

    embed_dim = DIM

    def forward(self, img_tokens, cap_tokens, cap_lens, dense_tokens=None, dense_lens=None):
        img, txt = self.global_embed(img_tokens, cap_tokens, cap_lens)
        return MatcherOutput(sims=img @ txt.T)


def test_unknown_matchers_use_forward_and_subclasses_inherit_the_declared_engine():
    """An engine is attached one way: ``register_matcher(..., engine="module:Class")``; a subclass of a
    registered matcher inherits it, a matcher never registered is scored by its forward."""
    m = _Dot()
    assert isinstance(engine_for(m), ForwardEngine)
    _check(m, "swin", None)

    class Own(type(build_matcher("vse", embed_dim=DIM))):
        pass

    assert isinstance(engine_for(Own(build_matcher("vse", embed_dim=DIM).config)), VSEEngine)
    assert isinstance(engine_for(_Dot()), ForwardEngine)
    assert isinstance(engine_for(Own(build_matcher("vse", embed_dim=DIM).config), "forward"), ForwardEngine)
    with pytest.raises(ValueError, match="engine must be"):
        engine_for(m, "fastest")


def test_caption_dense_per_caption_rows_equal_txt2img_rows():
    m = _matcher("swin", dense_pairing="caption")
    img, caps, lens, d, dl, t2i = _inputs("swin")
    shared = score_matrix(m, img, caps, lens, d, dl, txt2img=t2i)
    per_caption = score_matrix(m, img, caps, lens, d[t2i], dl[t2i])
    assert (shared - per_caption).abs().max().item() <= 1e-6
    with pytest.raises(ValueError, match="one dense row per caption"):
        score_matrix(m, img, caps, lens, d, dl)


def test_tiny_budget_adapts_blocks_keeps_results_and_peak_under_budget():
    m = _matcher("vit", dense_pairing="caption")
    img, caps, lens, d, dl, t2i = _inputs("vit", n_img=6, n_txt=30)
    big = SEPSEngine(m)
    want = score_matrix(m, img, caps, lens, d, dl, txt2img=t2i, engine=big, max_memory_mb=512)
    small = SEPSEngine(m)
    out = torch.empty(6, 30)  # allocated outside the meter: the budget covers working memory
    budget_mb = 2
    with TensorMemoryMeter() as meter:
        score_matrix(m, img, caps, lens, d, dl, txt2img=t2i, engine=small, max_memory_mb=budget_mb, out=out)
    plan_big, plan_small = big.last_plan, small.last_plan
    assert plan_small.text_block < plan_big.text_block and plan_small.image_block < plan_big.image_block
    assert (out - want).abs().max().item() <= 1e-6
    assert 0 < meter.peak_bytes <= budget_mb << 20
    assert meter.peak_bytes <= plan_small.estimated_peak_bytes  # the plan's estimate is an upper bound
    with pytest.raises(ValueError, match="too small"):
        score_matrix(m, img, caps, lens, d, dl, txt2img=t2i, max_memory_mb=0.05)
    # the message says the budget in the bytes it is (it printed max_memory_mb=0.000999 for 0.001, rounded
    # to whole bytes and named as if the user had typed it)
    with pytest.raises(ValueError, match=r"a scoring memory budget of 52,428 bytes \(eval.max_memory_mb"):
        score_matrix(
            m, img, caps, lens, d, dl, txt2img=t2i, max_memory_mb=0.05, engine=SEPSEngine(m, workers=1)
        )


def test_forward_fallback_respects_a_tiny_budget():
    m = _Dot()
    img, caps, lens, *_ = _inputs("swin", n_img=6, n_txt=40)
    want = score_matrix(m, img, caps, lens)
    out = torch.empty(6, 40)
    with TensorMemoryMeter() as meter:
        score_matrix(m, img, caps, lens, max_memory_mb=0.5, out=out)
    assert (out - want).abs().max().item() <= 1e-6
    assert meter.peak_bytes <= 0.5 * (1 << 20)


def test_score_pairs_and_modes_are_restored():
    m = _matcher("swin", variant="paper", dense_pairing="image").train()
    img, caps, lens, d, dl, t2i = _inputs("swin", n_img=6, n_txt=12)
    full = score_matrix(m, img, caps, lens, d, dl)
    assert m.training  # eval mode only for the call
    inputs = prepare_inputs(m, img, caps, lens, d, dl, None)
    vi, ti = torch.randint(0, 6, (40,)), torch.randint(0, 12, (40,))
    m.eval()
    for engine in (SEPSEngine(m), ForwardEngine(m)):
        got = engine.score_pairs(inputs, vi, ti, budget=1 << 26, device=torch.device("cpu"))
        assert (got - full[vi, ti]).abs().max().item() <= 1e-5
    assert isinstance(engine_for(m), ScoringEngine)


def test_input_validation():
    m = _matcher("swin")
    img, caps, lens, d, dl, _ = _inputs("swin")
    with pytest.raises(ValueError, match="cap_lens"):
        score_matrix(m, img, caps, lens[:-1])
    with pytest.raises(ValueError, match="max_memory_mb"):
        score_matrix(m, img, caps, lens, max_memory_mb=0)
    with pytest.raises(ValueError, match="one row per image"):
        score_matrix(m, img, caps, lens, d[:-1], dl[:-1])
    with pytest.raises(ValueError, match="out must be"):
        score_matrix(m, img, caps, lens, out=torch.empty(2, 2))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_precomputed_image_constants_give_the_scores_of_the_dense_tokens(kind):
    """SEPS as released ("branch" mode, dense text tied to the image): the dense branch is one number per
    image; stored instead of the dense tokens it gives the same scores (the index-time precompute)."""
    m = _matcher(kind, "code", dense_pairing="image")
    img, caps, lens, dense, dense_lens, _ = _inputs(kind)
    engine = SEPSEngine(m)
    constants = engine.image_constants(img, dense, dense_lens, device="cpu", block=2)
    assert constants.shape == (img.shape[0],) and constants.abs().min() > 0
    want = _forward(m, img, caps, lens, dense, dense_lens)
    without = _forward(m, img, caps, lens)
    out = torch.empty(img.shape[0], caps.shape[0])
    inputs = prepare_inputs(m, img, caps, lens, None, None, None, image_constants=constants)
    engine.score(inputs, out, budget=1 << 28, device="cpu", progress=False)
    assert (out - want).abs().max() <= 1e-5
    assert (without - want).abs().max() > 1e-2  # the dense branch matters
    pairs = engine.score_pairs(
        inputs, torch.tensor([0, 3, 4]), torch.tensor([1, 1, 7]), budget=1 << 28, device="cpu"
    )
    torch.testing.assert_close(pairs, want[[0, 3, 4], [1, 1, 7]], atol=1e-5, rtol=0)
    # "guide" mode (the paper variant): dense text enters every pair's selection, no per-image part
    assert SEPSEngine(_matcher(kind, "paper")).image_constants(img, dense, dense_lens, device="cpu") is None
    with pytest.raises(ValueError, match="not both"):
        prepare_inputs(m, img, caps, lens, dense, dense_lens, None, image_constants=constants)


def test_a_search_does_not_pay_for_gram_matrices_it_uses_once():
    """ "gram" builds each image's (N, N) Gram matrix once for all its captions: worth it for an evaluation's
    hundreds of captions per image, not for a search's one (ViT-B/16 shapes: direct forms 26% faster)."""
    m = build_matcher("seps", embed_dim=512, num_patches=196, has_cls=True, sparse_ratio=0.5, aggr_ratio=0.4)
    engine = SEPSEngine(m.eval())
    assert engine._form(9, texts_per_image=240) == engine._form(9) == "gram"
    assert engine._form(9, texts_per_image=1) in ("direct", "kdirect")
