"""SEPS/LAPS matchers: exactness against per-caption reference loops, shapes, gradients, ratio loss."""

from __future__ import annotations

import math

import pytest
import torch

from matcher_support import seeded_matcher
from patchword.matching import build_matcher
from patchword.matching.seps import VARIANT_PRESETS
from patchword.testing import seps_reference_scores
from patchword.testing.seps_independent import SEPSOptions, independent_seps_scores

# (num_patches, has_cls, sparse_ratio, aggr_ratio): ViT-B/16-224 (197 tokens) and Swin-B-224 (49)
SHAPES = {"vit": (196, True, 0.5, 0.4), "swin": (49, False, 0.8, 0.6)}


def _inputs(n_patches, has_cls, dim=64, b_v=5, b_t=6, dense_batch=None, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b_v, n_patches + int(has_cls), dim, generator=g, dtype=dtype)
    caps = torch.randn(b_t, 12, dim, generator=g, dtype=dtype)
    lens = torch.tensor([12, 9, 3, 7, 12, 5][:b_t])
    dense = torch.randn(dense_batch or b_v, 30, dim, generator=g, dtype=dtype)
    dense_lens = torch.randint(5, 31, (dense.shape[0],), generator=g)
    return img, caps, lens, dense, dense_lens


def _matcher(kind, variant="code", dim=64, **kw):
    return seeded_matcher("seps", SHAPES[kind], dim, variant=variant, **kw)


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("dense", [None, "image", "caption"])
def test_code_variant_matches_official_loop(kind, dense):
    m = _matcher(kind, dense_pairing=dense or "image")
    n, has_cls, *_ = SHAPES[kind]
    img, caps, lens, d, dl = _inputs(n, has_cls, dense_batch=6 if dense == "caption" else None)
    args = (d, dl) if dense else (None, None)
    with torch.no_grad():
        got = m(img, caps, lens, *args).sims
        want = seps_reference_scores(m, img, caps, lens, *args)  # the pairing: the matcher's
    assert got.shape == (5, 6) and got.dtype == torch.float32
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("dense", [None, "image", "caption"])
def test_paper_variant_matches_reference(kind, dense):
    m = _matcher(kind, variant="paper", dense_pairing=dense or "image")
    n, has_cls, *_ = SHAPES[kind]
    img, caps, lens, d, dl = _inputs(n, has_cls, dense_batch=6 if dense == "caption" else None, seed=3)
    args = (d, dl) if dense else (None, None)
    with torch.no_grad():
        got = m(img, caps, lens, *args).sims
        want = seps_reference_scores(m, img, caps, lens, *args)  # the pairing: the matcher's
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("variant", ["code", "paper"])
@pytest.mark.parametrize("pairing", ["image", "caption"])
def test_both_references_score_the_matchers_dense_pairing_when_not_told_one(variant, pairing):
    """Old code: ``seps_reference_scores`` paired dense text with images and ``independent_seps_scores`` with
    captions whatever the matcher was built with: one of them was 0.2 off its forward, without a word. Both
    now take the matcher's ``dense_pairing`` (the independent one given the matcher itself as weights)."""
    m = _matcher("vit", variant=variant, dense_pairing=pairing)
    n, has_cls, rho, aggr = SHAPES["vit"]
    img, caps, lens, d, dl = _inputs(n, has_cls, dense_batch=6 if pairing == "caption" else None, seed=5)
    opt = SEPSOptions(sparse_ratio=rho, aggr_ratio=aggr, num_patches=n, variant=variant)
    with torch.no_grad():
        forward = m(img, caps, lens, d, dl).sims
    assert (seps_reference_scores(m, img, caps, lens, d, dl) - forward).abs().max() <= 1e-5
    assert (independent_seps_scores(opt, m, img, caps, lens, d, dl) - forward).abs().max() <= 1e-5
    # an explicit pairing still scores that protocol, whatever the matcher's
    other = "image" if pairing == "caption" else "caption"
    m_other = _matcher("vit", variant=variant, dense_pairing=other)
    d2, dl2 = _inputs(n, has_cls, dense_batch=6 if other == "caption" else None, seed=5)[3:]
    with torch.no_grad():
        forward_other = m_other(img, caps, lens, d2, dl2).sims
    assert (
        seps_reference_scores(m, img, caps, lens, d2, dl2, dense_pairing=other) - forward_other
    ).abs().max() <= 1e-5
    independent = independent_seps_scores(opt, m, img, caps, lens, d2, dl2, dense_pairing=other)
    assert (independent - forward_other).abs().max() <= 1e-5


def test_the_references_refuse_a_dense_pairing_they_cannot_know_or_that_contradicts_dense_index():
    """Raw tensors carry no pairing: with dense text and none given, the independent reference refuses
    (old code: caption, silently). A ``dense_index`` gives captions dense rows: ``"image"`` contradicts it."""
    m = _matcher("vit", dense_pairing="image")
    n, has_cls, rho, aggr = SHAPES["vit"]
    img, caps, lens, d, dl = _inputs(n, has_cls)
    opt = SEPSOptions(sparse_ratio=rho, aggr_ratio=aggr, num_patches=n)
    with pytest.raises(ValueError, match="no dense_pairing"):
        independent_seps_scores(opt, m.state_dict(), img, caps, lens, d, dl)
    index = torch.arange(6) % 5
    with pytest.raises(ValueError, match="needs dense_pairing='caption'"):
        seps_reference_scores(m, img, caps, lens, d, dl, dense_pairing="image", dense_index=index)
    with pytest.raises(ValueError, match="needs dense_pairing='caption'"):
        independent_seps_scores(opt, m, img, caps, lens, d, dl, dense_pairing="image", dense_index=index)
    for ref in (lambda **kw: seps_reference_scores(m, img, caps, lens, d, dl, **kw),
                lambda **kw: independent_seps_scores(opt, m, img, caps, lens, d, dl, **kw)):  # fmt: skip
        with pytest.raises(ValueError, match="must be 'image' or 'caption'|must be 'caption' or 'image'"):
            ref(dense_pairing="images")
    # a dense_index alone implies caption pairing: both agree with the caption-tied forward
    caption = _matcher("vit", dense_pairing="caption")
    with torch.no_grad():
        forward = caption(img, caps, lens, d[index], dl[index]).sims
    assert (seps_reference_scores(m, img, caps, lens, d, dl, dense_index=index) - forward).abs().max() <= 1e-5
    independent = independent_seps_scores(opt, m.state_dict(), img, caps, lens, d, dl, dense_index=index)
    assert (independent - forward).abs().max() <= 1e-5


def test_laps_is_seps_without_dense_and_official_shapes():
    laps = _matcher("vit")
    m = build_matcher("laps", embed_dim=512, num_patches=196, has_cls=True)
    assert m.config.use_dense is False and m.num_keep == 98
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {
        "aggr_net.weight.0.weight": (512,),
        "aggr_net.weight.0.bias": (512,),
        "aggr_net.weight.1.weight": (102, 512),
        "aggr_net.weight.1.bias": (102,),
        "aggr_net.weight.3.weight": (39, 102),
        "aggr_net.weight.3.bias": (39,),
        "aggr_net.scale": (1,),
    }
    img, caps, lens, d, dl = _inputs(196, True)
    lp = build_matcher("laps", embed_dim=64, num_patches=196, has_cls=True)
    lp.load_state_dict(laps.state_dict())
    assert torch.allclose(lp(img, caps, lens, d, dl).sims, laps(img, caps, lens).sims)


@pytest.mark.parametrize(
    "n,rho,aggr,k,nc",
    [(196, 0.5, 0.4, 98, 39), (49, 0.8, 0.6, 40, 23), (576, 0.5, 0.4, 288, 115), (144, 0.8, 0.6, 116, 69)],
)
def test_token_counts_follow_official_table(n, rho, aggr, k, nc):
    m = build_matcher("seps", embed_dim=32, num_patches=n, sparse_ratio=rho, aggr_ratio=aggr)
    assert m.num_keep == k == math.ceil(n * rho)
    assert m.aggr_net.num_out == nc


def test_caption_chunking_is_exact():
    m = _matcher("vit", dense_pairing="caption")
    img, caps, lens, d, dl = _inputs(196, True, dense_batch=6)
    full = m(img, caps, lens, d, dl).sims
    m.config.caption_chunk = 4
    assert torch.allclose(m(img, caps, lens, d, dl).sims, full, atol=1e-6)


def test_image_tied_dense_term_is_caption_independent():
    """Code variant with leak-free dense text: the dense branch adds a per-image constant."""
    seps = _matcher("vit")
    laps = build_matcher("laps", embed_dim=64, num_patches=196, has_cls=True).eval()
    laps.load_state_dict(seps.state_dict())
    img, caps, lens, d, dl = _inputs(196, True)
    with torch.no_grad():
        dense_term = seps(img, caps, lens, d, dl).sims - laps(img, caps, lens).sims
        other_caps = torch.randn_like(caps)
        dense_term_2 = seps(img, other_caps, lens, d, dl).sims - laps(img, other_caps, lens).sims
    assert torch.allclose(dense_term, dense_term[:, :1].expand_as(dense_term), atol=1e-6)
    assert torch.allclose(dense_term, dense_term_2, atol=1e-6)
    assert dense_term.std(dim=0).max() > 1e-3  # but it does differ between images


def test_caption_tied_dense_term_depends_on_caption():
    m = _matcher("vit", dense_pairing="caption")
    laps = build_matcher("laps", embed_dim=64, num_patches=196, has_cls=True).eval()
    laps.load_state_dict(m.state_dict())
    img, caps, lens, d, dl = _inputs(196, True, dense_batch=6)
    with torch.no_grad():
        dense_term = m(img, caps, lens, d, dl).sims - laps(img, caps, lens).sims
    assert dense_term.std(dim=1).min() > 1e-3


@pytest.mark.parametrize("variant", ["code", "paper"])
def test_gradients_reach_patches_through_selection(variant):
    m = _matcher("vit", variant=variant).train()
    img, caps, lens, d, dl = _inputs(196, True)
    img.requires_grad_(True)
    m(img, caps, lens, d, dl).sims.sum().backward()
    patch_grad = img.grad[:, 1:]
    assert patch_grad.abs().sum(dim=-1).gt(0).float().mean() > 0.4  # selected/fused patches all get some
    assert img.grad[:, 0].abs().sum() > 0


def test_detach_selection_reproduces_official_gradient_cut():
    m = _matcher("vit", detach_selection=True).train()
    img, caps, lens, d, dl = _inputs(196, True)
    img.requires_grad_(True)
    m(img, caps, lens, d, dl).sims.sum().backward()
    assert img.grad[:, 1:].abs().max() == 0  # ViT: patches get exactly zero gradient
    assert img.grad[:, 0].abs().sum() > 0  # only through CLS
    assert m.aggr_net.weight[1].weight.grad.abs().sum() > 0  # the aggregation MLP still trains
    swin = _matcher("swin", detach_selection=True).train()
    img, caps, lens, d, dl = _inputs(49, False)
    img.requires_grad_(True)
    out = swin(img, caps, lens, d, dl).sims.sum()
    grads = torch.autograd.grad(out, img, allow_unused=True)
    assert grads[0] is None  # Swin: the backbone would receive no gradient at all


def test_ratio_loss_gradient_only_with_gumbel():
    from patchword.losses import RatioLoss

    img, caps, lens, d, dl = _inputs(196, True)
    paper = _matcher("vit", variant="paper").train()
    out = paper(img, caps, lens, d, dl)
    soft = [dec for dec in out.decisions]
    loss = RatioLoss(0.3, mode=paper.ratio_mode)(soft)
    loss.backward()
    grad = paper.scorer.mlp[0].weight.grad
    assert grad is not None and grad.abs().sum() > 0

    code = _matcher("vit").train()
    out = code(img, caps, lens, d, dl)
    loss = RatioLoss(0.5, mode=code.ratio_mode)(out.decisions)
    assert not loss.requires_grad  # constant: hard top-K masks carry no gradient
    # official SEPS ViT: two masks of 98/196 summed -> (1.0 - 0.5)^2
    assert loss.item() == pytest.approx(0.25)


def test_gumbel_decisions_forward_equal_hard_mask():
    m = _matcher("vit", variant="paper").train()
    img, caps, lens, d, dl = _inputs(196, True)
    out = m(img, caps, lens, d, dl)
    for dec in out.decisions:
        assert torch.equal(dec.detach(), dec.detach().round())
        assert torch.allclose(dec.detach().sum(-1), torch.full(dec.shape[:2], 98.0))


# Switches of the paper preset that change eval scores; gumbel changes the training gradient, ratio_mode the
# ratio loss, and neither the eval scores (hard top-K either way).
SCORE_SWITCHES = ("score_mode", "dense_mode", "aggregation", "hrpa_topk", "similarity")


def test_every_switch_is_independent():
    """Each paper switch, flipped alone on the code variant, leaves the others at their code values and
    changes what it governs; where that is the scores, they equal the independent reference's."""
    from patchword.losses import RatioLoss

    img, caps, lens, d, dl = _inputs(196, True)
    switches = VARIANT_PRESETS["paper"]
    assert set(switches) == {*SCORE_SWITCHES, "gumbel", "ratio_mode"}
    n, _, rho, aggr = SHAPES["vit"]
    base = _matcher("vit")
    with torch.no_grad():
        ref = base(img, caps, lens, d, dl).sims
    base_train = base.train()(img, caps, lens, d, dl).decisions
    base.eval()
    for name, value in switches.items():
        m = _matcher("vit", **{name: value})
        assert getattr(m.config, name) == value
        for other, default in base.config.__dict__.items():
            if other in switches and other != name:
                assert getattr(m.config, other) == default
        with torch.no_grad():
            out = m(img, caps, lens, d, dl).sims
        if name in SCORE_SWITCHES:
            assert (out - ref).abs().max() > 1e-3, name
            opt = SEPSOptions(
                sparse_ratio=rho, aggr_ratio=aggr, num_patches=n, variant="code", **{name: value}
            )
            want = independent_seps_scores(opt, m.state_dict(), img, caps, lens, d, dl, dense_pairing="image")
            assert (out - want).abs().max() <= 1e-5, name
            continue
        assert torch.equal(out, ref), name  # same weights, same hard selection
        decisions = m.train()(img, caps, lens, d, dl).decisions
        if name == "gumbel":
            # The code variant's scores carry no gradient (official no_grad), so its relaxed decisions have
            # none to pass on; with a learned score the straight-through decisions do, hard masks never.
            assert not any(dec.requires_grad for dec in decisions + base_train)
            for gumbel in (True, False):
                learned = _matcher("vit", score_mode="predictor", gumbel=gumbel).train()
                decisions = learned(img, caps, lens, d, dl).decisions
                assert all(dec.requires_grad == gumbel for dec in decisions)
        else:  # ratio_mode: the same masks, another loss
            assert RatioLoss(rho, mode=value)(decisions) != RatioLoss(rho, mode=base.ratio_mode)(base_train)
    paper = _matcher("vit", variant="paper")
    joint = _matcher("vit", variant="paper", joint_score=True)
    with torch.no_grad():
        out = joint(img, caps, lens, d, dl).sims
        assert (out - paper(img, caps, lens, d, dl).sims).abs().max() > 1e-3
    opt = SEPSOptions(sparse_ratio=rho, aggr_ratio=aggr, num_patches=n, variant="paper", joint_score=True)
    want = independent_seps_scores(opt, joint.state_dict(), img, caps, lens, d, dl, dense_pairing="image")
    assert (out - want).abs().max() <= 1e-5


def test_global_embed_and_vse():
    m = _matcher("vit")
    img, caps, lens, *_ = _inputs(196, True)
    gi, gt = m.global_embed(img, caps, lens)
    assert gi.shape == (5, 64) and gt.shape == (6, 64)
    assert torch.allclose(gi.norm(dim=-1), torch.ones(5))
    vse = build_matcher("vse", embed_dim=64)
    sims = vse(img, caps, lens).sims
    assert torch.allclose(sims, gi @ gt.T, atol=1e-6)
    mean_vse = build_matcher("vse", embed_dim=64, pool="mean")
    want = torch.nn.functional.normalize(img.mean(1), dim=-1) @ gt.T
    assert torch.allclose(mean_vse(img, caps, lens).sims, want, atol=1e-6)
    # SEPS with a mean-pooled global embedding: the same vector as VSE's mean pool
    mean_seps = build_matcher("seps", embed_dim=64, num_patches=196, has_cls=True, global_pool="mean")
    assert torch.allclose(mean_seps.global_image(img), torch.nn.functional.normalize(img.mean(1), dim=-1))
    with pytest.raises(ValueError, match="global_pool"):
        build_matcher("seps", embed_dim=64, num_patches=196, global_pool="max")


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: a.update(img=a["img"][:, :100]), "img_tokens"),
        (lambda a: a.update(caps=a["caps"][..., :10]), "cap_tokens"),
        (lambda a: a.update(lens=torch.tensor([13, 9, 3, 7, 12, 5])), "cap_lens"),
        (lambda a: a.update(lens=torch.tensor([12, 9, 3])), "cap_lens"),
        (lambda a: a.update(lens=torch.tensor([12, 9, 0, 7, 12, 5])), "cap_lens"),
        (lambda a: a["img"].__setitem__((0, 3, 3), float("nan")), "img_tokens"),
        (lambda a: a.update(d=a["d"][:2]), "dense_tokens"),
        (lambda a: a["d"].__setitem__((1, 1, 1), float("inf")), "dense_tokens"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(mutate, match):
    m = _matcher("vit")
    img, caps, lens, d, dl = _inputs(196, True)
    a = dict(img=img, caps=caps, lens=lens, d=d, dl=dl)
    mutate(a)
    with pytest.raises(ValueError, match=match):
        m(a["img"], a["caps"], a["lens"], a["d"], a["dl"])


def test_unknown_arguments_and_names():
    with pytest.raises(TypeError, match="sparse_ration"):
        build_matcher("seps", sparse_ration=0.5)
    with pytest.raises(KeyError, match="nope"):
        build_matcher("nope")
    with pytest.raises(ValueError, match="variant"):
        build_matcher("seps", variant="papr")


def test_cls_saliency_ranks_patches_by_their_cosine_with_cls():
    from patchword.matching.selection import image_saliency

    torch.manual_seed(0)
    patches, cls = torch.randn(2, 9, 8), torch.randn(2, 8)
    unit = torch.nn.functional.normalize(patches, dim=-1)
    want = unit @ torch.nn.functional.normalize(cls, dim=-1)[:, :, None]
    assert torch.allclose(image_saliency(patches, unit, cls), want.squeeze(-1), atol=1e-6)
    mean = torch.nn.functional.normalize(patches.mean(1), dim=-1)
    assert torch.allclose(image_saliency(patches, unit), (unit @ mean[:, :, None]).squeeze(-1), atol=1e-6)
    with pytest.raises(ValueError, match="saliency='cls' needs"):
        build_matcher("seps", embed_dim=8, num_patches=49, has_cls=False, saliency="cls")


def test_cls_saliency_carries_no_gradient_when_selection_is_detached():
    """With detach_selection the selection is gradient-free for the image encoder (the official no_grad),
    so CLS must not receive the straight-through gradient of the decisions through s_im either."""
    torch.manual_seed(0)
    m = build_matcher(
        "seps",
        embed_dim=8,
        num_patches=16,
        has_cls=True,
        variant="paper",
        saliency="cls",
        dense_pairing="image",
        detach_selection=True,
    ).train()
    assert m.config.detach_selection and m.config.gumbel
    img = torch.randn(2, 17, 8, requires_grad=True)
    cap, lens = torch.randn(3, 5, 8), torch.tensor([5, 4, 3])
    dense, dense_lens = torch.randn(2, 6, 8), torch.tensor([6, 5])
    decisions = m(img, cap, lens, dense, dense_lens).decisions
    (grad,) = torch.autograd.grad(sum(d.sum() for d in decisions), img, allow_unused=True)
    assert grad is None or torch.count_nonzero(grad) == 0
