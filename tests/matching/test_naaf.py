"""NAAF: test-time scores against a per-caption loop written from the reference notes (float64, 1e-6), the
training-time formula, the threshold update on a hand-computed case, and the thresholds in the state dict."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from patchword.matching import build_matcher
from patchword.matching.naaf import gaussian_boundary, threshold_update

# ------------------------------------------------------------------ reference (naaf_scan_vse.md 2.1)


def ref_l2norm(x, dim, eps=1e-8):
    return x / (x.pow(2).sum(dim=dim, keepdim=True).sqrt() + eps)


def ref_naaf(images, captions, cap_lens, thres, lambda_softmax=20.0, intra=True):
    """``xattn_score_test`` (intra=True, thres = thres_safe) / the scoring part of ``xattn_score``."""
    images, captions = ref_l2norm(images, -1), ref_l2norm(captions, -1)
    n_image = images.shape[0]
    columns = []
    for i in range(captions.shape[0]):
        n_word = int(cap_lens[i])
        cap_i = captions[i, :n_word].unsqueeze(0)
        cap_i_expand = cap_i.repeat(n_image, 1, 1)
        attn = torch.bmm(cap_i_expand, images.transpose(1, 2))  # (n, L, R)
        attn_i = attn.transpose(1, 2)  # (n, R, L)
        attn_thres = attn - thres
        row_max = attn_thres.max(dim=2).values  # (n, L)
        if intra:
            affinity = torch.softmax(torch.bmm(cap_i, cap_i.transpose(1, 2)) * 5, dim=2)  # (1, L, L)
            gate = torch.bmm(affinity.repeat(n_image, 1, 1), row_max.unsqueeze(-1)).squeeze(-1)
        else:
            gate = row_max
        neg = row_max * (gate < 0).to(row_max.dtype)
        # get_mask_attention: exp(lambda x) over x > 0, l1-normalised with eps 1e-8
        weights = torch.exp(attn_thres.masked_fill(attn_thres <= 0, -1e9) * lambda_softmax)
        weights = weights / (weights.abs().sum(dim=2, keepdim=True) + 1e-8)
        context = torch.bmm(weights, images)
        pos_f = (cap_i_expand * context).sum(2) / context.norm(2, dim=2).clamp(min=1e-8)
        # inter_relations: LeakyReLU, l2norm over the words, softmax over the regions
        relev = ref_l2norm(torch.nn.functional.leaky_relu(attn_i, 0.1), 2).transpose(1, 2)
        relev = torch.softmax(relev * lambda_softmax, dim=2)
        pos_r = (attn * relev).sum(-1)
        columns.append((neg + pos_f + pos_r).mean(dim=1))
    return torch.stack(columns, dim=1)


def _inputs(n_img=6, n_cap=6, n_reg=7, max_len=8, dim=16, dtype=torch.float64, seed=0, aligned=False):
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, n_reg, dim, generator=gen, dtype=dtype)
    lens = torch.randint(3, max_len + 1, (n_cap,), generator=gen)
    lens[0] = max_len
    if aligned:
        # caption j's words are noisy copies of regions of image j: every caption retrieves its image
        pick = torch.randint(0, n_reg, (n_cap, max_len), generator=gen)
        cap = img[torch.arange(n_cap)[:, None], pick] + 0.3 * torch.randn(
            n_cap, max_len, dim, generator=gen, dtype=dtype
        )
    else:
        cap = torch.randn(n_cap, max_len, dim, generator=gen, dtype=dtype)
    return img, cap, lens


# ------------------------------------------------------------------ test-time exactness


@pytest.mark.parametrize("thres_safe", [0.0, 0.12, 0.31])
def test_eval_equals_official_test_time_loop_float64(thres_safe):
    img, cap, lens = _inputs(seed=1)
    m = build_matcher("naaf", embed_dim=16).eval()
    m.threshold_safe.fill_(thres_safe)
    m.threshold.fill_(0.9)  # must not be used at test time
    got = m(img, cap, lens).sims
    want = ref_naaf(img, cap, lens, thres_safe)
    assert got.dtype == torch.float64 and got.shape == (6, 6)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # the comparison is not vacuous: the negative branch and the mask attention are active
    assert (want != ref_naaf(img, cap, lens, 0.0)).any() or thres_safe == 0.0


def test_eval_float32_and_chunking():
    img, cap, lens = _inputs(seed=2, n_img=5, n_cap=9)
    m = build_matcher("naaf", embed_dim=16, max_pair_elements=200).eval()
    m.threshold_safe.fill_(0.2)
    want = ref_naaf(img, cap, lens, 0.2)
    torch.testing.assert_close(m(img.float(), cap.float(), lens).sims.double(), want, atol=1e-5, rtol=0)


def test_lambda_and_large_lambda_stay_finite():
    img, cap, lens = _inputs(seed=3)
    m = build_matcher("naaf", embed_dim=16, lambda_softmax=9.0).eval()
    m.threshold_safe.fill_(0.1)
    torch.testing.assert_close(
        m(img, cap, lens).sims, ref_naaf(img, cap, lens, 0.1, lambda_softmax=9.0), atol=1e-6, rtol=0
    )
    # the official exp(lambda x) overflows float32 for lambda x > 88; the shifted form does not
    big = build_matcher("naaf", embed_dim=16, lambda_softmax=500.0).eval()
    assert torch.isfinite(big(img.float(), cap.float(), lens).sims).all()


def test_training_scores_use_threshold_without_intra_relation():
    img, cap, lens = _inputs(seed=4)
    m = build_matcher("naaf", embed_dim=16, update_threshold=False).train()
    m.threshold.fill_(0.15)
    m.threshold_safe.fill_(0.5)
    torch.testing.assert_close(
        m(img, cap, lens).sims, ref_naaf(img, cap, lens, 0.15, intra=False), atol=1e-6, rtol=0
    )
    assert float(m.threshold) == 0.15  # no update when disabled


# ------------------------------------------------------------------ threshold update


def test_gaussian_boundary_matches_the_reference_example():
    # reference 2.2: mu+ = .6, sigma+ = .12, mu- = .3, sigma- = .1 -> t* = .4707 (alpha 2), .4436 (alpha 1)
    args = [torch.tensor(v, dtype=torch.float64) for v in (0.6, 0.12, 0.3, 0.1)]
    t2, e2 = gaussian_boundary(*args, alpha=2.0)
    t1, _ = gaussian_boundary(*args, alpha=1.0)
    assert float(e2) > 0
    assert float(t2) == pytest.approx(0.4707, abs=5e-5) and float(t1) == pytest.approx(0.4436, abs=5e-5)

    def density(t, mu, sd):
        return math.exp(-((t - mu) ** 2) / (2 * sd * sd)) / sd

    assert density(float(t2), 0.6, 0.12) == pytest.approx(2 * density(float(t2), 0.3, 0.1), rel=1e-6)


def _hand_update(pos, neg, old_t, old_safe, alpha=2.0, blend=0.7):
    """The official update in plain Python: statistics, quadratic root, clamp, blend."""
    mp, sp = statistics.mean(pos), statistics.stdev(pos)  # stdev: unbiased, as torch.std
    mn, sn = statistics.mean(neg), statistics.stdev(neg)
    a = sp**2 - sn**2
    b = 2 * (mp * sn**2 - mn * sp**2)
    c = (mn * sp) ** 2 - (mp * sn) ** 2 + 2 * (sp * sn) ** 2 * math.log(sn / (alpha * sp) + 1e-8)
    e = b * b - 4 * a * c
    t, safe = old_t, old_safe
    if e > 0:
        t, safe = (-b + math.sqrt(e)) / (2 * a + 1e-10), mp - 3 * sp
    t = 0.0 if (t < 0 or t > 1) else t
    safe = 0.0 if (safe < 0 or safe > 1) else safe
    return blend * t + (1 - blend) * old_t, blend * safe + (1 - blend) * old_safe, (mp, sp, mn, sn)


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


def _samples(n, mean, spread, phase):
    return [mean + spread * math.sin(0.7 * k + phase) for k in range(n)]


def test_threshold_update_hand_case():
    pos, neg = _samples(210, 0.62, 0.15, 0.0), _samples(210, 0.28, 0.12, 1.0)
    want_t, want_safe, (mp, sp, mn, sn) = _hand_update(pos, neg, 0.2, 0.05)
    assert 0 < want_t < 1 and 0 < mp - 3 * sp < 1  # an interior case: no clamping
    out = threshold_update(
        _f64(pos), _f64(neg), torch.tensor(0.2, dtype=torch.float64), torch.tensor(0.05, dtype=torch.float64)
    )
    assert float(out["threshold"]) == pytest.approx(want_t, abs=1e-9)
    assert float(out["threshold_safe"]) == pytest.approx(want_safe, abs=1e-9)
    for key, value in zip(("mean_pos", "std_pos", "mean_neg", "std_neg"), (mp, sp, mn, sn), strict=True):
        assert float(out[key]) == pytest.approx(value, abs=1e-9)
    assert float(out["num_samples"]) == 210 and float(out["fitted"]) == 1.0


def test_threshold_update_clamps_out_of_range_values_to_zero():
    # wide positives: mu+ - 3 sigma+ < 0 -> 0; the root lands above 1 -> 0 (not 1, as official)
    pos, neg = _samples(250, 0.5, 0.45, 0.3), _samples(250, 1.3, 0.05, 0.0)
    want_t, want_safe, (mp, sp, _, _) = _hand_update(pos, neg, 0.4, 0.3)
    root, e = gaussian_boundary(
        *(_f64(v) for v in (mp, sp, statistics.mean(neg), statistics.stdev(neg))), 2.0
    )
    assert float(e) > 0 and float(root) > 1 and mp - 3 * sp < 0  # both values leave [0, 1]
    out = threshold_update(
        _f64(pos), _f64(neg), torch.tensor(0.4, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
    )
    # clamped to 0, then blended with the old values: 0.7 * 0 + 0.3 * old
    assert want_t == pytest.approx(0.3 * 0.4) and want_safe == pytest.approx(0.3 * 0.3)
    assert float(out["threshold"]) == pytest.approx(0.3 * 0.4, abs=1e-12)
    assert float(out["threshold_safe"]) == pytest.approx(0.3 * 0.3, abs=1e-12)


def test_threshold_update_sample_count_rule():
    old = (torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64))
    pos, neg = _f64(_samples(300, 0.6, 0.1, 0.0)), _f64(_samples(300, 0.3, 0.1, 1.0))
    mask = torch.zeros(300, dtype=torch.bool)
    mask[:150] = True  # N < 200: reset to 0 (official)
    out = threshold_update(pos, neg, *old, mask=mask)
    assert (
        float(out["threshold"]) == 0.0 and float(out["threshold_safe"]) == 0.0 and float(out["fitted"]) == 0
    )
    kept = threshold_update(pos, neg, *old, mask=mask, reset_below_min=False)
    assert float(kept["threshold"]) == 0.3 and float(kept["threshold_safe"]) == 0.2
    mask[:200] = True  # N == 200: neither update nor reset
    same = threshold_update(pos, neg, *old, mask=mask)
    assert float(same["threshold"]) == 0.3 and float(same["threshold_safe"]) == 0.2
    mask[:201] = True  # N > 200: re-fit on the masked samples only
    fit = threshold_update(pos, neg, *old, mask=mask)
    want_t, want_safe, _ = _hand_update(pos[:201].tolist(), neg[:201].tolist(), 0.3, 0.2)
    assert float(fit["threshold"]) == pytest.approx(want_t, abs=1e-9)
    assert float(fit["threshold_safe"]) == pytest.approx(want_safe, abs=1e-9)


def test_training_forward_mines_and_updates_like_a_per_caption_reference():
    img, cap, lens = _inputs(seed=5, n_img=8, n_cap=8, aligned=True)
    m = build_matcher("naaf", embed_dim=16, min_samples=20).train()
    m.threshold.fill_(0.1)
    m.threshold_safe.fill_(0.05)
    out = m(img, cap, lens)
    sims = ref_naaf(img, cap, lens, 0.1, intra=False)
    torch.testing.assert_close(out.sims, sims, atol=1e-6, rtol=0)  # scored with the pre-update threshold
    assert float(m.threshold) == 0.1  # the forward alone changes nothing
    m.update_from_batch(out.sims, out.extras["row_max"], lens)
    # per caption: sampled when its own image ranks first; negatives from the least similar image
    unit_img, unit_cap = ref_l2norm(img, -1), ref_l2norm(cap, -1)
    pos, neg = [], []
    for i in range(8):
        if int(sims[:, i].argmax()) != i:
            continue
        words = unit_cap[i, : int(lens[i])]
        pos += (words @ unit_img[i].T).max(dim=1).values.tolist()
        neg += (words @ unit_img[int(sims[:, i].argmin())].T).max(dim=1).values.tolist()
    assert len(pos) > 20
    want_t, want_safe, _ = _hand_update(pos, neg, 0.1, 0.05)
    assert float(m.threshold) == pytest.approx(want_t, abs=1e-9)
    assert float(m.threshold_safe) == pytest.approx(want_safe, abs=1e-9)
    assert float(m.num_samples) == len(pos) and float(m.num_fits) == 1
    # evaluation never updates
    before = m.state_dict()
    m.eval()(img, cap, lens)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_mining_is_independent_of_caption_chunks():
    img, cap, lens = _inputs(seed=8, n_img=8, n_cap=8, aligned=True)
    lens[:4] = 8  # long and short captions in different chunks: chunk widths differ
    lens[4:] = 4
    states = []
    for max_pair in (0, 60):
        m = build_matcher("naaf", embed_dim=16, min_samples=20, max_pair_elements=max_pair).train()
        out = m(img, cap, lens)
        m.update_from_batch(out.sims, out.extras["row_max"], lens)
        states.append(m.state_dict())
    assert all(torch.allclose(states[0][k], states[1][k], equal_nan=True) for k in states[0])
    assert float(states[0]["num_fits"]) == 1


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_repeated_image_is_the_own_image_of_all_its_captions_whichever_copy_ranks_first(sign):
    """Captions 1 and 3 share image 1, drawn twice into the batch. Its two copies score equally up to
    rounding (another CPU, another process split); which copy ranks first must not change what is sampled.
    Comparing batch positions, as the official code does, samples caption 1 or caption 3 by that rounding."""
    img, cap, lens = _inputs(seed=5, n_img=8, n_cap=8, aligned=True)
    cap[3] = cap[1].flip(0)  # another caption of image 1
    lens[3] = lens[1]
    img[3] = img[1] + sign * 1e-10 * cap[1, :7]  # the second copy, off by "rounding" one way or the other
    m = build_matcher("naaf", embed_dim=16, min_samples=1).train()
    out = m(img, cap, lens)
    assert (out.sims[1, [1, 3]] - out.sims[3, [1, 3]]).abs().max() < 1e-9
    ids = torch.tensor([0, 1, 2, 1, 4, 5, 6, 7])
    m.update_from_batch(out.sims, out.extras["row_max"], lens, image_ids=ids)
    # both captions of image 1 are sampled: every correctly ranked caption, copies as one image
    ranked = [j for j in range(8) if int(ids[out.sims[:, j].argmax()]) == int(ids[j])]
    assert {1, 3} <= set(ranked)
    assert float(m.num_samples) == sum(int(lens[j]) for j in ranked) == 50
    # by batch position (no ids) the copies' order decides: both captions in or both out
    by_position = build_matcher("naaf", embed_dim=16, min_samples=1).train()
    by_position.update_from_batch(out.sims, out.extras["row_max"], lens)
    assert float(by_position.num_samples) == (50 if sign > 0 else 38)


def test_the_threshold_update_refuses_a_batch_that_is_not_square():
    img, cap, lens = _inputs(seed=5, n_img=6, n_cap=8)
    m = build_matcher("naaf", embed_dim=16).train()
    out = m(img, cap, lens)
    with pytest.raises(ValueError, match="square batch"):
        m.update_from_batch(out.sims, out.extras["row_max"], lens)


def test_gradient_flows_and_thresholds_have_none():
    img, cap, lens = _inputs(seed=6, dtype=torch.float32)
    img.requires_grad_(True)
    m = build_matcher("naaf", embed_dim=16).train()
    m(img, cap, lens).sims.sum().backward()
    assert img.grad is not None and torch.isfinite(img.grad).all()
    assert not m.threshold.requires_grad and list(m.parameters()) == []


# ------------------------------------------------------------------ persistence


def test_thresholds_survive_save_and_load(tmp_path):
    img, cap, lens = _inputs(seed=7)
    m = build_matcher("naaf", embed_dim=16).eval()
    m.threshold.fill_(0.4123456789)
    m.threshold_safe.fill_(0.2718281828)
    state = m.state_dict()
    assert {"threshold", "threshold_safe"} <= set(state) and state["threshold"].dtype == torch.float64
    torch.save(state, tmp_path / "naaf.pt")
    fresh = build_matcher("naaf", embed_dim=16).eval()
    assert float(fresh.threshold_safe) == 0.0
    fresh.load_state_dict(torch.load(tmp_path / "naaf.pt", weights_only=True))
    assert float(fresh.threshold) == 0.4123456789 and float(fresh.threshold_safe) == 0.2718281828
    torch.testing.assert_close(fresh(img, cap, lens).sims, m(img, cap, lens).sims, atol=0, rtol=0)
    # dtype casts keep the exact float64 value
    fresh.float()
    assert fresh.threshold_safe.dtype == torch.float64 and float(fresh.threshold_safe) == 0.2718281828


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="intra_relation"):
        build_matcher("naaf", embed_dim=16, intra_relation="sometimes")
    with pytest.raises(ValueError, match="blend"):
        build_matcher("naaf", embed_dim=16, blend=1.5)
    with pytest.raises(ValueError, match="pos and neg"):
        threshold_update(torch.zeros(3), torch.zeros(4), torch.tensor(0.0), torch.tensor(0.0))
    img, cap, lens = _inputs()
    with pytest.raises(ValueError, match="cap_tokens"):
        build_matcher("naaf", embed_dim=16)(img, cap[:, :, :4], lens)
