"""Matchers under reduced precision (``precision=amp_bf16`` / ``amp_fp16`` autocast, ``precision=bf16``).

Two promises: the SEPS / LAPS patch selection (a top-K) is made in float32 whatever the run's precision,
so it keeps the patches float32 keeps; and float16 gives finite scores close to float32's (the official
epsilons of 1e-8 .. 1e-16 round to 0 in float16, and 0 / 0 made NaN).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from patchword.matching import build_matcher
from patchword.matching.attention import attended_cosine, feature_norm, official_l2norm
from patchword.matching.ops import l2norm, minmax_normalise

pytestmark = pytest.mark.usefixtures("one_thread")

C, N = 64, 196  # ViT-B/16-224's 196 patches, a narrow width to keep the test fast


def _correlated_batch(b=4, seed=0, dtype=torch.float32):
    """(B, 1 + N, C) image tokens whose patches share an image-wide component (as a ViT's do, which
    bunches their cosines together), captions near their image, dense text: the case where bfloat16
    selection scores tie at the K-th place for most pairs."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(b, 1, C, generator=g)
    img = base + 0.7 * torch.randn(b, N + 1, C, generator=g)
    cap = base + torch.randn(b, 9, C, generator=g)
    lens = torch.randint(4, 10, (b,), generator=g)
    dense = torch.randn(b, 16, C, generator=g)
    dense_lens = torch.randint(8, 17, (b,), generator=g)
    return [x.to(dtype) for x in (img, cap)] + [lens, dense.to(dtype), dense_lens]


def _seps(variant, dense_pairing="image"):
    torch.manual_seed(0)
    return build_matcher(
        "seps", embed_dim=C, num_patches=N, has_cls=True, variant=variant, dense_pairing=dense_pairing
    ).train()


def _kept(out):
    """(B_v, sum of branch widths, N) bool: the patches each selection branch kept."""
    return torch.cat([d.detach() for d in out.decisions], dim=1) > 0.5


def _seeded(matcher, *inputs):
    torch.manual_seed(1)  # the same Gumbel noise (paper variant, training) in both runs
    return matcher(*inputs)


# -- the SEPS / LAPS selection is float32 under any precision ------------------------------------------------


@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("pairing", ["image", "caption"])
def test_seps_keeps_the_float32_patches_under_bf16_autocast(variant, pairing):
    """``precision=amp_bf16``: the selection scores (saliency, relevance, the paper's predictor and their
    combination) and the top-K are float32 with autocast off, so with float32 tokens the kept patches are
    exactly float32's. In bfloat16 the scores tied at the K-th place and 75-80 % of these pairs kept
    another set of patches."""
    m = _seps(variant, pairing)
    inputs = _correlated_batch()
    ref = _seeded(m, *inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _seeded(m, *inputs)
    assert torch.equal(_kept(out), _kept(ref))
    # the rest of the matcher ran in bfloat16: close, not equal
    assert out.sims.dtype == torch.float32 and torch.isfinite(out.sims).all()
    assert (out.sims - ref.sims).abs().max().item() < 2e-2


def test_the_bf16_selection_scores_have_no_rounding_ties():
    """What the test above guards against, on its own inputs: the top-K boundary of the float32 scores
    is never a tie (so float32 decides the kept set unambiguously), that of the same scores rounded to
    bfloat16 ties for most pairs."""
    from patchword.matching.selection import image_saliency, text_relevance

    img, cap, lens, *_ = _correlated_batch()
    patches = img[:, 1:]
    unit = l2norm(patches)
    guide = l2norm(torch.stack([cap[t, : lens[t]].mean(0) for t in range(len(lens))]))
    score = image_saliency(patches, unit)[:, None] + text_relevance(unit, guide, per_image=False)
    k = N // 2
    top = score.topk(k + 1, dim=-1).values
    assert (top[..., k - 1] > top[..., k]).all()
    top16 = score.bfloat16().topk(k + 1, dim=-1).values
    assert (top16[..., k - 1] == top16[..., k]).float().mean().item() > 0.5


@pytest.mark.parametrize("variant", ["code", "paper"])
def test_a_bfloat16_seps_selects_like_float32_on_the_same_values(variant):
    """``precision=bf16``: the step runs on a bfloat16 copy of the matcher with bfloat16 tokens. The
    selection scores are computed in float32 from those values (the predictor's bfloat16 weights are cast
    up, not the patches down), so the kept patches are those of a float32 matcher with the same
    (bfloat16-valued) weights and tokens; the step still runs backward in bfloat16."""
    m = _seps(variant)
    low = copy.deepcopy(m).to(torch.bfloat16)
    ref_m = copy.deepcopy(low).float()  # float32, with the bfloat16 copy's values
    img, cap, lens, dense, dense_lens = _correlated_batch(dtype=torch.bfloat16)
    img.requires_grad_(True)
    out = _seeded(low, img, cap, lens, dense, dense_lens)
    ref = _seeded(ref_m, img.detach().float(), cap.float(), lens, dense.float(), dense_lens)
    assert torch.equal(_kept(out), _kept(ref))
    assert all(d.dtype == torch.float32 for d in out.decisions)
    out.sims.sum().backward()
    assert img.grad.dtype == torch.bfloat16 and torch.isfinite(img.grad.float()).all()


def test_the_patch_scorer_computes_in_the_dtype_of_its_input():
    """The paper's score predictor s_p (a bfloat16 module under ``precision=bf16``) scores float32 patches
    in float32, with its weights cast up."""
    from patchword.matching.selection import PatchScorer

    torch.manual_seed(0)
    scorer = PatchScorer(C).to(torch.bfloat16)
    patches = torch.randn(2, 5, C)
    got = scorer(patches)
    want = copy.deepcopy(scorer).float()(patches)
    assert got.dtype == torch.float32
    assert torch.equal(got, want)


# -- float16: finite, close to float32 ----------------------------------------------------------------------


def test_minmax_normalise_of_a_constant_row_is_zero_in_float16():
    """(s - min) / (max - min + 1e-8): the 1e-8 rounds to 0 in float16 and a constant row was 0 / 0."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 16, generator=g)
    scores[1] = 0.37  # an image whose patches are all the same token
    ref = minmax_normalise(scores)
    got = minmax_normalise(scores.half())
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    assert torch.equal(got[1], torch.zeros(16, dtype=torch.float16))
    assert (got.float() - ref).abs().max().item() < 2e-3


def test_seps_paper_variant_scores_a_uniform_image_under_fp16_autocast():
    """An image whose patches are all one token: its min-max normalised saliency was NaN in float16, and
    so was its whole row of similarities."""
    torch.manual_seed(0)
    n, dim = 16, 32
    m = build_matcher("seps", embed_dim=dim, num_patches=n, has_cls=True, variant="paper").eval()
    g = torch.Generator().manual_seed(0)
    img = torch.randn(3, n + 1, dim, generator=g)
    img[1, 1:] = torch.randn(dim, generator=g)
    cap, lens = torch.randn(4, 6, dim, generator=g), torch.tensor([6, 4, 5, 3])
    dense, dense_lens = torch.randn(3, 8, dim, generator=g), torch.tensor([8, 6, 7])
    with torch.no_grad():
        ref = m(img, cap, lens, dense, dense_lens).sims
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(img, cap, lens, dense, dense_lens).sims
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() < 2e-3


@pytest.mark.parametrize("divide_query_norm", [False, True])
def test_attended_cosine_of_a_query_with_no_weight_is_zero_in_float16(divide_query_norm):
    """A query whose weights are all 0 (a NAAF word with no region above the threshold): its attended
    vector is 0 and the official max(|a|, 1e-8) floor makes the cosine 0; in float16 the floors (1e-16
    before the square root, 1e-8 after) were 0 and the cosine 0 / 0."""
    g = torch.Generator().manual_seed(0)
    context = F.normalize(torch.randn(2, 7, 16, generator=g), dim=-1)  # (B, C_ctx, D)
    queries = F.normalize(torch.randn(2, 5, 16, generator=g), dim=-1)  # (B, Q, D)
    scores = queries @ context.transpose(1, 2)  # (B, Q, C_ctx)
    weights = torch.softmax(9.0 * scores, dim=-1)
    weights[0, 2] = 0.0
    weights[1, [0, 4]] = 0.0
    gram = context @ context.transpose(1, 2)
    qn = queries.norm(dim=-1) if divide_query_norm else None
    args = dict(divide_query_norm=divide_query_norm)
    ref = attended_cosine(weights, scores, gram, qn, **args)
    half = None if qn is None else qn.half()
    got = attended_cosine(weights.half(), scores.half(), gram.half(), half, **args)
    assert torch.isfinite(got).all()
    assert got[0, 2] == 0 and got[1, 0] == 0 and got[1, 4] == 0
    assert (got.float() - ref).abs().max().item() < 5e-3


def _unit(*shape, seed):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_naaf_under_fp16_autocast_is_finite_and_close_to_float32(mode):
    """NAAF with a threshold some words have no region above: their softmax over the regions above it was
    exp / (0 + 1e-8), and float16 rounds the 1e-8 to 0 (NaN in most similarities)."""
    img, cap = _unit(6, 36, 32, seed=0), _unit(7, 9, 32, seed=1)
    lens = torch.tensor([9, 4, 7, 2, 9, 5, 8])
    s = torch.einsum("tlc,vrc->vtlr", cap, img).flatten()
    # NAAF jumps where a score crosses the threshold: put it in the widest gap between the scores near
    # 0.3, far beyond float16's rounding of them, so that float16 and float32 agree on which are above.
    near = s[(s > 0.25) & (s < 0.35)].sort().values
    gap = (near[1:] - near[:-1]).argmax()
    threshold = float(near[gap] + near[gap + 1]) / 2
    assert float(near[gap + 1] - near[gap]) > 1e-3
    torch.manual_seed(0)
    m = build_matcher("naaf", embed_dim=32)
    m.threshold.fill_(threshold)
    m.threshold_safe.fill_(threshold)
    getattr(m, mode)()
    row_max = s.view(6, 7, 9, 36).amax(-1)
    assert ((row_max < threshold) & (torch.arange(9) < lens[:, None])).any()  # words with no region above
    with torch.no_grad():
        ref = m(img, cap, lens).sims
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(img, cap, lens).sims
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() < 5e-3


def test_the_official_normalisations_of_a_zero_vector_are_zero_in_float16():
    """``x / (||x|| + 1e-8)``, ``x / (sum |x| + 1e-8)`` and ``F.normalize``'s ``max(||x||, 1e-12)``: in
    float16 the epsilon rounds to 0 and a zero vector (a padded position, a blank region) was 0 / 0."""
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    x[1] = 0.0
    for fn in (official_l2norm, l2norm, lambda v, dim: feature_norm(v, "l1norm", dim=dim)):
        ref = fn(x, dim=-1)
        got = fn(x.half(), dim=-1)
        assert torch.isfinite(got).all()
        assert torch.equal(got[1], torch.zeros(8, dtype=torch.float16))
        assert (got.float() - ref).abs().max().item() < 2e-3


def test_hrpa_cosines_of_a_zero_token_are_zero_in_float16():
    """``1 / max(||x||, 1e-12)``: in float16 the floor rounds to 0, a zero fusion token (no patch dropped)
    got an infinite inverse norm and its cosines were inf * 0 = NaN."""
    from patchword.matching.hrpa import pair_cosines

    g = torch.Generator().manual_seed(0)
    cls, aggregated = torch.randn(2, 8, generator=g), torch.randn(2, 3, 4, 8, generator=g)
    extra = torch.randn(2, 3, 8, generator=g)
    extra[1, 2] = 0.0
    words = torch.nn.functional.normalize(torch.randn(3, 5, 8, generator=g), dim=-1)
    ref = pair_cosines(cls, aggregated, extra, words)
    got = pair_cosines(cls.half(), aggregated.half(), extra.half(), words.half())
    assert torch.isfinite(got).all()
    assert (got.float() - ref).abs().max().item() < 5e-3
