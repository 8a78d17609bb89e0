"""Word-region cross attention shared by SCAN and NAAF, vectorised over all image-caption pairs.

The official SCAN / NAAF code scores one caption at a time against a block of images. Every quantity
here is the same per-pair computation laid out as (B_v, B_t, ...) tensors, so one call scores a whole
block of pairs. Two reformulations keep the pair tensors small:

* the word-region score matrix ``s[v, t, l, r] = <u_tl, v_vr>`` is one GEMM over flattened tokens;
* an attended vector ``a = sum_r w_r v_r`` is never materialised (it would be (B_v, B_t, L, D)): its dot
  product with a word is ``sum_r w_r s_r`` and its squared norm ``w^T G w`` with the per-image region
  Gram matrix ``G = V V^T`` (R x R), so pair tensors stay (B_v, B_t, L, R) whatever the width D.

The normalisation helpers reproduce the official epsilons: ``x / (||x|| + 1e-8)`` (``l2norm``),
``x / (sum |x| + 1e-8)`` (``l1norm``) and ``w12 / max(||x1|| ||x2||, 1e-8)`` (``cosine_similarity``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from patchword.matching.ops import full_precision

__all__ = [
    "FEATURE_NORMS",
    "AGGREGATIONS",
    "official_l2norm",
    "feature_norm",
    "word_region_scores",
    "gram",
    "attended_cosine",
    "aggregate",
    "caption_chunks",
]

#: ``raw_feature_norm`` options of SCAN (``l1norm`` / ``clipped_l1norm`` crash in the official code with a
#: NameError; here they do what their names say).
FEATURE_NORMS = ("clipped_l2norm", "l2norm", "softmax", "clipped", "no_norm", "l1norm", "clipped_l1norm")
#: SCAN's ``agg_func`` options, lower-cased.
AGGREGATIONS = ("logsumexp", "mean", "max", "sum")

_EPS = 1e-8  # the epsilon of every official normalisation


def official_l2norm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """SCAN / NAAF ``l2norm``: ``x / (sqrt(sum x^2) + 1e-8)`` along ``dim``.

    ``vector_norm`` has a zero (sub)gradient at 0, where ``sqrt(sum x^2)`` has an infinite one: a zero
    vector (a padded GRU position) would otherwise turn every gradient into NaN. In float16 the 1e-8
    rounds away and a zero vector is 0 / 0: the denominator is floored at the dtype's smallest normal
    number (a no-op in float32, where it never gets below 1e-8).
    """
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True) + _EPS
    return x / norm.clamp_min(torch.finfo(norm.dtype).tiny)


def feature_norm(
    scores: torch.Tensor, kind: str, dim: int, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """SCAN's ``raw_feature_norm`` of attention scores along the *query* axis ``dim``.

    Args:
        scores: attention scores, any shape.
        kind: one of :data:`FEATURE_NORMS`; "clipped" is LeakyReLU(0.1) as in the code (the paper writes
            max(x, 0)).
        dim: the query axis the norm runs over.
        valid: optional bool mask broadcastable to ``scores``, False at padding along ``dim``; padding
            then contributes nothing, exactly as if the official code had cut the padding off.

    Returns:
        Tensor of the same shape (padding positions hold 0).
    """
    if kind not in FEATURE_NORMS:
        raise ValueError(f"feature_norm must be one of {FEATURE_NORMS}, got {kind!r}")
    x = scores
    if kind.startswith("clipped"):
        x = F.leaky_relu(x, 0.1)
    if kind == "softmax":
        if valid is not None:
            x = x.masked_fill(~valid, -math.inf)
        return torch.softmax(x, dim=dim)
    if valid is not None:
        x = x.masked_fill(~valid, 0.0)
    if kind.endswith("l2norm"):
        return official_l2norm(x, dim)
    if kind.endswith("l1norm"):
        # floored for float16, where the 1e-8 rounds away (see official_l2norm)
        return x / (x.abs().sum(dim=dim, keepdim=True) + _EPS).clamp_min(torch.finfo(x.dtype).tiny)
    return x  # "clipped" and "no_norm"


def word_region_scores(img: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """All word-region dot products of all pairs.

    Args:
        img: (B_v, R, D) region vectors.
        cap: (B_t, L, D) word vectors.

    Returns:
        (B_v, B_t, L, R) with ``out[v, t, l, r] = <cap[t, l], img[v, r]>``.
    """
    b_v, n_r, dim = img.shape
    b_t, n_l, _ = cap.shape
    # One GEMM over flattened tokens; the permute is a view, callers reduce over l or r directly.
    flat = cap.reshape(b_t * n_l, dim) @ img.reshape(b_v * n_r, dim).T  # (B_t*L, B_v*R)
    return flat.view(b_t, n_l, b_v, n_r).permute(2, 0, 1, 3)


def gram(x: torch.Tensor) -> torch.Tensor:
    """(B, N, D) -> (B, N, N) Gram matrices ``x x^T``."""
    return x @ x.transpose(1, 2)


def attended_cosine(
    weights: torch.Tensor,
    scores: torch.Tensor,
    context_gram: torch.Tensor,
    query_norm: torch.Tensor | None,
    *,
    divide_query_norm: bool = True,
) -> torch.Tensor:
    """Cosine between each query vector and its attended context vector, without building the latter.

    With ``a_q = sum_c w_qc x_c`` (c runs over the context items) and ``s_qc = <q, x_c>``::

        <q, a_q> = sum_c w_qc s_qc        ||a_q||^2 = w_q^T G w_q,  G = X X^T

    Args:
        weights: (..., Q, C) attention weights of each query over the context.
        scores: (..., Q, C) raw query-context dot products ``s``.
        context_gram: Gram matrices of the context, broadcastable to (..., C, C).
        query_norm: (..., Q) norms of the query vectors (None when ``divide_query_norm`` is False).
        divide_query_norm: True for SCAN's ``cosine_similarity`` (``w12 / max(|q| |a|, 1e-8)``); False
            for NAAF's, which divides by ``max(|a|, 1e-8)`` only.

    Returns:
        (..., Q) cosines, in float32 when the inputs are float16 / bfloat16 (autocast).

    The products may run in half precision; the floors, the square root and the division run in float32:
    float16 rounds the 1e-16 and 1e-8 floors to 0, so a query with all-zero weights (a NAAF word with no
    region above the threshold) would be 0 / 0 = NaN, and a near-zero norm would be a float16 subnormal
    with a few significant bits. float32 and float64 inputs compute exactly as before.
    """
    dot = full_precision((weights * scores).sum(-1))
    # w^T G w can come out a hair below 0 from rounding when a ~ 0. Clamping it at 1e-16 before the square
    # root keeps the gradient finite; the value only changes where the official max(., 1e-8) floor of the
    # denominator applies anyway (unit query vectors).
    norm = full_precision(((weights @ context_gram) * weights).sum(-1)).clamp_min(_EPS * _EPS).sqrt()
    if divide_query_norm:
        return dot / (full_precision(query_norm) * norm).clamp_min(_EPS)
    return dot / norm


def aggregate(values: torch.Tensor, valid: torch.Tensor | None, kind: str, lambda_lse: float) -> torch.Tensor:
    """SCAN's ``agg_func`` over the last axis, ignoring positions where ``valid`` is False.

    ``logsumexp`` is ``log(sum exp(lambda * x)) / lambda`` (computed stably; the official code has no
    max-subtraction, which only matters for overflow), ``mean`` divides by the number of valid items.
    """
    kind = kind.lower()
    if kind not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {kind!r}")
    if kind == "logsumexp":
        x = values * lambda_lse
        if valid is not None:
            x = x.masked_fill(~valid, -math.inf)
        return torch.logsumexp(x, dim=-1) / lambda_lse
    if kind == "max":
        return (values if valid is None else values.masked_fill(~valid, -math.inf)).amax(-1)
    total = (values if valid is None else values.masked_fill(~valid, 0.0)).sum(-1)
    if kind == "sum":
        return total
    count = values.shape[-1] if valid is None else valid.sum(-1).to(values.dtype)
    return total / count


def caption_chunks(n_img: int, n_txt: int, per_pair: int, max_elements: int) -> int:
    """Captions per chunk so that a (n_img, chunk, per_pair) pair tensor stays below ``max_elements``."""
    if max_elements <= 0:
        return n_txt
    return max(1, min(n_txt, max_elements // max(1, n_img * per_pair)))
