"""NAAF (Zhang et al., CVPR 2022): negative-aware attention with a learned mismatch threshold.

Per caption (words u_l, valid positions only) and image (regions v_r), with ``s_lr = <u_l, v_r>`` on
L2-normalised vectors and a scalar threshold ``t`` (reference/naaf_scan_vse.md 2.1)::

    Row_max_l = max_r (s_lr - t)
    neg_l     = Row_max_l * 1[gate_l < 0]      gate = Row_max (training) or A @ Row_max (test), where
                                               A = softmax_row(5 U U^T) is the caption's word affinity
    w_lr      = exp(lambda (s_lr - t)) / (sum_r' ... + 1e-8) over regions with s_lr > t (else 0)
    pos_f_l   = <u_l, sum_r w_lr v_r> / max(||sum_r w_lr v_r||, 1e-8)
    pos_r_l   = sum_r s_lr softmax_r(lambda * l2norm_l(LeakyReLU_0.1(s)))_lr
    S         = mean_l (neg_l + pos_f_l + pos_r_l)

Training uses ``t = threshold``, evaluation ``t = threshold_safe``; both are float64 buffers, so they live
in the state dict and a checkpoint carries the values its scores depend on (the official code keeps them
in the mutable ``opt`` namespace saved with the checkpoint).

**Threshold learning (discriminative mismatch mining).** In training mode the forward returns
``extras["row_max"]`` and the trainer then calls :meth:`NAAFMatcher.update_from_batch` with the square
batch's scores (caption j belongs to batch image j) and the images' dataset ids, which updates the
thresholds like BatchNorm's running statistics; one process or several, it is the same call:

1. A caption is *sampled* when its own image scores highest among the batch images (official
   ``wrong_index == i``). Its positive samples are ``max_r s_lr`` of its words against its own image,
   its mismatched samples the same against the *least* similar batch image (official ``argmin``; not the
   hardest negative). An image that appears more than once in the batch (several of its captions drawn)
   counts as the caption's own image wherever it ranks first: the official test compares batch positions,
   so there a caption whose image is repeated is sampled or not by how the sort breaks an exact tie (an
   unstable sort on the GPU), and under another CPU or another process split the tie is not even exact.
2. With N = the number of sampled words: if N > ``min_samples`` (200), fit Gaussians to both sample sets
   (means, unbiased stds) and solve ``N(t; mu+, sigma+) = alpha N(t; mu-, sigma-)`` (paper eq. 4; the code's
   "+" root ``(-B + sqrt(E)) / (2A + 1e-10)``), and take ``mu+ - 3 sigma+`` as the safe test threshold.
   When ``E <= 0`` the old values stay. Values outside [0, 1] become 0 (the official clamp maps > 1 to
   0, not 1). Each is then blended ``blend * new + (1 - blend) * old`` (0.7 / 0.3).
3. If N < ``min_samples`` both thresholds are reset to 0 (official; ``reset_below_min=False`` keeps
   them); N == ``min_samples`` leaves them unchanged (as the official ``> 200`` / ``< 200`` tests do).

Difference from the official code (documented, unavoidable when scoring all pairs at once): the
official loop updates the thresholds after *every* caption, so caption i of a batch is scored with the
value left by captions 0..i-1, the statistics are re-fitted on the growing in-batch sample list, and the
blend chains within the batch (starting from 0 after the per-caption reset). Here every caption of a batch
is scored with the threshold from before the batch, the statistics are fitted once on all of the batch's
samples, and the blend is with the previous batch's value (a running estimate across batches, which is
what the paper's update rounds k describe). The test-time scores have no such state and are exact.

Over 400 lines: NAAF's official math (negative-aware attention and its fitted distributions) in one class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from patchword.matching.attention import (
    attended_cosine,
    caption_chunks,
    feature_norm,
    gram,
    official_l2norm,
    word_region_scores,
)
from patchword.matching.base import Matcher, MatcherOutput, caption_blocks, chunk_widths
from patchword.matching.ops import length_mask
from patchword.matching.registry import register_matcher

__all__ = ["NAAFConfig", "NAAFMatcher", "gaussian_boundary", "threshold_update"]

_INTRA_CHOICES = ("test", "always", "never")


@dataclass
class NAAFConfig:
    """Arguments of :class:`NAAFMatcher`; defaults are the official Flickr30K ones."""

    embed_dim: int = 1024  # D, width of region and word vectors
    lambda_softmax: float = 20.0  # lambda of the positive mask attention and the relevance softmax
    alpha: float = 2.0  # weight of mismatch errors in the boundary (eq. 3); issue #3 suggests 2.5
    intra_temperature: float = 5.0  # temperature of the word-word affinity softmax (official 5)
    # when the negative gate uses A @ Row_max: test (official) | always | never
    intra_relation: Literal["test", "always", "never"] = "test"
    update_threshold: bool = True  # mine mismatches and update the thresholds in training mode
    min_samples: int = 200  # sampled words a batch needs before the thresholds are re-fitted
    blend: float = 0.7  # weight of the new value in the 0.7 / 0.3 blend with the old one
    reset_below_min: bool = True  # official: thresholds drop to 0 when a batch has < min_samples words
    init_threshold: float = 0.0  # initial training threshold t (official 0)
    init_threshold_safe: float = 0.0  # initial test threshold (official 0)
    normalize_inputs: bool = True  # L2-normalise regions and words first, as the official encoders do
    max_pair_elements: int = 1 << 22  # bound on B_v x captions x L x R elements per chunk (0 = no chunks)


def gaussian_boundary(
    mean_pos: torch.Tensor, std_pos: torch.Tensor, mean_neg: torch.Tensor, std_neg: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The official root of ``N(t; mu+, sigma+) = alpha * N(t; mu-, sigma-)`` (paper eq. 4).

    With ``A = sigma+^2 - sigma-^2``, ``B = 2 (mu+ sigma-^2 - mu- sigma+^2)``,
    ``C = (mu- sigma+)^2 - (mu+ sigma-)^2 + 2 (sigma+ sigma-)^2 ln(sigma- / (alpha sigma+) + 1e-8)`` and
    ``E = B^2 - 4AC``, returns ``((-B + sqrt(E)) / (2A + 1e-10), E)``; the root is meaningful only where
    ``E > 0`` (NaN elsewhere).
    """
    a = std_pos.pow(2) - std_neg.pow(2)
    b = 2 * (mean_pos * std_neg.pow(2) - mean_neg * std_pos.pow(2))
    c = (
        (mean_neg * std_pos).pow(2)
        - (mean_pos * std_neg).pow(2)
        + 2 * (std_pos * std_neg).pow(2) * torch.log(std_neg / (alpha * std_pos) + 1e-8)
    )
    e = b.pow(2) - 4 * a * c
    return (-b + e.sqrt()) / (2 * a + 1e-10), e


def _masked_stats(
    values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, unbiased std) of ``values[mask]`` without boolean indexing (no host sync)."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n
    var = ((values - mean).pow(2) * m).sum() / (n - 1)
    return n, mean, var.sqrt()


def threshold_update(
    pos: torch.Tensor,
    neg: torch.Tensor,
    threshold: torch.Tensor,
    threshold_safe: torch.Tensor,
    *,
    alpha: float = 2.0,
    mask: torch.Tensor | None = None,
    min_samples: int = 200,
    blend: float = 0.7,
    reset_below_min: bool = True,
) -> dict[str, torch.Tensor]:
    """One discriminative-mismatch-mining update of NAAF's thresholds (see the module docstring).

    Args:
        pos: matched samples (``max_r s`` of sampled words against their own image), any shape.
        neg: mismatched samples, same shape (the same words against the least similar image).
        threshold, threshold_safe: current values (0-dim tensors).
        alpha: mismatch-error weight of the boundary.
        mask: optional bool, same shape as ``pos``; only True entries are samples.
        min_samples: re-fit only when the number of samples N exceeds it.
        blend: ``new = blend * fitted + (1 - blend) * old``.
        reset_below_min: set both thresholds to 0 when N < ``min_samples``.

    Returns:
        float64 0-dim tensors ``threshold``, ``threshold_safe`` (the values to store), ``num_samples``,
        ``fitted`` (1. where the Gaussians were re-fitted, else 0.), and the diagnostics ``mean_pos``,
        ``std_pos``, ``mean_neg``, ``std_neg`` (NaN when not fitted).
    """
    if pos.shape != neg.shape:
        raise ValueError(
            f"pos and neg must have the same shape, got {tuple(pos.shape)} and {tuple(neg.shape)}"
        )
    if mask is None:
        mask = torch.ones_like(pos, dtype=torch.bool)
    elif mask.shape != pos.shape or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor of shape {tuple(pos.shape)}")
    pos, neg = pos.detach().double(), neg.detach().double()
    old_t, old_safe = threshold.detach().double(), threshold_safe.detach().double()
    n, mean_pos, std_pos = _masked_stats(pos, mask)
    _, mean_neg, std_neg = _masked_stats(neg, mask)
    root, e = gaussian_boundary(mean_pos, std_pos, mean_neg, std_neg, alpha)
    solvable = e > 0  # NaN statistics compare False: the old values stay
    new_t = torch.where(solvable, root, old_t)
    new_safe = torch.where(solvable, mean_pos - 3 * std_pos, old_safe)
    # Official clamp: a value below 0 *or above 1* becomes 0.
    new_t = torch.where((new_t < 0) | (new_t > 1), torch.zeros_like(new_t), new_t)
    new_safe = torch.where((new_safe < 0) | (new_safe > 1), torch.zeros_like(new_safe), new_safe)
    new_t = blend * new_t + (1 - blend) * old_t
    new_safe = blend * new_safe + (1 - blend) * old_safe
    fitted = n > min_samples
    reset = (n < min_samples) if reset_below_min else torch.zeros_like(fitted)
    zero = torch.zeros_like(old_t)
    out_t = torch.where(fitted, new_t, torch.where(reset, zero, old_t))
    out_safe = torch.where(fitted, new_safe, torch.where(reset, zero, old_safe))
    nan = torch.full_like(old_t, math.nan)
    return {
        "threshold": out_t,
        "threshold_safe": out_safe,
        "num_samples": n,
        "fitted": fitted.double(),
        "mean_pos": torch.where(fitted, mean_pos, nan),
        "std_pos": torch.where(fitted, std_pos, nan),
        "mean_neg": torch.where(fitted, mean_neg, nan),
        "std_neg": torch.where(fitted, std_neg, nan),
    }


# What changes training only: the thresholds are fitted in training mode and the checkpoint holds them
# (buffers), so an evaluation scores with the trained ones whatever these are.
_FITS_THRESHOLDS = "it fits the thresholds in training; an evaluation uses the checkpoint's"
_STARTS_THRESHOLDS = "it initialises a threshold; an evaluation uses the checkpoint's"
_TRAINING_ONLY = {
    "alpha": _FITS_THRESHOLDS,
    "update_threshold": _FITS_THRESHOLDS,
    "min_samples": _FITS_THRESHOLDS,
    "blend": _FITS_THRESHOLDS,
    "reset_below_min": _FITS_THRESHOLDS,
    "init_threshold": _STARTS_THRESHOLDS,
    "init_threshold_safe": _STARTS_THRESHOLDS,
}


@register_matcher("naaf", NAAFConfig, training_only=_TRAINING_ONLY)
class NAAFMatcher(Matcher):
    """NAAF similarity head (Text->Image only, as the official code).

    ``forward(img_tokens (B_v, R, D), cap_tokens (B_t, L, D), cap_lens (B_t,))`` returns
    :class:`MatcherOutput` with (B_v, B_t) sims in the inputs' dtype (float64 inputs give the official
    float64 test-time computation). In training mode it also returns ``extras["row_max"]``, from which
    :meth:`update_from_batch` updates the thresholds.

    Buffers (all float64 scalars, saved in the state dict): ``threshold`` and ``threshold_safe``, and the
    diagnostics of the last re-fit ``mean_pos``, ``std_pos``, ``mean_neg``, ``std_neg``, ``num_samples``
    (sampled words of the last training batch) and ``num_fits`` (re-fits so far).
    """

    threshold: torch.Tensor
    threshold_safe: torch.Tensor

    consumes_dense = False  # region / global matchers ignore dense text
    host_lengths = True  # each caption chunk is trimmed to its longest caption

    def __init__(self, config: NAAFConfig) -> None:
        super().__init__()
        if config.intra_relation not in _INTRA_CHOICES:
            raise ValueError(f"intra_relation must be one of {_INTRA_CHOICES}, got {config.intra_relation!r}")
        if not config.lambda_softmax > 0 or not config.alpha > 0 or not config.intra_temperature > 0:
            raise ValueError("lambda_softmax, alpha and intra_temperature must be > 0")
        if not 0 <= config.blend <= 1:
            raise ValueError(f"blend must lie in [0, 1], got {config.blend}")
        if config.min_samples < 1:
            raise ValueError(
                f"min_samples must be >= 1 (an unbiased std needs 2 samples), got {config.min_samples}"
            )
        self.config = config
        self.embed_dim = config.embed_dim
        f64 = torch.float64
        self.register_buffer("threshold", torch.tensor(float(config.init_threshold), dtype=f64))
        self.register_buffer("threshold_safe", torch.tensor(float(config.init_threshold_safe), dtype=f64))
        for name in ("mean_pos", "std_pos", "mean_neg", "std_neg"):
            self.register_buffer(name, torch.tensor(math.nan, dtype=f64))
        self.register_buffer("num_samples", torch.tensor(0.0, dtype=f64))
        self.register_buffer("num_fits", torch.tensor(0.0, dtype=f64))

    def _apply(self, fn, recurse: bool = True):
        # Keep the thresholds float64 through .float() / .half() / .to(dtype): they are statistics, like
        # the official Python floats, and the float64 test-time scores must see the exact stored value.
        keep = {
            name: buf for name, buf in self._buffers.items() if buf is not None and buf.dtype == torch.float64
        }
        out = super()._apply(fn, recurse)
        for name, old in keep.items():
            buf = self._buffers[name]
            if buf.dtype != torch.float64:
                self._buffers[name] = old.to(buf.device)
        return out

    def pair_memory_bytes(self, img_len: int, txt_len: int, dense_len: int, dim: int) -> int:
        """Working bytes per pair inside :meth:`forward` (about ten fp32 (L, R) tensors)."""
        return 10 * 4 * img_len * txt_len

    def _use_intra(self) -> bool:
        mode = self.config.intra_relation
        return mode == "always" or (mode == "test" and not self.training)

    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """Score every image against every caption (with the thresholds from before this batch).

        Args:
            img_tokens: (B_v, R, D) region vectors.
            cap_tokens: (B_t, L, D) word vectors; ``cap_lens`` (B_t,) valid counts (<start>/<end> included),
                on any device (read without waiting for the device when on the host).
            dense_tokens, dense_lens: ignored.

        Returns:
            :class:`MatcherOutput` with ``sims`` (B_v, B_t) and, in training with threshold updates,
            ``extras["row_max"]``: (B_v, B_t, L) ``max_r s`` per word, for :meth:`update_from_batch`.
        """
        self.validate_image_tokens(img_tokens)
        lens = self.validate_text(cap_tokens, cap_lens)
        cap_tokens = cap_tokens.to(img_tokens.dtype)
        img, cap = img_tokens, cap_tokens
        if self.config.normalize_inputs:
            img, cap = official_l2norm(img), official_l2norm(cap)
        t = (self.threshold if self.training else self.threshold_safe).to(img.dtype)
        n_img, n_reg = img.shape[:2]
        n_txt, n_word = cap.shape[:2]
        # The threshold statistics need the whole (global) batch and the images' identities: Row_max goes
        # out and the trainer calls update_from_batch.
        mine = self.training and self.config.update_threshold
        step = caption_chunks(n_img, n_txt, n_word * n_reg, self.config.max_pair_elements)
        img_gram = gram(img)[:, None]  # (B_v, 1, R, R)
        sims, row_maxes = [], []
        blocks = zip(caption_blocks(n_txt, step), chunk_widths(cap_lens, lens, step, n_word), strict=True)
        for part, width in blocks:
            chunk_sims, row_max = self._score(img, cap[part, :width], lens[part], t, img_gram)
            sims.append(chunk_sims)
            if mine:  # chunks are trimmed to their own longest caption: pad back to a common width
                row_maxes.append(F.pad(row_max.detach() + t, (0, n_word - row_max.shape[2])))
        out = MatcherOutput(sims=torch.cat(sims, dim=1))
        if mine:
            out.extras["row_max"] = torch.cat(row_maxes, dim=1)  # (B_v, B_t, L)
        return out

    @torch.no_grad()
    def update_from_batch(
        self,
        sims: torch.Tensor,
        row_max: torch.Tensor,
        cap_lens: torch.Tensor,
        *,
        row_offset: int = 0,
        image_ids: torch.Tensor | None = None,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """The threshold update of a square training batch (caption j belongs to batch image j).

        In one process ``row_max`` covers every batch image. When the batch's images are spread over
        processes, every process calls it with the gathered batch scores and its own rows of Row_max; the
        matched and mismatched samples of every caption are assembled with one sum over the processes
        (each sample lives in exactly one of them), so every process fits the same statistics on the same
        samples as a single process scoring the whole batch.

        Args:
            sims: (B, B) scores of the global batch.
            row_max: (b, B, L) ``max_r s`` (threshold added back) of this process's images, the rows
                ``row_offset .. row_offset + b`` of the batch (``extras["row_max"]`` of the forward).
            cap_lens: (B,) caption lengths.
            row_offset: the first batch row this process holds.
            image_ids: (B,) dataset id of each batch image; equal ids are the same image, which ranks
                first for a caption wherever one of its copies does. None: every row a different image.
            all_reduce: sums a tensor over the processes (in place, returning it); None in one process.
        """
        n_txt, width = sims.shape[1], row_max.shape[2]
        if sims.shape[0] != n_txt:
            raise ValueError(f"the threshold update needs a square batch, got scores {tuple(sims.shape)}")
        cols = torch.arange(n_txt, device=sims.device)
        rows = torch.arange(row_offset, row_offset + row_max.shape[0], device=sims.device)
        ids = cols if image_ids is None else image_ids.to(sims.device)

        def here(img_of: torch.Tensor) -> torch.Tensor:
            """(B, L) Row_max of caption j against image img_of[j] where this process holds it, else 0."""
            held = (img_of >= rows[0]) & (img_of <= rows[-1])
            picked = row_max[(img_of - row_offset).clamp(0, row_max.shape[0] - 1), cols].double()
            return torch.where(held[:, None], picked, torch.zeros_like(picked))

        reduce = all_reduce or (lambda x: x)
        correct = ids[sims.argmax(0)] == ids  # the official sampling rule, copies of an image as one
        pos = reduce(here(cols))
        neg = reduce(here(sims.argmin(0)))
        self._update(pos, neg, length_mask(cap_lens, width) & correct[:, None])

    def _score(
        self,
        img: torch.Tensor,
        cap: torch.Tensor,
        lens: torch.Tensor,
        t: torch.Tensor,
        img_gram: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B_v, R, D), (T, L, D) trimmed to the longest caption -> sims (B_v, T) and
        Row_max = max_r (s - t), (B_v, T, L)."""
        cfg = self.config
        lam = cfg.lambda_softmax
        valid = length_mask(lens, cap.shape[1])  # (T, L)
        s = word_region_scores(img, cap)  # (B_v, T, L, R)
        shifted = s - t
        row_max = shifted.amax(-1)  # (B_v, T, L)

        # Negative branch: the penalty is the word's own Row_max, gated by Row_max or, at test time, by
        # its intra-caption smoothing A @ Row_max.
        gate = row_max
        if self._use_intra():
            affinity = (cap @ cap.transpose(1, 2)) * cfg.intra_temperature  # (T, L, L)
            affinity = torch.softmax(affinity.masked_fill(~valid[:, None, :], -math.inf), dim=-1)
            gate = torch.einsum("tjl,vtl->vtj", affinity, row_max.masked_fill(~valid, 0.0))
        neg = row_max * (gate < 0).to(row_max.dtype)

        # Positive branch 1: softmax over the regions above threshold. Shifting by the (clamped) row max
        # keeps exp() finite for any lambda; multiplying the 1e-8 of the official l1norm by exp(-lambda m)
        # keeps the value identical to exp(lambda x) / (sum exp(lambda x) + 1e-8).
        top = row_max.clamp_min(0).unsqueeze(-1)
        above = shifted > 0
        expo = torch.exp(lam * (shifted - top)) * above.to(s.dtype)
        denominator = expo.sum(-1, keepdim=True) + 1e-8 * torch.exp(-lam * top)
        # A word with no region above the threshold has expo = 0 and the denominator 1e-8, which float16
        # rounds to 0 (0 / 0 = NaN): floored at the dtype's smallest normal number its weights are 0, as in
        # float32. Nothing else moves: every other denominator is >= 1 (the row max contributes exp(0)).
        weights = expo / denominator.clamp_min(torch.finfo(denominator.dtype).tiny)
        pos_f = attended_cosine(weights, s, img_gram, None, divide_query_norm=False)

        # Positive branch 2: SCAN t2i attention on the raw scores (the threshold does not enter).
        normed = feature_norm(s, "clipped_l2norm", dim=2, valid=valid[None, :, :, None])
        relevance = torch.softmax(normed * lam, dim=-1)
        pos_r = (s * relevance).sum(-1)

        per_word = (neg + pos_f + pos_r).masked_fill(~valid[None], 0.0)
        return per_word.sum(-1) / lens.to(per_word.dtype)[None], row_max

    @torch.no_grad()
    def _update(self, pos: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor) -> None:
        cfg = self.config
        new = threshold_update(
            pos,
            neg,
            self.threshold,
            self.threshold_safe,
            alpha=cfg.alpha,
            mask=mask,
            min_samples=cfg.min_samples,
            blend=cfg.blend,
            reset_below_min=cfg.reset_below_min,
        )
        self.threshold.copy_(new["threshold"])
        self.threshold_safe.copy_(new["threshold_safe"])
        self.num_samples.copy_(new["num_samples"])
        self.num_fits.add_(new["fitted"])
        fitted = new["fitted"] > 0
        for name in ("mean_pos", "std_pos", "mean_neg", "std_neg"):
            buf = getattr(self, name)
            buf.copy_(torch.where(fitted, new[name], buf))

    def extra_repr(self) -> str:
        return (
            f"lambda_softmax={self.config.lambda_softmax}, alpha={self.config.alpha}, "
            f"threshold={float(self.threshold):.4f}, threshold_safe={float(self.threshold_safe):.4f}"
        )
