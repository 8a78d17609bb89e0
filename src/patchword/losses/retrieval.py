"""Retrieval losses: the VSE++ hinge (SEPS/LAPS, NAAF, TGDT), the SEPS/LAPS ratio loss, TGDT's CMC loss and
the CLIP-style contrastive loss. Hinge-based losses are summed over the batch, as in the official code."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from patchword._validation import check_tensor

__all__ = ["HingeLoss", "ContrastiveLoss", "RatioLoss", "CMCLoss"]


def _positive_mask(batch: int, img_ids: object, ignore: object, device: torch.device) -> torch.Tensor:
    """(B, B) bool, True where a pair must not count as a negative.

    That is the diagonal, every pair of samples sharing an image id (batches are sampled per caption, so
    one image can appear twice), and the caller's ``ignore`` mask (e.g. known false negatives).
    """
    if img_ids is None:
        mask = torch.eye(batch, dtype=torch.bool, device=device)
    else:
        if not isinstance(img_ids, torch.Tensor):
            try:
                img_ids = torch.as_tensor(img_ids)
            except (TypeError, ValueError, RuntimeError) as err:
                raise ValueError(f"img_ids must be a 1-D tensor of image ids: {err}") from err
        img_ids = check_tensor(img_ids, "img_ids", shape=(batch,), floating=False, finite=False)
        img_ids = img_ids.to(device)
        mask = img_ids.unsqueeze(1) == img_ids.unsqueeze(0)
    if ignore is not None:
        ignore = check_tensor(ignore, "ignore", shape=(batch, batch), floating=False, finite=False)
        if ignore.dtype != torch.bool:
            raise ValueError(
                f"ignore must be a bool tensor (True = not a negative), got dtype {ignore.dtype}"
            )
        mask = mask | ignore.to(device)
    return mask


def _square_batch(sims: torch.Tensor, queries: slice | None) -> tuple[slice, int]:
    """Check a (B, B) batch score matrix (its values too, unless a training step's ``queries`` share is
    asked: reading them would make the host wait for the device); -> (the queries, B)."""
    if queries is None:
        check_tensor(sims, "sims", ndim=2)
        queries = slice(None)
    batch = sims.shape[0]
    if sims.dim() != 2 or batch == 0 or sims.shape[1] != batch:
        raise ValueError(f"sims must be a non-empty square (B, B) matrix, got shape {tuple(sims.shape)}")
    return queries, batch


class HingeLoss(nn.Module):
    """VSE++ bidirectional hinge loss, exactly the official SEPS/LAPS ``ContrastiveLoss``.

    For a (B, B) similarity ``S`` (rows images, columns captions, positives on the diagonal)::

        cost_s[i, j]  = [margin + S[i, j] - S[i, i]]_+     (image i retrieves captions)
        cost_im[i, j] = [margin + S[i, j] - S[j, j]]_+     (caption j retrieves images)

    Both are zeroed on non-negatives (same image id, or ``ignore``). With ``max_violation`` the loss is
    ``sum_i max_j cost_s + sum_j max_i cost_im`` (hardest negatives), otherwise the sum of all costs.
    The loss is summed over the batch, not averaged, as in the official code.

    Args:
        margin: the hinge margin alpha.
        max_violation: use only the hardest negative of every query (can be overridden per call; the
            official trainers switch it on after the first epoch).
    """

    def __init__(self, margin: float = 0.2, max_violation: bool = False) -> None:
        super().__init__()
        self.margin = float(margin)
        self.max_violation = bool(max_violation)

    def forward(
        self,
        sims: torch.Tensor,
        img_ids: torch.Tensor | Sequence[int] | None = None,
        ignore: torch.Tensor | None = None,
        max_violation: bool | None = None,
        queries: slice | None = None,
    ) -> torch.Tensor:
        """Loss of one batch, or the share of it that some samples contribute as queries.

        Args:
            sims: (B, B) similarities, rows images and columns captions of the same B samples.
            img_ids: optional (B,) image id of every sample; pairs with equal ids are not negatives.
                Without it only the diagonal is excluded.
            ignore: optional (B, B) bool, True where a pair is not a negative (e.g. a known false
                negative from a dataset's "fits" relation).
            max_violation: overrides the attribute for this call when not None.
            queries: only the image queries of rows ``queries`` (against every caption) and the caption
                queries of columns ``queries`` (against every image) count. The shares of a partition of
                the batch sum to the whole loss: each process of a multi-process step takes its share of
                the global batch's loss on the gathered matrix ((b, B) and (B, b) cost blocks instead of
                B x B). With ``queries`` the values of ``sims`` are not checked (that would make the
                host wait for the device: the training step's hot path); ``slice(None)`` is the whole
                loss without that check.

        Returns:
            Scalar tensor.
        """
        queries, batch = _square_batch(sims, queries)
        hardest = self.max_violation if max_violation is None else bool(max_violation)
        not_negative = _positive_mask(batch, img_ids, ignore, sims.device)

        positives = sims.diagonal()
        rows, cols = sims[queries], sims[:, queries]  # (b, B) image queries, (B, b) caption queries
        cost_s = (self.margin + rows - positives[queries].unsqueeze(1)).clamp(min=0)
        cost_s = cost_s.masked_fill(not_negative[queries], 0)
        cost_im = (self.margin + cols - positives[queries].unsqueeze(0)).clamp(min=0)
        cost_im = cost_im.masked_fill(not_negative[:, queries], 0)
        if hardest:
            # .max (not .amax): on ties the gradient goes to one negative, as in the official code.
            return cost_s.max(1).values.sum() + cost_im.max(0).values.sum()
        return cost_s.sum() + cost_im.sum()

    def extra_repr(self) -> str:
        return f"margin={self.margin}, max_violation={self.max_violation}"


class RatioLoss(nn.Module):
    """Squared deviation of the kept-patch ratio from its target (SEPS/LAPS patch selection).

    Each decision tensor ``D_b`` (any shape, values in [0, 1]) is one selection branch's keep mask, e.g.
    the sparse-caption and dense-caption branches of SEPS:

    * ``mode="sum_masks"`` (official code): ``(sum_b mean(D_b) - target_ratio)^2``; the official code
      adds the masks before taking the mean, which is the same thing for equally shaped masks.
    * ``mode="per_branch"`` (paper Eq. 7 as this project reads it): ``sum_b (mean(D_b) - target_ratio)^2``.

    Note (SPEC decision 3): with hard top-k masks, as in the official code, ``mean(D_b)`` is fixed by
    ``k``, so this loss is a constant with zero gradient; it only offsets the logged loss and is no
    training signal. It has a gradient only for differentiable decisions (e.g. Gumbel-softmax
    straight-through masks in the paper variant).

    Args:
        target_ratio: the target mean keep ratio rho (>= 0).
        mode: ``"sum_masks"`` or ``"per_branch"``.
    """

    MODES = ("sum_masks", "per_branch")

    def __init__(self, target_ratio: float, mode: str = "sum_masks") -> None:
        super().__init__()
        target_ratio = float(target_ratio)
        if not (math.isfinite(target_ratio) and target_ratio >= 0):
            raise ValueError(f"target_ratio must be a finite number >= 0, got {target_ratio}")
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        self.target_ratio = target_ratio
        self.mode = mode

    def forward(self, decisions: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Loss of one batch.

        Args:
            decisions: a list of decision tensors (any shapes, values in [0, 1]), or a single tensor
                for one branch. Bool masks are accepted and count as 0/1.

        Returns:
            Scalar tensor (float, on the decisions' device).
        """
        if isinstance(decisions, torch.Tensor):
            decisions = [decisions]
        if not isinstance(decisions, Sequence) or len(decisions) == 0:
            raise ValueError("decisions must be a non-empty list of decision tensors")
        ratios = torch.stack([self._keep_ratio(d, f"decisions[{b}]") for b, d in enumerate(decisions)])
        return self.from_ratios(ratios)

    def from_ratios(self, ratios: torch.Tensor) -> torch.Tensor:
        """The loss from the branches' kept shares ``mean(D_b)``, a (n_branches,) tensor: how a
        multi-process step applies it to shares reduced over the global batch (no value checks)."""
        if self.mode == "sum_masks":
            return (ratios.sum() - self.target_ratio).square()
        return (ratios - self.target_ratio).square().sum()

    @staticmethod
    def _keep_ratio(decision: torch.Tensor, name: str) -> torch.Tensor:
        """Mean of one decision tensor, as a floating scalar."""
        check_tensor(decision, name, floating=False)
        if decision.numel() == 0:
            raise ValueError(f"{name} is empty")
        if not decision.is_floating_point():
            decision = decision.to(torch.get_default_dtype())
        if bool(decision.min() < 0) or bool(decision.max() > 1):
            raise ValueError(f"{name} must hold values in [0, 1]")
        return decision.mean()

    def extra_repr(self) -> str:
        return f"target_ratio={self.target_ratio}, mode={self.mode!r}"


class CMCLoss(nn.Module):
    """TGDT's Consistent Multimodal Contrastive loss on global embeddings, as the official code computes it.

    With unit-normalised image and text embeddings ``I``, ``T`` (the loss normalises them itself),
    ``S = I T^T``, ``S^I = I I^T`` and ``S^T = T T^T``::

        L_r = VSE++ hinge on S (summed; hardest negatives when max_violation)
        L_a = sum_j [ max_i |S^T_ij - S^I_ij| - sigma ]_+

    ``L_a`` penalises, for every anchor pair, the one other pair whose image-image similarity disagrees
    most with its text-text similarity (the diagonal contributes 0). Total = ``L_r + L_a`` (the official
    configs' loss weights are never read, so both are 1).

    Args:
        margin: hinge margin alpha of ``L_r``.
        sigma: slack of the consistency term (hard-coded 0.3 in the official code).
        max_violation: hardest negatives in ``L_r`` (TGDT trains with ``True``).
    """

    def __init__(self, margin: float = 0.2, sigma: float = 0.3, max_violation: bool = True) -> None:
        super().__init__()
        self.sigma = float(sigma)
        self.ranking = HingeLoss(margin=margin, max_violation=max_violation)

    def components(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        img_ids: torch.Tensor | Sequence[int] | None = None,
        max_violation: bool | None = None,
    ) -> dict[str, torch.Tensor]:
        """The loss terms of one batch.

        Args:
            img: (B, C) global image embeddings (any norm).
            txt: (B, C) global text embeddings of the same B pairs.
            img_ids: optional (B,) image ids; pairs sharing an image are not negatives in ``L_r``
                (the consistency term, like the official code, does not use them).
            max_violation: overrides the constructor's choice of hardest negatives for this call.

        Returns:
            ``{"ranking": L_r, "consistency": L_a, "total": L_r + L_a}``, scalar tensors.
        """
        check_tensor(img, "img", ndim=2)
        check_tensor(txt, "txt", shape=tuple(img.shape))
        return self._terms(img, txt, slice(None), img_ids, max_violation)

    def _terms(self, img, txt, queries: slice, img_ids, max_violation) -> dict[str, torch.Tensor]:
        img = F.normalize(img, dim=-1)
        txt = F.normalize(txt, dim=-1)
        ranking = self.ranking(img @ txt.T, img_ids, max_violation=max_violation, queries=queries)
        # columns ``queries`` of the symmetric (B, B) discrepancy |S^T - S^I|
        discrepancy = (txt @ txt[queries].T - img @ img[queries].T).abs()
        consistency = (discrepancy.max(0).values - self.sigma).clamp(min=0).sum()
        return {"ranking": ranking, "consistency": consistency, "total": ranking + consistency}

    def forward(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        img_ids: torch.Tensor | Sequence[int] | None = None,
        max_violation: bool | None = None,
        queries: slice | None = None,
    ) -> torch.Tensor:
        """Total CMC loss ``L_r + L_a`` (scalar); see :meth:`components` for the arguments.

        ``queries``: only the share of the samples ``queries`` (their image and caption queries in
        ``L_r``, their columns in ``L_a``; the shares of a partition of the batch sum to the total), with
        ``img`` and ``txt`` the whole (B, C) batch and no value checks (see :meth:`HingeLoss.forward`).
        """
        if queries is not None:
            return self._terms(img, txt, queries, img_ids, max_violation)["total"]
        return self.components(img, txt, img_ids, max_violation)["total"]

    def extra_repr(self) -> str:
        return f"sigma={self.sigma}"


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE over an image-caption similarity matrix, as CLIP trains (contrastive pretraining).

    ``logits = scale * sims``; every image query is a softmax over the batch's captions with its own caption
    as the target, every caption query a softmax over the images; the loss is the mean over the 2B queries.
    Pairs that are not negatives (the same image twice in a caption-sampled batch, or known false
    negatives) are removed from the softmax denominators instead of being pushed apart.
    """

    def forward(
        self,
        sims: torch.Tensor,
        scale: torch.Tensor | float,
        img_ids: torch.Tensor | Sequence[int] | None = None,
        ignore: torch.Tensor | None = None,
        queries: slice | None = None,
    ) -> torch.Tensor:
        """Loss of one batch, or (``queries``) the share of it that some samples contribute as queries.

        Args:
            sims: (B, B) cosine similarities, rows images and columns captions of the same B samples.
            scale: the inverse temperature (CLIP's ``exp(logit_scale)``), a scalar or 0-d tensor.
            img_ids, ignore: as in :meth:`HingeLoss.forward`.
            queries: only the image queries of rows ``queries`` and the caption queries of columns
                ``queries`` count, each still divided by 2B: the shares of a partition of the batch sum to
                the whole loss (see :meth:`HingeLoss.forward`; no value checks then).

        Returns:
            Scalar tensor.
        """
        queries, batch = _square_batch(sims, queries)
        not_negative = _positive_mask(batch, img_ids, ignore, sims.device)
        not_negative = not_negative & ~torch.eye(batch, dtype=torch.bool, device=sims.device)
        logits = (sims * scale).masked_fill(not_negative, float("-inf"))
        targets = torch.arange(batch, device=sims.device)[queries]
        rows = F.cross_entropy(logits[queries], targets, reduction="sum")  # image queries
        cols = F.cross_entropy(logits[:, queries].T, targets, reduction="sum")  # caption queries
        return (rows + cols) / (2 * batch)
