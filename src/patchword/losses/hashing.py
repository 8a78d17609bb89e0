"""UCMFH's hashing losses: InfoNCE (SimCLR's NT-Xent), the "balanced" InfoNCE variant and HashNet's
weighted pairwise loss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from patchword._validation import check_tensor

__all__ = ["InfoNCE", "BalancedInfoNCE", "HashNetLoss"]


def _check_pair(emb_i: torch.Tensor, emb_j: torch.Tensor, names: tuple[str, str]) -> int:
    """Validate two (B, C) embedding batches of the same B pairs; returns B."""
    check_tensor(emb_i, names[0], ndim=2)
    check_tensor(emb_j, names[1], shape=tuple(emb_i.shape))
    batch = emb_i.shape[0]
    if batch < 2:
        raise ValueError(f"{names[0]} must hold at least 2 samples (a contrastive batch), got {batch}")
    return batch


class InfoNCE(nn.Module):
    """UCMFH's contrastive loss: SimCLR's NT-Xent over the 2N views of N image-text pairs (official default).

    With ``z = [norm(u_1..u_N); norm(v_1..v_N)]`` (``u`` image, ``v`` text) and ``s_ab = z_a . z_b``::

        l_a = -log( exp(s_{a, a+-N} / tau) / sum_{b != a} exp(s_ab / tau) ),   L = mean_a l_a   (2N terms)

    so both directions are used and the negatives of an image include the other *images* of the batch
    (intra-modal negatives). This is exactly official ``metric.ContrastiveLoss`` (tau 0.5), except that
    it accepts any batch size (the official class hard-codes 128, hence its ``drop_last``) and uses a
    log-sum-exp, which is the same value without overflow for small temperatures.

    ``variant="i2t"`` is the plain one-directional cross-modal InfoNCE, ``mean_i -log softmax_j(u_i . v_j
    / tau)[i]`` (no intra-modal negatives, no text->image term). It is :class:`BalancedInfoNCE` without
    its weights, i.e. the control arm that isolates what the "balancing" changes (docs/hashing.md).

    Args:
        temperature: tau (> 0).
        variant: ``"nt_xent"`` (official) or ``"i2t"``.
    """

    VARIANTS = ("nt_xent", "i2t")

    def __init__(self, temperature: float = 0.5, variant: str = "nt_xent") -> None:
        super().__init__()
        temperature = float(temperature)
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        if variant not in self.VARIANTS:
            raise ValueError(f"variant must be one of {self.VARIANTS}, got {variant!r}")
        self.temperature = temperature
        self.variant = variant

    def forward(self, emb_i: torch.Tensor, emb_j: torch.Tensor) -> torch.Tensor:
        """Loss of one batch.

        Args:
            emb_i: (B, C) image-side embeddings or continuous codes (any norm; normalised here).
            emb_j: (B, C) text-side embeddings of the same B pairs (row i pairs with row i).

        Returns:
            Scalar tensor.
        """
        batch = _check_pair(emb_i, emb_j, ("emb_i", "emb_j"))
        z_i = F.normalize(emb_i, dim=1)
        z_j = F.normalize(emb_j, dim=1)
        if self.variant == "i2t":
            logits = z_i @ z_j.T / self.temperature
            return F.cross_entropy(logits, torch.arange(batch, device=logits.device))
        z = torch.cat([z_i, z_j], dim=0)  # (2B, C)
        logits = z @ z.T / self.temperature
        # Self-similarity is never a candidate; -inf drops it from the log-sum-exp exactly.
        logits = logits.masked_fill(torch.eye(2 * batch, dtype=torch.bool, device=logits.device), -math.inf)
        # built on the device: a host tensor copied over makes the host wait for the device every step
        target = torch.arange(2 * batch, device=logits.device).roll(batch)
        return F.cross_entropy(logits, target)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, variant={self.variant!r}"


class BalancedInfoNCE(nn.Module):
    """The "balanced" InfoNCE of UCMFH-PlusPlus (``ContrastiveLossBalanced``, seeds/001), reproduced exactly.

    On the (B, B) image-to-text cosine matrix ``s`` (positives on the diagonal) it counts S1 = B positive
    and S0 = B(B-1) negative pairs, S = S1 + S0 = B^2, scales the negatives inside the log by S/S0 and the
    loss by S/S1::

        L = mean_i (S/S1) * -log( e^{s_ii/tau} / (e^{s_ii/tau} + (S/S0) * sum_{j != i} e^{s_ij/tau}) )

    In an unsupervised batch the counts are fixed by B, so this is *not* an adaptive reweighting: with
    p_i the softmax probability of the positive, ``L = B * [L_i2t + mean_i log(p_i + c (1 - p_i))]`` with
    ``c = B/(B-1)``, i.e. B times the plain one-directional InfoNCE (``InfoNCE(variant="i2t")``) plus a
    term below ``B * log(c) ~ 1``. Its gradient is parallel to the plain loss's (measured cosine ~1) and
    B times longer, which Adam's per-parameter normalisation cancels. What actually differs from the
    official :class:`InfoNCE` is the dropped text->image direction and intra-modal negatives
    (docs/hashing.md has the derivation and the measured experiment).

    Args:
        temperature: tau (> 0), 0.5 as in the fork.
    """

    def __init__(self, temperature: float = 0.5) -> None:
        super().__init__()
        temperature = float(temperature)
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        self.temperature = temperature

    def forward(self, emb_i: torch.Tensor, emb_j: torch.Tensor) -> torch.Tensor:
        """Loss of one batch.

        Args:
            emb_i: (B, C) image-side embeddings or continuous codes (normalised here).
            emb_j: (B, C) text-side embeddings of the same B pairs.

        Returns:
            Scalar tensor.
        """
        batch = _check_pair(emb_i, emb_j, ("emb_i", "emb_j"))
        logits = F.normalize(emb_i, dim=1) @ F.normalize(emb_j, dim=1).T / self.temperature  # (B, B)
        s1 = float(batch)
        s0 = float(batch * (batch - 1))
        total = s1 + s0
        eye = torch.eye(batch, dtype=torch.bool, device=logits.device)
        # log(e^pos + w0 * sum_neg e^neg) as one log-sum-exp: adding log(w0) to the negatives is the
        # fork's multiplication by S/S0, without its exp overflow risk for small temperatures.
        shifted = torch.where(eye, logits, logits + math.log(total / s0))
        per_sample = torch.logsumexp(shifted, dim=1) - logits.diagonal()
        return (total / s1) * per_sample.mean()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"


class HashNetLoss(nn.Module):
    """HashNet's class-balanced pairwise logistic loss (``pairwise_loss_updated``, Cao et al. ICCV 2017).

    With ``ip_ij = alpha * <h_i, g_j>`` and ``s_ij = 1`` for similar pairs (sharing a label, or equal
    ids), ``l_ij = log(1 + e^{ip_ij}) - s_ij * ip_ij`` (computed stably) and S1 / S0 the numbers of similar
    / dissimilar pairs in the batch, S = S1 + S0::

        L = (1/S) [ sum_{s=1} (S/S1) l_ij + sum_{s=0} (S/S0) l_ij ] = mean_{similar} l + mean_{dissimilar} l

    so both classes weigh the same whatever their counts. A class absent from the batch contributes 0
    (the official code gives the same value: its weight multiplies an empty set). Unlike
    :class:`BalancedInfoNCE`, the weights sit outside any log on independent pairwise terms, and with
    multi-hot labels S1 / S0 change from batch to batch.

    Args:
        alpha: scale of the inner product. HashNet's ``pairwise_loss_updated`` uses 1; its older
            ``pairwise_loss`` uses ``sigmoid_param = 10 / bits``, which keeps ``alpha * <h, g>`` in
            [-10, 10] for codes in [-1, 1]^bits.
    """

    def __init__(self, alpha: float = 1.0) -> None:
        super().__init__()
        alpha = float(alpha)
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
        self.alpha = alpha

    @staticmethod
    def similarity(labels_i: torch.Tensor, labels_j: torch.Tensor) -> torch.Tensor:
        """(B_i, B_j) bool similarity: multi-hot (B, L) labels share a label, or (B,) ids are equal."""
        if labels_i.dim() != labels_j.dim() or labels_i.dim() not in (1, 2):
            raise ValueError(
                "labels_i and labels_j must both be (B,) ids or both (B, L) multi-hot labels, got shapes "
                f"{tuple(labels_i.shape)} and {tuple(labels_j.shape)}"
            )
        if labels_i.dim() == 1:
            return labels_i.unsqueeze(1) == labels_j.unsqueeze(0)
        if labels_i.shape[1] != labels_j.shape[1]:
            raise ValueError(f"labels_i has {labels_i.shape[1]} classes but labels_j has {labels_j.shape[1]}")
        return (labels_i.double() @ labels_j.double().T) > 0

    def forward(
        self, h_i: torch.Tensor, h_j: torch.Tensor, labels_i: torch.Tensor, labels_j: torch.Tensor
    ) -> torch.Tensor:
        """Loss of one batch.

        Args:
            h_i: (B_i, K) continuous codes (e.g. tanh outputs) of one modality.
            h_j: (B_j, K) continuous codes of the other modality (or the same tensor).
            labels_i: (B_i, L) multi-hot labels or (B_i,) integer ids of ``h_i``'s samples.
            labels_j: (B_j, L) or (B_j,) likewise for ``h_j``.

        Returns:
            Scalar tensor.
        """
        check_tensor(h_i, "h_i", ndim=2)
        check_tensor(h_j, "h_j", shape=(None, h_i.shape[1]))
        check_tensor(labels_i, "labels_i", floating=False, finite=False)
        check_tensor(labels_j, "labels_j", floating=False, finite=False)
        if labels_i.shape[0] != h_i.shape[0] or labels_j.shape[0] != h_j.shape[0]:
            raise ValueError(
                f"labels_i / labels_j have {labels_i.shape[0]} / {labels_j.shape[0]} rows but h_i / h_j "
                f"have {h_i.shape[0]} / {h_j.shape[0]}"
            )
        similar = self.similarity(labels_i.to(h_i.device), labels_j.to(h_i.device))
        ip = self.alpha * (h_i @ h_j.T)
        # log(1 + e^x) - s x, written as softplus so that large |x| neither overflows nor loses precision.
        pair_loss = F.softplus(ip) - similar.to(ip.dtype) * ip
        loss = ip.new_zeros(())
        # The mean over each class present, without reading on the host whether it is (one wait for the
        # device per class and step): an absent class sums 0 over a count clamped to 1.
        for mask in (similar, ~similar):
            count = mask.sum().to(ip.dtype)
            loss = loss + torch.where(mask, pair_loss, 0.0).sum() / count.clamp(min=1)
        return loss

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"
