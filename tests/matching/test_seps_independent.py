"""SEPS / LAPS against a yardstick that shares nothing with the library, and against the official code.

``patchword.testing.seps_independent`` is written from the official ``lib/cross_net.py`` and takes the
official option values spelled out here (never a library config) and the matcher's weights as raw tensors:
a wrong K or N_c, a wrong variant preset or a misread switch in ``patchword.matching`` / ``patchword.eval``
shows up as a difference. ``tests/data/official_seps_golden.pt`` holds scores of the real official
``CrossSparseAggrNet_v2`` (LAPS and SEPS), written by ``benchmarks/official_seps_golden.py``.
"""

from __future__ import annotations

import pytest
import torch

from patchword.eval import score_matrix
from patchword.eval.engine.core import prepare_inputs
from patchword.eval.engine.seps import SEPSEngine
from patchword.matching import build_matcher
from patchword.matching.seps import VARIANT_PRESETS
from patchword.search.pruning import prune_patches
from patchword.testing.seps_independent import (
    VARIANTS,
    SEPSOptions,
    independent_patch_prior,
    independent_seps_scores,
    token_counts,
)
from project_paths import TEST_DATA

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: thread barriers cost more than the work

# The official option values of each shape, written out (num_patches N, CLS, sparse_ratio, aggr_ratio):
# ViT-B/16-224 (1 + 196 tokens, README ratios) and Swin-B-224 (49 tokens, README ratios).
SHAPES = {"vit": (196, True, 0.5, 0.4), "swin": (49, False, 0.8, 0.6)}
DIM = 32
N_IMG, N_TXT = 5, 8
# caption j's ground-truth image: not the identity, and dense rows of unsorted lengths
TXT2IMG = torch.tensor([3, 0, 1, 4, 2, 3, 0, 1])
# float64 forward vs float64 reference; the engine returns float32
FORWARD_TOL, ENGINE_TOL = 1e-10, 1e-6
GOLDEN = TEST_DATA / "official_seps_golden.pt"


def _matcher(kind: str, variant: str = "code", name: str = "seps", seed: int = 1, **kw):
    """A float64 eval-mode matcher with every parameter moved off its initialisation (scale, LayerNorm)."""
    n, has_cls, rho, aggr = SHAPES[kind]
    torch.manual_seed(seed)
    m = build_matcher(
        name, embed_dim=DIM, num_patches=n, has_cls=has_cls, sparse_ratio=rho, aggr_ratio=aggr,
        variant=variant, **kw,
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return m.double().eval()


def _options(kind: str, variant: str = "code", **switches) -> SEPSOptions:
    n, _, rho, aggr = SHAPES[kind]
    return SEPSOptions(sparse_ratio=rho, aggr_ratio=aggr, num_patches=n, variant=variant, **switches)


def _inputs(kind: str, seed: int = 0):
    """Float64 tokens: N_IMG images, N_TXT captions (noise in the padding), one dense text per image."""
    n, has_cls, *_ = SHAPES[kind]
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(N_IMG, n + int(has_cls), DIM, generator=g, dtype=torch.float64)
    caps = torch.randn(N_TXT, 12, DIM, generator=g, dtype=torch.float64)
    lens = torch.tensor([12, 9, 3, 7, 12, 5, 4, 10])
    dense = torch.randn(N_IMG, 24, DIM, generator=g, dtype=torch.float64)
    dense_lens = torch.tensor([9, 24, 6, 17, 13])
    return img, caps, lens, dense, dense_lens


def _reference(opt, m, img, caps, lens, dense, dense_lens, pairing, patch_prior=None):
    """The independent scores; ``pairing``: None (no dense text), "image" or "caption" (TXT2IMG)."""
    if pairing is None:
        dense = dense_lens = None
    return independent_seps_scores(
        opt, m.state_dict(), img, caps, lens, dense, dense_lens,
        dense_pairing=pairing or "caption", dense_index=TXT2IMG if pairing == "caption" else None,
        patch_prior=patch_prior,
    )  # fmt: skip


def _forward(m, img, caps, lens, dense, dense_lens, pairing, patch_prior=None):
    if pairing == "caption":
        dense, dense_lens = dense[TXT2IMG], dense_lens[TXT2IMG]
    elif pairing is None:
        dense = dense_lens = None
    with torch.no_grad():
        return m(img, caps, lens, dense, dense_lens, patch_prior=patch_prior).sims


def _engine(m, img, caps, lens, dense, dense_lens, pairing, engine=None):
    if pairing is None:
        dense = dense_lens = None
    txt2img = TXT2IMG if pairing == "caption" else None
    return score_matrix(m, img, caps, lens, dense, dense_lens, txt2img=txt2img, engine=engine)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a.double() - b.double()).abs().max().item()


# ------------------------------------------------------------------ the yardstick's own tables


def test_variant_presets_are_the_independent_table():
    assert VARIANT_PRESETS == VARIANTS


@pytest.mark.parametrize(
    "tokens,rho,aggr,has_cls,k,n_c",
    [  # reference/seps_laps.md section 1.4, plus the test shapes
        (197, 0.5, 0.4, True, 98, 39),
        (49, 0.8, 0.6, False, 40, 23),
        (577, 0.5, 0.4, True, 288, 115),
        (144, 0.8, 0.6, False, 116, 69),
        (17, 0.52, 0.45, True, 9, 3),
    ],
)
def test_token_counts_follow_the_official_expressions(tokens, rho, aggr, has_cls, k, n_c):
    n = tokens - int(has_cls)
    counts = token_counts(SEPSOptions(sparse_ratio=rho, aggr_ratio=aggr, num_patches=n), tokens)
    assert counts == {"has_cls": has_cls, "N": n, "K": k, "N_c": n_c}
    m = build_matcher("seps", embed_dim=8, num_patches=n, has_cls=has_cls, sparse_ratio=rho, aggr_ratio=aggr)
    assert (m.num_keep, m.aggr_net.num_out) == (k, n_c)


def test_the_reference_refuses_weights_its_switches_do_not_read():
    """A matcher whose preset built other modules than the options say fails loudly, not silently."""
    m = _matcher("vit", "paper")
    img, caps, lens, *_ = _inputs("vit")
    with pytest.raises(ValueError, match="unused"):
        independent_seps_scores(_options("vit", "code"), m.state_dict(), img, caps, lens)
    with pytest.raises(ValueError, match="missing"):
        independent_seps_scores(_options("vit", "paper"), _matcher("vit").state_dict(), img, caps, lens)
    wrong_nc = SEPSOptions(sparse_ratio=0.5, aggr_ratio=0.3, num_patches=196)
    with pytest.raises(ValueError, match="N_c"):
        independent_seps_scores(wrong_nc, _matcher("vit").state_dict(), img, caps, lens)


# ------------------------------------------------------------------ matcher forward


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("pairing", [None, "image", "caption"])
def test_forward_equals_independent_reference(kind, variant, pairing):
    m = _matcher(kind, variant, dense_pairing=pairing or "image")
    inputs = _inputs(kind)
    got = _forward(m, *inputs, pairing)
    want = _reference(_options(kind, variant), m, *inputs, pairing)
    assert got.dtype == torch.float64 and _max_diff(got, want) <= FORWARD_TOL
    if pairing is not None:  # the dense text counts
        assert _max_diff(got, _reference(_options(kind, variant), m, *inputs, None)) > 1e-3


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_laps_forward_and_engine_equal_independent_reference_without_dense_text(kind):
    m = _matcher(kind, name="laps")
    inputs = _inputs(kind)
    want = _reference(_options(kind), m, *inputs, None)
    assert _max_diff(_forward(m, *inputs, "image"), want) <= FORWARD_TOL  # LAPS reads no dense text
    assert _max_diff(_engine(m, *inputs, "image"), want) <= ENGINE_TOL


# ------------------------------------------------------------------ scoring engine


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("pairing", [None, "image", "caption"])
@pytest.mark.parametrize("formulation", ["gram", "direct", "kdirect"])
def test_engine_equals_independent_reference(kind, variant, pairing, formulation):
    m = _matcher(kind, variant, dense_pairing=pairing or "image")
    inputs = _inputs(kind)
    got = _engine(m, *inputs, pairing, engine=SEPSEngine(m, formulation=formulation))
    assert got.dtype == torch.float32
    assert _max_diff(got, _reference(_options(kind, variant), m, *inputs, pairing)) <= ENGINE_TOL


def test_engine_pairs_equal_independent_reference_with_caption_tied_dense_text():
    """``score_pairs`` (re-ranking) looks dense rows up per caption too."""
    m = _matcher("swin", "code", dense_pairing="caption")
    img, caps, lens, dense, dense_lens = _inputs("swin")
    want = _reference(_options("swin"), m, img, caps, lens, dense, dense_lens, "caption")
    inputs = prepare_inputs(m, img, caps, lens, dense, dense_lens, TXT2IMG)
    rows, cols = torch.tensor([0, 3, 4, 4, 1, 2]), torch.tensor([1, 1, 7, 0, 5, 2])
    pairs = SEPSEngine(m).score_pairs(inputs, rows, cols, budget=1 << 28, device="cpu")
    assert _max_diff(pairs, want[rows, cols]) <= ENGINE_TOL


# ------------------------------------------------------------------ switches: joint_score, saliency, ...

MIXED = [
    dict(variant="paper", joint_score=True),
    dict(variant="code", dense_mode="guide", joint_score=True),
    dict(variant="paper", saliency="cls"),
    dict(variant="code", saliency="cls"),
    dict(variant="paper", dense_mode="branch"),
    dict(variant="paper", aggregation="shared"),
    dict(variant="code", hrpa_topk=3, similarity="cosine"),
    dict(variant="code", dense_mode="guide", aggregation="dual"),
    dict(variant="code", score_mode="predictor", beta=0.3),
]


@pytest.mark.parametrize("switches", MIXED, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("pairing", ["image", "caption"])
def test_mixed_switches_equal_independent_reference(switches, pairing):
    m = _matcher("vit", dense_pairing=pairing, **switches)
    inputs = _inputs("vit")
    want = _reference(_options("vit", **switches), m, *inputs, pairing)
    assert _max_diff(_forward(m, *inputs, pairing), want) <= FORWARD_TOL
    assert _max_diff(_engine(m, *inputs, pairing), want) <= ENGINE_TOL
    # joint_score and saliency need no weights of their own: with the same weights, each changes the scores
    live = {k for k in switches if k in ("joint_score", "saliency")}
    if live:
        plain = _options("vit", **{k: v for k, v in switches.items() if k not in live})
        assert _max_diff(want, _reference(plain, m, *inputs, pairing)) > 1e-4


# ------------------------------------------------------------------ index-time pruning (patch_prior)

KEEP = {"vit": 130, "swin": 45}  # between K (98, 40) and N (196, 49)


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("pairing", [None, "image", "caption"])
def test_pruned_scoring_equals_independent_reference(kind, variant, pairing):
    m = _matcher(kind, variant, dense_pairing=pairing or "image")
    img, caps, lens, dense, dense_lens = _inputs(kind)
    opt = _options(kind, variant)
    pruned = prune_patches(SEPSEngine(m), img, KEEP[kind], device="cpu")
    # the prior the index stores is the reference's image part of the kept patches
    ids = pruned.patch_ids.long()
    prior = independent_patch_prior(opt, m.state_dict(), img)
    assert _max_diff(pruned.prior, prior.gather(1, ids)) <= 1e-6
    tokens, prior = pruned.tokens, pruned.prior.double()
    want = _reference(opt, m, tokens, caps, lens, dense, dense_lens, pairing, patch_prior=prior)
    got = _forward(m, tokens, caps, lens, dense, dense_lens, pairing, patch_prior=prior)
    assert _max_diff(got, want) <= FORWARD_TOL
    args = (dense, dense_lens) if pairing else (None, None)
    inputs = prepare_inputs(
        m, tokens, caps, lens, *args, TXT2IMG if pairing == "caption" else None, patch_prior=prior
    )
    out = torch.empty(N_IMG, N_TXT)
    SEPSEngine(m).score(inputs, out, budget=1 << 28, device="cpu", progress=False)
    assert _max_diff(out, want) <= ENGINE_TOL
    # pruning is an approximation: the reference on the unpruned tokens differs
    assert _max_diff(want, _reference(opt, m, img, caps, lens, dense, dense_lens, pairing)) > 1e-4


def test_pruned_scoring_with_cls_saliency_equals_independent_reference():
    m = _matcher("vit", "paper", dense_pairing="image", saliency="cls")
    img, caps, lens, dense, dense_lens = _inputs("vit", seed=2)
    opt = _options("vit", "paper", saliency="cls")
    pruned = prune_patches(SEPSEngine(m), img, KEEP["vit"], device="cpu")
    prior = independent_patch_prior(opt, m.state_dict(), img)
    assert _max_diff(pruned.prior, prior.gather(1, pruned.patch_ids.long())) <= 1e-6
    want = _reference(opt, m, pruned.tokens, caps, lens, dense, dense_lens, "image", pruned.prior.double())
    got = _forward(m, pruned.tokens, caps, lens, dense, dense_lens, "image", pruned.prior.double())
    assert _max_diff(got, want) <= FORWARD_TOL


# ------------------------------------------------------------------ golden scores of the official code


def _golden():
    return torch.load(GOLDEN, weights_only=True)


GOLDEN_CASES = sorted(_golden()["cases"])


def test_golden_fixture_records_the_official_commits():
    official = _golden()["official"]
    assert official["laps"]["commit"] == "355a43babb70a3fdfbe74aabebad9a8414b91b3b"
    assert official["seps"]["commit"] == "7f4dfa68856c014337b38345835aee199fe49f72"
    assert official["laps"]["files"]["lib/cross_net.py"] == "4f9198944e65a8f146a3a399d8e737205f7a90b2"
    assert official["seps"]["files"]["lib/cross_net.py"] == "5986298816866efd38e50cccdeaaae6cd917c31e"
    assert {c.split("_", 1)[0] for c in GOLDEN_CASES} == {"laps", "seps"}


def _golden_case(name: str):
    fixture = _golden()
    case, data = fixture["cases"][name], fixture["inputs"]
    opt = case["opt"]
    has_cls = case["shape"] != "swin"
    img = data["img_vit"] if has_cls else data["img_swin"]
    seps = case["family"] == "seps"
    dense = (data["dense"], data["dense_lens"]) if seps else (None, None)
    return case, opt, has_cls, img, data, dense


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_independent_reference_reproduces_the_official_code(name):
    case, opt, _, img, data, dense = _golden_case(name)
    options = SEPSOptions(
        sparse_ratio=opt["sparse_ratio"], aggr_ratio=opt["aggr_ratio"], num_patches=opt["num_patches"]
    )
    got = independent_seps_scores(
        options, case["weights"], img, data["caps"], data["cap_lens"], *dense, dense_index=data["txt2img"]
    )
    assert _max_diff(got, case["scores"]) <= 1e-12
    assert case["scores"].std() > 1e-2  # not degenerate


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_library_reproduces_the_official_code(name):
    case, opt, has_cls, img, data, dense = _golden_case(name)
    m = build_matcher(
        case["family"], embed_dim=opt["embed_size"], num_patches=opt["num_patches"], has_cls=has_cls,
        sparse_ratio=opt["sparse_ratio"], aggr_ratio=opt["aggr_ratio"], dense_pairing="caption",
    )  # fmt: skip
    # official names; only the scale's shape differs ((1, 1, 1) officially)
    state = {k: v.reshape(1) if k.endswith(".scale") else v for k, v in case["weights"].items()}
    m.double().load_state_dict(state)
    m.eval()
    caps, lens, txt2img = data["caps"], data["cap_lens"], data["txt2img"]
    rows = txt2img if dense[0] is not None else None
    per_caption = (None, None) if rows is None else (dense[0][rows], dense[1][rows])
    with torch.no_grad():
        forward = m(img, caps, lens, *per_caption).sims
    engine = score_matrix(m, img, caps, lens, *dense, txt2img=txt2img if rows is not None else None)
    assert _max_diff(forward, case["scores"]) <= 1e-12
    assert _max_diff(engine, case["scores"]) <= ENGINE_TOL
    # float32 against the official code run in float32
    m.float()
    f32 = [t.float() if t is not None and t.is_floating_point() else t for t in per_caption]
    with torch.no_grad():
        forward32 = m(img.float(), caps.float(), lens, *f32).sims
    assert _max_diff(forward32, case["scores_fp32"]) <= 1e-5
