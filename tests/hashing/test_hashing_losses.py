"""UCMFH losses: InfoNCE (NT-Xent over 2N), the "balanced" variant and HashNet's weighted pairwise loss
on hand-computed batches, against literal ports of the official code, and the constant-factor identity."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from patchword.losses import BalancedInfoNCE, HashNetLoss, InfoNCE

pytestmark = pytest.mark.usefixtures("one_thread")


# Tiny batch (B = 2, tau = 0.5): u1 = (1, 0), u2 = (0, 1), v1 = (1, 0), v2 = (1, 1) (normalised by the loss).
U = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
V = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
E2 = math.exp(2.0)  # exp(cos / tau) for cos = 1
A = math.exp(math.sqrt(2.0))  # exp(cos / tau) for cos = 1/sqrt(2); cos = 0 gives exp(0) = 1


def official_nt_xent(emb_i: torch.Tensor, emb_j: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    """UCMFH metric.ContrastiveLoss.forward, verbatim apart from the batch size taken from the input."""
    batch_size = emb_i.shape[0]
    negatives_mask = (~torch.eye(batch_size * 2, batch_size * 2, dtype=bool)).to(emb_i.dtype)
    z_i = F.normalize(emb_i, dim=1)
    z_j = F.normalize(emb_j, dim=1)
    representations = torch.cat([z_i, z_j], dim=0)
    similarity_matrix = F.cosine_similarity(representations.unsqueeze(1), representations.unsqueeze(0), dim=2)
    sim_ij = torch.diag(similarity_matrix, batch_size)
    sim_ji = torch.diag(similarity_matrix, -batch_size)
    positives = torch.cat([sim_ij, sim_ji], dim=0)
    nominator = torch.exp(positives / temperature)
    denominator = negatives_mask * torch.exp(similarity_matrix / temperature)
    loss_partial = -torch.log(nominator / torch.sum(denominator, dim=1))
    return torch.sum(loss_partial) / (2 * batch_size)


def fork_balanced(emb_i: torch.Tensor, emb_j: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    """UCMFH-PlusPlus ContrastiveLossBalanced.forward (seeds/001), literally (exp of the scaled logits)."""
    b = emb_i.shape[0]
    z_i, z_j = F.normalize(emb_i, dim=1), F.normalize(emb_j, dim=1)
    scaled = z_i @ z_j.t() / temperature
    s1, s0 = float(b), float(b * (b - 1))
    s = s1 + s0
    exp_sim = torch.exp(scaled)
    exp_positive = torch.exp(torch.diag(scaled))
    weighted_neg = (exp_sim.sum(dim=1) - exp_positive) * (s / s0)
    return (-torch.log(exp_positive / (exp_positive + weighted_neg)) * (s / s1)).mean()


def hashnet_official(outputs1, outputs2, label1, label2):
    """HashNet pytorch/src/loss.py pairwise_loss_updated, on CPU."""
    similarity = (torch.mm(label1.float(), label2.float().t()) > 0).float().to(outputs1.dtype)
    dot_product = torch.mm(outputs1, outputs2.t())
    mask_positive = similarity > 0
    mask_negative = similarity <= 0
    exp_loss = (
        torch.log(1 + torch.exp(-torch.abs(dot_product)))
        + torch.clamp(dot_product, min=0)
        - similarity * dot_product
    )
    s1, s0 = mask_positive.float().sum(), mask_negative.float().sum()
    s = s0 + s1
    exp_loss[mask_positive] = exp_loss[mask_positive] * (s / s1)
    exp_loss[mask_negative] = exp_loss[mask_negative] * (s / s0)
    return exp_loss.sum() / s


def test_infonce_hand_value():
    # l(u1) = log((e2 + 1 + a) / e2), l(u2) = log((a + 2) / a), l(v1) = l(u1), l(v2) = log(3a / a).
    lu1 = math.log((E2 + 1 + A) / E2)
    want = (2 * lu1 + math.log((A + 2) / A) + math.log(3.0)) / 4
    assert InfoNCE(0.5)(U, V).item() == pytest.approx(want, abs=1e-12)
    # one-directional control: rows u_i over v_j only
    want_i2t = (math.log((E2 + A) / E2) + math.log((1 + A) / A)) / 2
    assert InfoNCE(0.5, variant="i2t")(U, V).item() == pytest.approx(want_i2t, abs=1e-12)


def test_balanced_hand_value():
    # B = 2: S1 = 2, S0 = 2, S = 4 -> negatives x S/S0 = 2, loss x S/S1 = 2.
    want = 2 * (-math.log(E2 / (E2 + 2 * A)) - math.log(A / (A + 2 * 1.0))) / 2
    assert BalancedInfoNCE(0.5)(U, V).item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("batch", [2, 5, 32])
def test_losses_match_official_code(batch: int):
    gen = torch.Generator().manual_seed(batch)
    u = torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, 16, generator=gen, dtype=torch.float64)
    assert InfoNCE()(u, v).item() == pytest.approx(official_nt_xent(u, v).item(), abs=1e-12)
    assert BalancedInfoNCE()(u, v).item() == pytest.approx(fork_balanced(u, v).item(), abs=1e-11)


def test_balanced_is_a_constant_multiple_of_plain_infonce():
    """Balanced = B * [L_i2t + mean log(p + c(1-p))], c = B/(B-1); gradients parallel, B times longer."""
    batch = 128
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(batch, 64, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(batch, 64, generator=gen, dtype=torch.float64)
    bal = BalancedInfoNCE()(u, v)
    plain = InfoNCE(variant="i2t")(u, v)
    logits = F.normalize(u, dim=1) @ F.normalize(v, dim=1).T / 0.5
    p = logits.softmax(1).diagonal()
    c = batch / (batch - 1)
    assert bal.item() == pytest.approx(batch * (plain + torch.log(p + c * (1 - p)).mean()).item(), rel=1e-12)
    (g_bal,) = torch.autograd.grad(bal, u)
    (g_plain,) = torch.autograd.grad(plain, u)
    cos = F.cosine_similarity(g_bal.flatten(), g_plain.flatten(), dim=0).item()
    assert cos > 0.9999
    assert g_bal.norm().item() / g_plain.norm().item() == pytest.approx(batch, rel=0.01)


def test_hashnet_hand_value():
    h_i = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    h_j = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    y_i = torch.tensor([[1, 0], [0, 1]])
    y_j = torch.tensor([[1, 0], [1, 0]])
    # similar: (0,0), (0,1) with ip 1 -> log(1+e) - 1 each;
    # dissimilar: (1,0) ip 0 -> log 2, (1,1) ip 1 -> log(1+e)
    lp = math.log(1 + math.e)
    want = (lp - 1) + (math.log(2) + lp) / 2
    assert HashNetLoss()(h_i, h_j, y_i, y_j).item() == pytest.approx(want, abs=1e-12)
    assert hashnet_official(h_i, h_j, y_i, y_j).item() == pytest.approx(want, abs=1e-12)
    # alpha scales the inner product (the older pairwise_loss's sigmoid_param = 10 / bits)
    want_half = (math.log(1 + math.exp(0.5)) - 0.5) + (math.log(2) + math.log(1 + math.exp(0.5))) / 2
    assert HashNetLoss(alpha=0.5)(h_i, h_j, y_i, y_j).item() == pytest.approx(want_half, abs=1e-12)


def test_hashnet_matches_official_and_ids():
    gen = torch.Generator().manual_seed(3)
    h_i = torch.tanh(torch.randn(20, 32, generator=gen, dtype=torch.float64) * 3)
    h_j = torch.tanh(torch.randn(20, 32, generator=gen, dtype=torch.float64) * 3)
    y = (torch.rand(20, 5, generator=gen) < 0.3).long()
    assert HashNetLoss()(h_i, h_j, y, y).item() == pytest.approx(
        hashnet_official(h_i, h_j, y, y).item(), rel=1e-6
    )
    ids = torch.arange(20)  # pair relevance: similar only to itself == one-hot labels
    # (the official code computes S/S1 in float32, hence rel=1e-6)
    assert HashNetLoss()(h_i, h_j, ids, ids).item() == pytest.approx(
        hashnet_official(h_i, h_j, torch.eye(20), torch.eye(20)).item(), rel=1e-6
    )
    # one class absent: the mean of the present class (the official code gives the same)
    ones = torch.ones(20, 1, dtype=torch.long)
    assert HashNetLoss()(h_i, h_j, ones, ones).item() == pytest.approx(
        hashnet_official(h_i, h_j, ones, ones).item(), rel=1e-6
    )


@pytest.mark.parametrize("loss", [InfoNCE(), BalancedInfoNCE()])
def test_contrastive_validation(loss):
    with pytest.raises(ValueError, match="at least 2"):
        loss(torch.randn(1, 4), torch.randn(1, 4))
    with pytest.raises(ValueError, match="emb_j"):
        loss(torch.randn(3, 4), torch.randn(2, 4))
    with pytest.raises(ValueError, match="non-finite"):
        loss(torch.full((3, 4), float("nan")), torch.randn(3, 4))
    with pytest.raises(ValueError, match="temperature"):
        type(loss)(temperature=0.0)
