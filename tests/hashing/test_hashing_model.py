"""UCMFH model: unimodal codes (default) do not depend on the other modality or on the batch; the
official fused mode reproduces the official leakage; hash heads equal the official MLPs in sign."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from patchword.hashing import UCMFH

pytestmark = pytest.mark.usefixtures("one_thread")


D_IMG, D_TXT, BITS = 16, 24, 32
SMALL = {"dim_feedforward": 32, "hidden": 64}


def batch(seed: int, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, D_IMG, generator=gen), torch.randn(n, D_TXT, generator=gen)


def test_unimodal_codes_ignore_the_other_modality():
    torch.manual_seed(0)
    model = UCMFH(D_IMG, D_TXT, BITS, **SMALL).eval()
    img, txt = batch(1)
    _, other_txt = batch(2)
    other_img, _ = batch(3)
    out_a, out_b = model(img, txt), model(img, other_txt)
    assert torch.equal(out_a.img_hash, out_b.img_hash) and not torch.equal(out_a.txt_hash, out_b.txt_hash)
    assert torch.equal(model(img, txt).txt_hash, model(other_img, txt).txt_hash)
    codes_a, _ = model.encode_pairs(img, txt)
    codes_b, _ = model.encode_pairs(img, other_txt)
    assert torch.equal(UCMFH.codes(codes_a), UCMFH.codes(codes_b))


def test_unimodal_codes_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    model = UCMFH(D_IMG, D_TXT, BITS, **SMALL).eval()
    img, txt = batch(4, 20)
    full = model.encode_image(img)
    torch.testing.assert_close(model.encode_image(img[5:9]), full[5:9], rtol=0, atol=1e-6)
    torch.testing.assert_close(model.encode_image(img, batch_size=3), full, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        model.encode_text(txt.flip(0)).flip(0), model.encode_text(txt), rtol=0, atol=1e-6
    )


def test_unimodal_training_graph_has_no_cross_modal_path():
    torch.manual_seed(0)
    model = UCMFH(D_IMG, D_TXT, BITS, **SMALL).train()  # dropout on
    img, txt = batch(5)
    txt.requires_grad_(True)
    img.requires_grad_(True)
    out = model(img, txt)
    (g_txt, g_img_other) = torch.autograd.grad(
        out.img_hash.sum(), [txt, img], allow_unused=True, retain_graph=True
    )
    assert g_txt is None and g_img_other is not None
    # and sample i's code has no gradient from sample j != i
    (g,) = torch.autograd.grad(out.img_hash[0].sum(), img)
    assert torch.count_nonzero(g[1:]) == 0


def test_official_fused_mode_leaks_as_documented():
    torch.manual_seed(0)
    model = UCMFH(D_IMG, D_TXT, BITS, fusion="official_fused", nhead=4, **SMALL).eval()
    img, txt = batch(6, 10)
    _, other_txt = batch(7, 10)
    # the image code depends on the paired text ...
    a, _ = model.encode_pairs(img, txt)
    b, _ = model.encode_pairs(img, other_txt)
    assert (a - b).abs().max() > 1e-4
    # ... and on the other samples of the evaluation block (2-D input = one sequence of B tokens)
    c, _ = model.encode_pairs(img[:5], txt[:5])
    assert (a[:5] - c).abs().max() > 1e-4
    # training path: (1, B, D), sequence length 1, so samples do not mix
    perturbed = img.clone()
    perturbed[0] += 1.0
    torch.testing.assert_close(model(img, txt).img_hash[1:], model(perturbed, txt).img_hash[1:])
    with pytest.raises(ValueError, match="unimodal"):
        model.encode_image(img)


def test_official_fused_matches_official_modules():
    """Same weights -> same values as official FuseTransEncoder + ImageMlp (evaluation-time call)."""
    torch.manual_seed(0)
    model = UCMFH(D_IMG, D_IMG, BITS, fusion="official_fused", nhead=4, **SMALL).eval()
    img, _ = batch(8)
    txt = torch.randn(img.shape[0], D_IMG)
    tokens = torch.cat([img, txt], dim=1)
    enc = model.fuse_encoder(tokens)  # official: self.transformerEncoder(tokens), 2-D at evaluation
    enc = F.normalize(enc.reshape(-1, 2 * D_IMG), p=2, dim=1)
    head = model.image_head
    x = F.normalize(enc[:, :D_IMG], p=2, dim=1)
    official = F.normalize(torch.tanh(head.tohash(head.dropout(F.relu(head.fc1(x))))), p=2, dim=1)
    ours, _ = model.encode_pairs(img, txt)
    torch.testing.assert_close(F.normalize(ours, dim=1), official)
    assert torch.equal(torch.sign(official), UCMFH.codes(ours))


def test_default_shapes_and_errors():
    model = UCMFH(512, 512, 16)
    assert model.fusion == "unimodal" and model.image_head.fc1.out_features == 4096
    assert isinstance(model.image_encoder.layers[0].self_attn, torch.nn.MultiheadAttention)
    with pytest.raises(ValueError, match="fusion"):
        UCMFH(8, 8, 16, fusion="fused")
    with pytest.raises(ValueError, match="nhead"):
        UCMFH(6, 8, 16, nhead=4)
    small = UCMFH(D_IMG, D_TXT, BITS, **SMALL)
    with pytest.raises(ValueError, match="image"):
        small.encode_image(torch.randn(3, D_IMG + 1))
    with pytest.raises(ValueError, match="pairs"):
        small(torch.randn(3, D_IMG), torch.randn(4, D_TXT))
