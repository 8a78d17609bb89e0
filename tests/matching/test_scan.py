"""SCAN: the vectorised matcher against a straightforward per-caption loop written from the reference notes
(reference/naaf_scan_vse.md 3.1-3.3: ``func_attention``, ``xattn_score_t2i`` / ``xattn_score_i2t``)."""

from __future__ import annotations

import pytest
import torch

from patchword.matching import build_matcher
from patchword.matching.attention import FEATURE_NORMS

# ------------------------------------------------------------------ reference (one caption at a time)


def ref_l2norm(x, dim, eps=1e-8):
    return x / (x.pow(2).sum(dim=dim, keepdim=True).sqrt() + eps)


def ref_cosine(x1, x2, dim, eps=1e-8):
    w12 = (x1 * x2).sum(dim)
    return w12 / (x1.norm(2, dim) * x2.norm(2, dim)).clamp(min=eps)


def ref_raw_norm(attn, kind):
    """``raw_feature_norm`` on (n, sourceL, queryL) scores, along the query axis (dim 2)."""
    if kind == "softmax":
        return torch.softmax(attn, dim=2)
    if kind.startswith("clipped"):
        attn = torch.nn.functional.leaky_relu(attn, 0.1)
    if kind.endswith("l2norm"):
        return ref_l2norm(attn, 2)
    if kind.endswith("l1norm"):
        return attn / (attn.abs().sum(dim=2, keepdim=True) + 1e-8)
    return attn


def ref_func_attention(query, context, smooth, kind):
    """query (n, queryL, d), context (n, sourceL, d) -> weighted context (n, queryL, d)."""
    attn = torch.bmm(context, query.transpose(1, 2))  # (n, sourceL, queryL)
    attn = ref_raw_norm(attn, kind)
    attn = attn.transpose(1, 2)  # (n, queryL, sourceL)
    attn = torch.softmax(attn * smooth, dim=2)
    return torch.bmm(attn, context)


def ref_aggregate(row_sim, agg, lambda_lse):
    if agg == "logsumexp":
        return torch.log(torch.exp(row_sim * lambda_lse).sum(dim=1)) / lambda_lse
    if agg == "max":
        return row_sim.max(dim=1).values
    if agg == "sum":
        return row_sim.sum(dim=1)
    return row_sim.mean(dim=1)


def ref_scan(images, captions, cap_lens, *, direction, agg, lambda_softmax, lambda_lse, kind):
    """The official loop: inputs L2-normalised as by the official encoders."""
    images, captions = ref_l2norm(images, -1), ref_l2norm(captions, -1)
    n_image = images.shape[0]
    columns = []
    for i in range(captions.shape[0]):
        n_word = int(cap_lens[i])
        cap_i = captions[i, :n_word].unsqueeze(0).repeat(n_image, 1, 1)
        if direction == "t2i":
            context = ref_func_attention(cap_i, images, lambda_softmax, kind)
            row_sim = ref_cosine(cap_i, context, 2)  # (n_image, n_word)
        else:
            context = ref_func_attention(images, cap_i, lambda_softmax, kind)
            row_sim = ref_cosine(images, context, 2)  # (n_image, n_region)
        columns.append(ref_aggregate(row_sim, agg, lambda_lse))
    return torch.stack(columns, dim=1)


# ------------------------------------------------------------------ helpers


def _inputs(n_img=5, n_cap=7, n_reg=6, max_len=9, dim=16, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, n_reg, dim, generator=gen, dtype=dtype)
    cap = torch.randn(n_cap, max_len, dim, generator=gen, dtype=dtype)
    lens = torch.randint(2, max_len + 1, (n_cap,), generator=gen)
    lens[0] = max_len
    return img, cap, lens


CASES = [
    ("t2i", "logsumexp", 9.0, 6.0),
    ("t2i", "mean", 9.0, 6.0),
    ("t2i", "max", 9.0, 6.0),
    ("t2i", "sum", 9.0, 6.0),
    ("i2t", "logsumexp", 4.0, 5.0),
    ("i2t", "mean", 4.0, 5.0),
    ("i2t", "max", 4.0, 20.0),
    ("i2t", "sum", 4.0, 20.0),
]


@pytest.mark.parametrize(("direction", "agg", "lambda_softmax", "lambda_lse"), CASES)
def test_scan_equals_official_loop(direction, agg, lambda_softmax, lambda_lse):
    img, cap, lens = _inputs()
    m = build_matcher(
        "scan",
        embed_dim=16,
        direction=direction,
        agg=agg,
        lambda_softmax=lambda_softmax,
        lambda_lse=lambda_lse,
    )
    want = ref_scan(
        img,
        cap,
        lens,
        direction=direction,
        agg=agg,
        lambda_softmax=lambda_softmax,
        lambda_lse=lambda_lse,
        kind="clipped_l2norm",
    )
    got = m(img, cap, lens).sims
    assert got.shape == (5, 7) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", FEATURE_NORMS)
@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_every_feature_norm_equals_the_loop_in_float64(kind, direction):
    img, cap, lens = _inputs(dtype=torch.float64, seed=1)
    m = build_matcher("scan", embed_dim=16, direction=direction, agg="mean", feature_norm=kind)
    want = ref_scan(
        img, cap, lens, direction=direction, agg="mean", lambda_softmax=9.0, lambda_lse=6.0, kind=kind
    )
    got = m(img, cap, lens).sims
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("direction", ["t2i", "i2t"])
def test_padding_and_chunking_do_not_change_scores(direction):
    img, cap, lens = _inputs(seed=2)
    m = build_matcher("scan", embed_dim=16, direction=direction)
    base = m(img, cap, lens).sims
    # garbage in padded positions and extra padding columns
    padded = torch.cat([cap, 50 * torch.randn(cap.shape[0], 4, 16)], dim=1)
    for t, n in enumerate(lens.tolist()):
        padded[t, n:] = 50 * torch.randn(padded.shape[1] - n, 16)
    torch.testing.assert_close(m(img, padded, lens).sims, base, atol=1e-6, rtol=1e-6)
    chunked = build_matcher("scan", embed_dim=16, direction=direction, max_pair_elements=100)
    torch.testing.assert_close(chunked(img, cap, lens).sims, base, atol=1e-6, rtol=1e-6)
    # a caption scored alone equals its column in the batch
    torch.testing.assert_close(m(img, cap[2:3], lens[2:3]).sims[:, 0], base[:, 2], atol=1e-6, rtol=1e-6)


def test_normalised_inputs_pass_through():
    img, cap, lens = _inputs(seed=3)
    unit_img, unit_cap = ref_l2norm(img, -1), ref_l2norm(cap, -1)
    a = build_matcher("scan", embed_dim=16)(img, cap, lens).sims
    b = build_matcher("scan", embed_dim=16, normalize_inputs=False)(unit_img, unit_cap, lens).sims
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_gradients_reach_both_inputs():
    img, cap, lens = _inputs(seed=4)
    img.requires_grad_(True)
    cap.requires_grad_(True)
    build_matcher("scan", embed_dim=16).train()(img, cap, lens).sims.sum().backward()
    assert img.grad is not None and torch.isfinite(img.grad).all() and img.grad.abs().sum() > 0
    assert torch.isfinite(cap.grad).all()
    # padding receives no gradient
    for t, n in enumerate(lens.tolist()):
        assert cap.grad[t, n:].abs().sum() == 0


@pytest.mark.parametrize("name", ["scan", "naaf"])
def test_zero_padding_vectors_keep_gradients_finite(name):
    # a GRU pads with exact zero vectors; their norm has an infinite derivative unless handled
    img, cap, lens = _inputs(seed=5)
    cap = cap.clone()
    for t, n in enumerate(lens.tolist()):
        cap[t, n:] = 0.0
    cap.requires_grad_(True)
    kwargs = {"direction": "i2t"} if name == "scan" else {}
    build_matcher(name, embed_dim=16, **kwargs).train()(img, cap, lens).sims.sum().backward()
    assert torch.isfinite(cap.grad).all()


def test_bad_arguments_raise_clear_errors():
    img, cap, lens = _inputs()
    with pytest.raises(ValueError, match="direction"):
        build_matcher("scan", embed_dim=16, direction="both")
    with pytest.raises(ValueError, match="agg"):
        build_matcher("scan", embed_dim=16, agg="median")
    with pytest.raises(ValueError, match="feature_norm"):
        build_matcher("scan", embed_dim=16, feature_norm="l3norm")
    # value checks (lengths, finiteness) run in eval mode only: in training they would stall the device
    m = build_matcher("scan", embed_dim=16).eval()
    with pytest.raises(ValueError, match="img_tokens"):
        m(img[:, :, :8], cap, lens)
    with pytest.raises(ValueError, match="cap_lens"):
        m(img, cap, lens[:3])
    with pytest.raises(ValueError, match="cap_lens"):
        m(img, cap, torch.full((7,), 99))
    with pytest.raises(ValueError, match="non-finite"):
        m(img.masked_fill(img > 1, float("nan")), cap, lens)
