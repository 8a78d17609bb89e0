"""The precision contract of a matcher's forward: ``MatcherOutput.sims`` are float32 (float64 for float64
tokens) whatever the token dtype or autocast, TGDT's global similarity (which picks the two-stage
shortlist) is computed at full precision with autocast off, and SEPS / LAPS score tokens of any float dtype
as the evaluation's engine does (cast to the matcher's parameter dtype) instead of failing in a matmul."""

from __future__ import annotations

import pytest
import torch

from patchword.eval import score_matrix
from patchword.matching import build_matcher

pytestmark = pytest.mark.usefixtures("one_thread")

C = 32


def _inputs(n_img=3, n_txt=4, tokens=17, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, tokens, C, generator=g)
    cap = torch.randn(n_txt, 6, C, generator=g)
    return img, cap, torch.tensor([6, 3, 4, 2, 5][:n_txt])


def _matcher(name, **kw):
    torch.manual_seed(0)
    geometry = dict(num_patches=16, has_cls=True) if name in ("vse", "clip", "filip") else {}
    return build_matcher(name, embed_dim=C, **geometry, **kw).eval()


@pytest.mark.parametrize("name", ["tgdt", "vse", "clip", "filip"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sims_are_float32_for_reduced_precision_tokens(name, dtype):
    m = _matcher(name)
    img, cap, lens = _inputs()
    with torch.no_grad():
        ref = m(img, cap, lens).sims
        got = m(img.to(dtype), cap.to(dtype), lens).sims
    assert got.dtype == torch.float32
    assert (got - ref).abs().max().item() < (0.1 if name == "tgdt" else 1e-2)  # TGDT: x10 local scale


@pytest.mark.parametrize("name", ["tgdt", "vse", "clip", "filip"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_sims_are_float32_under_bf16_autocast(name, mode):
    m = getattr(_matcher(name), mode)()
    img, cap, lens = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(img, cap, lens)
    assert out.sims.dtype == torch.float32
    assert torch.isfinite(out.sims).all()


@pytest.mark.parametrize("name", ["vse", "clip"])
def test_float32_tokens_outside_autocast_score_as_before(name):
    """Full precision changes nothing for float32 tokens: sims equal the plain float32 product."""
    m = _matcher(name)
    img, cap, lens = _inputs()
    with torch.no_grad():
        sims = m(img, cap, lens).sims
        g_img, g_txt = m.global_embed(img, cap, lens)
    assert sims.dtype == torch.float32 and torch.equal(sims, g_img @ g_txt.T)


def test_tgdt_global_similarity_is_float32_under_autocast():
    """``inference="global"`` (s_g, the two-stage shortlist's score): under bfloat16 autocast it is the
    float32 similarity exactly, not a bfloat16 product."""
    m = _matcher("tgdt", inference="global")
    img, cap, lens = _inputs()
    with torch.no_grad():
        ref = m(img, cap, lens).sims
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = m(img, cap, lens).sims
            g_img, g_txt = m.global_embed(img, cap, lens)
            paired = m.paired_scores(img[[0, 1, 2]], cap[[0, 1, 2]], lens[[0, 1, 2]])
    assert got.dtype == torch.float32 and torch.equal(got, ref)
    assert g_img.dtype == g_txt.dtype == torch.float32
    assert torch.equal(g_img @ g_txt.T, ref)
    assert paired.dtype == torch.float32 and torch.allclose(paired, ref.diagonal(), atol=1e-6, rtol=0)


def test_tgdt_global_embeddings_of_half_tokens_are_normalised_in_float32():
    m = _matcher("tgdt")
    img, cap, lens = _inputs()
    g_img, g_txt = m.global_embed(img.half(), cap.half(), lens)
    want_img, want_txt = m.global_embed(img.half().float(), cap.half().float(), lens)
    assert g_img.dtype == torch.float32
    assert torch.equal(g_img, want_img) and torch.equal(g_txt, want_txt)


@pytest.mark.parametrize("name", ["seps", "laps"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_seps_forward_scores_any_float_dtype_cast_to_the_matchers(name, dtype):
    """Half, bfloat16 and float64 tokens failed with 'mat1 and mat2 must have the same dtype'; now they are
    cast to the matcher's float32, as the evaluation's engine scores them."""
    m = build_matcher(name, embed_dim=C, num_patches=16, has_cls=True).eval()
    img, cap, lens = _inputs()
    dense, dense_lens = (
        torch.randn(3, 8, C, generator=torch.Generator().manual_seed(1)),
        torch.tensor([8, 5, 7]),
    )
    low = [x.to(dtype) for x in (img, cap, dense)]
    with torch.no_grad():
        got = m(low[0], low[1], lens, low[2], dense_lens).sims
        want = m(low[0].float(), low[1].float(), lens, low[2].float(), dense_lens).sims
    assert got.dtype == torch.float32
    assert torch.equal(got, want)
    # the evaluation's engine takes the same tokens and scores them alike
    engine = score_matrix(m, low[0], low[1], lens, low[2], dense_lens)
    assert torch.allclose(engine, got, atol=1e-5, rtol=0)


def test_seps_float32_tokens_under_autocast_are_not_cast():
    """Under autocast the tokens pass as they come (autocast casts the products itself): a bfloat16
    training step keeps its numerics (the selection stays float32, test_reduced_precision)."""
    m = build_matcher("seps", embed_dim=C, num_patches=16, has_cls=True).train()
    img, cap, lens = _inputs()
    low = img.bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(low, cap.bfloat16(), lens)
    assert out.sims.dtype == torch.float32
    out.sims.sum().backward()
    assert low.grad.dtype == torch.bfloat16 and torch.isfinite(low.grad.float()).all()


def test_seps_selection_trace_takes_half_tokens():
    m = build_matcher("laps", embed_dim=C, num_patches=16, has_cls=True).eval()
    img, cap, lens = _inputs()
    got = m.selection_trace(img[:1].half(), cap[:1].half(), lens[:1])
    want = m.selection_trace(img[:1].half().float(), cap[:1].half().float(), lens[:1])
    assert [k for _, k in got.branches][0].equal([k for _, k in want.branches][0])
    assert torch.equal(got.mixture, want.mixture)
