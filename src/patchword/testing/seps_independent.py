"""SEPS / LAPS scores written from the official ``lib/cross_net.py`` alone: a yardstick that shares nothing
with the library.

:func:`patchword.testing.seps_reference_scores` borrows the matcher's resolved config (K, N_c, the variant's
switches): a wrong ``K``, a wrong preset or a misread switch in the library would pass it. This module
imports nothing from ``patchword``: it takes the *official option values* (:class:`SEPSOptions`, named as in
the official ``arguments.py``: ``sparse_ratio``, ``aggr_ratio``, ``num_patches``), its own table of the
code / paper switches (:data:`VARIANTS`) and the weights as raw tensors (:data:`WEIGHT_NAMES`), and computes
everything else itself, one caption at a time like the official loop. Given a matcher instead of its tensors,
it reads its ``state_dict()`` and the default ``dense_pairing`` from its config, nothing else.

What the official code computes (``CrossmodalGroup/LAPS`` ``lib/cross_net.py`` at ``355a43b``; SEPS at
``7f4dfa6``, reference/seps_laps.md sections 1.4 and 2), and this module repeats:

* CLS: present iff the image token count is not a perfect square (``is_sqr``): ViT 1 + 196, Swin 49.
* ``K = ceil(N * sparse_ratio)`` of the N spatial tokens given to ``TokenSparse`` (counted at run time),
  ``N_c = int(num_patches * aggr_ratio * sparse_ratio)`` with ``opt.num_patches`` (the aggregation MLP's
  output count; checked against the weights).
* ``TokenSparse``: score ``s_im + s_t`` (``s_im`` the cosine of each patch with the normalised mean of the
  raw patches, ``s_t`` with the normalised mean of the caption's raw word vectors), ``torch.sort``, gather
  of the top K raw patches, fusion token = softmax of the sorted dropped scores times the dropped patches.
* ``TokenAggregation`` on the gathered patches: ``softmax_K(MLP(select)^T * scale) @ select``.
* ``mask_xattn_one_text`` on ``normalize([CLS?, aggregated, fusion])`` and the normalised words:
  ``LeakyReLU(0.1)``, mean over words of the max over tokens plus mean over tokens of the max over words.
* SEPS adds, per caption, a second branch guided by the dense caption of the caption's ground-truth image
  (``dense_pairing="caption"``: a dense row per caption) with the same, shared aggregation net, aligned with
  the dense words; the two scores are summed. LAPS has no dense text (pass ``dense=None``).

What the official code has no switch for, implemented from the library's *documented* semantics
(``patchword.matching.seps`` module table, ``selection.py`` / ``hrpa.py`` docstrings), independently:

* ``variant="paper"`` (:data:`VARIANTS`): score ``(1 - 2 beta) s_p + beta (w * sum_t minmax(s_t) +
  2 minmax(s_im))`` with ``s_p = sigmoid(MLP(patch))`` (MLP C -> C/4 -> 1), ``minmax`` over the patches,
  ``w = 2 / (number of text terms)``; ``dense_mode="guide"``: the dense text selects its own patches,
  aggregated by a second net (``aggregation="dual"``) and *summed* with the caption's aggregated tokens,
  fusion tokens averaged, one token set aligned with the caption only; HRPA on plain cosines with
  ``MLP(TopK(.))`` terms (k = 5, MLP k -> 2k -> 1, zero-padded when fewer than k values) added per
  direction. ``gumbel`` and ``ratio_mode`` change training only (gradients, ratio loss): eval scores are the
  hard top-K ones either way, so they do not enter here.
* ``dense_pairing="image"`` (leak-free): image v is selected and, in ``"branch"`` mode, scored with its own
  dense text; that dense score is the same for every caption.
* ``joint_score`` (``"guide"`` mode only; ignored in ``"branch"`` mode, as the library does): both branches
  select with the caption and the dense text together (the ``s_t`` terms of both enter one score).
* ``saliency="cls"``: ``s_im`` measured against the normalised raw CLS token instead of the mean patch.
* ``patch_prior``: images pruned at index time to M of their N patches, with the image-only part of the
  selection score of the kept patches (:func:`independent_patch_prior` on the unpruned tokens). K and N_c
  stay those of the unpruned model (``num_patches`` = N, required), the text terms are computed (and, in
  the paper variant, min-max normalised) over the M kept patches, the fusion token softmaxes over the
  ``M - K`` kept but unselected patches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "VARIANTS",
    "WEIGHT_NAMES",
    "SEPSOptions",
    "independent_patch_prior",
    "independent_seps_scores",
    "token_counts",
]

#: The switches of each variant, written out from reference/seps_laps.md (code) and the library's documented
#: paper equations (paper). Only the first five change eval scores (see the module docstring).
VARIANTS = {
    "code": {
        "score_mode": "sum",
        "dense_mode": "branch",
        "aggregation": "shared",
        "hrpa_topk": 0,
        "similarity": "leaky_relu",
        "gumbel": False,
        "ratio_mode": "sum_masks",
    },
    "paper": {
        "score_mode": "predictor",
        "dense_mode": "guide",
        "aggregation": "dual",
        "hrpa_topk": 5,
        "similarity": "cosine",
        "gumbel": True,
        "ratio_mode": "per_branch",
    },
}

#: Raw tensors read, by name: the official ``cross_net`` names for the aggregation net (``scale`` of any
#: shape with one element), the library's for what the official code lacks (also its state_dict names).
WEIGHT_NAMES = {
    "aggr_net": ["weight.0.weight", "weight.0.bias", "weight.1.weight", "weight.1.bias", "weight.3.weight",
                 "weight.3.bias", "scale"],
    "aggr_net_dense": ["weight.0.weight", "weight.0.bias", "weight.1.weight", "weight.1.bias",
                       "weight.3.weight", "weight.3.bias", "scale"],
    "scorer.mlp": ["0.weight", "0.bias", "2.weight", "2.bias"],
    "hrpa.word_topk.mlp": ["0.weight", "0.bias", "2.weight", "2.bias"],
    "hrpa.patch_topk.mlp": ["0.weight", "0.bias", "2.weight", "2.bias"],
}  # fmt: skip


@dataclass(frozen=True)
class SEPSOptions:
    """The options the scores depend on: the official ``opt`` fields plus the library's switches.

    ``sparse_ratio``, ``aggr_ratio`` and ``num_patches`` are the official ``arguments.py`` / encoder fields
    (``num_patches`` None: the N spatial tokens given). ``variant`` picks a column of :data:`VARIANTS`; a
    switch set here (not None) overrides it. ``has_cls`` None: the official ``is_sqr`` rule.
    """

    sparse_ratio: float = 0.5
    aggr_ratio: float = 0.4
    num_patches: int | None = None
    variant: str = "code"
    score_mode: str | None = None  # "sum" | "predictor"
    dense_mode: str | None = None  # "branch" | "guide"
    aggregation: str | None = None  # "shared" | "dual"
    hrpa_topk: int | None = None  # 0: no TopK-MLP terms
    similarity: str | None = None  # "leaky_relu" | "cosine"
    leaky_slope: float = 0.1
    beta: float = 0.25
    joint_score: bool = False
    saliency: str = "mean_patch"  # "mean_patch" (official) | "cls"
    has_cls: bool | None = None

    def switch(self, name: str):
        """The value of switch ``name``: this object's when set, else the variant's."""
        value = getattr(self, name)
        if value is not None:
            return value
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {self.variant!r}")
        return VARIANTS[self.variant][name]


def _is_sqr(n: int) -> bool:
    """The official ``is_sqr``: a square token count means a grid without CLS."""
    a = int(math.sqrt(n))
    return a * a == n


def token_counts(opt: SEPSOptions, num_tokens: int, kept: int | None = None) -> dict[str, int | bool]:
    """How many tokens each stage has, from the official expressions.

    Args:
        num_tokens: L_v, image tokens given (CLS included when there is one).
        kept: M, patches an image pruned at index time kept (None: unpruned).

    Returns:
        ``has_cls``, ``N`` (spatial tokens K is taken from), ``K`` selected, ``N_c`` aggregated.
    """
    if kept is not None:
        has_cls = num_tokens - kept
        if has_cls not in (0, 1):
            raise ValueError(f"{num_tokens} tokens cannot be [CLS?] + {kept} kept patches")
        if opt.num_patches is None:
            raise ValueError("pruned images need num_patches, the N of the unpruned images")
        n = opt.num_patches
    else:
        has_cls = int(not _is_sqr(num_tokens)) if opt.has_cls is None else int(opt.has_cls)
        n = num_tokens - has_cls
    k = math.ceil(n * opt.sparse_ratio)
    n_c = int((opt.num_patches if opt.num_patches is not None else n) * opt.aggr_ratio * opt.sparse_ratio)
    if kept is not None and not k < kept <= n:
        raise ValueError(f"{kept} kept patches: need K={k} < M <= N={n} (the fusion token needs one)")
    return {"has_cls": bool(has_cls), "N": n, "K": k, "N_c": n_c}


class _Weights:
    """The raw tensors, checked against the switches: every expected name present, nothing else."""

    def __init__(self, opt: SEPSOptions, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        groups = ["aggr_net"]
        if opt.switch("aggregation") == "dual":
            groups.append("aggr_net_dense")
        if opt.switch("score_mode") == "predictor":
            groups.append("scorer.mlp")
        if opt.switch("hrpa_topk") > 0:
            groups += ["hrpa.word_topk.mlp", "hrpa.patch_topk.mlp"]
        expected = {f"{g}.{n}" for g in groups for n in WEIGHT_NAMES[g]}
        missing, unused = sorted(expected - set(weights)), sorted(set(weights) - expected)
        if missing or unused:
            raise ValueError(f"weights do not fit the switches: missing {missing}, unused {unused}")
        self.t = {k: v.detach().to(dtype) for k, v in weights.items()}

    def __call__(self, name: str) -> torch.Tensor:
        return self.t[name]


def _aggregate(w: _Weights, net: str, select: torch.Tensor) -> torch.Tensor:
    """Official ``TokenAggregation.forward`` on the gathered tokens: (B, K, C) -> (B, N_c, C)."""
    x = F.layer_norm(select, select.shape[-1:], w(f"{net}.weight.0.weight"), w(f"{net}.weight.0.bias"))
    x = F.gelu(F.linear(x, w(f"{net}.weight.1.weight"), w(f"{net}.weight.1.bias")))
    logits = F.linear(x, w(f"{net}.weight.3.weight"), w(f"{net}.weight.3.bias"))  # (B, K, N_c)
    weight = F.softmax(logits.transpose(2, 1) * w(f"{net}.scale").reshape(()), dim=2)  # (B, N_c, K)
    return torch.bmm(weight, select)


def _token_sparse(patches: torch.Tensor, score: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Official ``TokenSparse.forward``: (B, N, C) raw patches, (B, N) scores -> (B, K, C) kept, (B, 1, C)
    fusion token."""
    c = patches.shape[-1]
    score_sort, score_index = torch.sort(score, dim=1, descending=True)
    keep_policy = score_index[:, :k]
    select = torch.gather(patches, 1, keep_policy.unsqueeze(-1).expand(-1, -1, c))
    non_tokens = torch.gather(patches, 1, score_index[:, k:].unsqueeze(-1).expand(-1, -1, c))
    non_keep_score = F.softmax(score_sort[:, k:], dim=1).unsqueeze(-1)
    return select, torch.sum(non_tokens * non_keep_score, dim=1, keepdim=True)


def _topk_mlp(w: _Weights, name: str, values: torch.Tensor, k: int) -> torch.Tensor:
    """``MLP(TopK(values))`` of each row of (B, L): the k largest, zeros appended when L < k -> (B,)."""
    top = torch.sort(values, dim=1, descending=True).values[:, :k]
    if top.shape[1] < k:
        top = torch.cat([top, top.new_zeros(top.shape[0], k - top.shape[1])], dim=1)
    if w(f"{name}.0.weight").shape != (2 * k, k):
        raise ValueError(f"{name} weights {tuple(w(f'{name}.0.weight').shape)} are not those of k={k}")
    hidden = F.gelu(F.linear(top, w(f"{name}.0.weight"), w(f"{name}.0.bias")))
    return F.linear(hidden, w(f"{name}.2.weight"), w(f"{name}.2.bias")).squeeze(-1)


def _minmax(x: torch.Tensor) -> torch.Tensor:
    """(x - min) / (max - min + 1e-8) over the last axis (paper Eq. 2)."""
    lo, hi = x.min(dim=-1, keepdim=True).values, x.max(dim=-1, keepdim=True).values
    return (x - lo) / (hi - lo + 1e-8)


def _image_part(opt: SEPSOptions, w: _Weights, cls: torch.Tensor | None, patches: torch.Tensor):
    """The image-only part of the selection score of every patch: (B, N).

    Official: ``s_im`` (no gradient). Paper: ``(1 - 2 beta) s_p + 2 beta minmax(s_im)``.
    """
    unit = F.normalize(patches, dim=-1)
    if opt.saliency == "cls":
        if cls is None:
            raise ValueError("saliency='cls' needs a CLS token")
        centre = F.normalize(cls, dim=-1)  # (B, 1, C)
    elif opt.saliency == "mean_patch":
        centre = F.normalize(patches.mean(dim=1, keepdim=True), dim=-1)
    else:
        raise ValueError(f"saliency must be 'mean_patch' or 'cls', got {opt.saliency!r}")
    s_im = (centre * unit).sum(dim=-1)
    if opt.switch("score_mode") == "sum":
        return s_im
    hidden = F.gelu(F.linear(patches, w("scorer.mlp.0.weight"), w("scorer.mlp.0.bias")))
    s_p = torch.sigmoid(F.linear(hidden, w("scorer.mlp.2.weight"), w("scorer.mlp.2.bias")).squeeze(-1))
    return (1 - 2 * opt.beta) * s_p + 2 * opt.beta * _minmax(s_im)


@torch.no_grad()
def independent_patch_prior(opt: SEPSOptions, weights: dict[str, torch.Tensor], img: torch.Tensor):
    """The image-only part of the selection score of every patch of unpruned images: (B_v, N).

    What index-time pruning ranks patches by and stores for the kept ones (``patch_prior``).

    Args:
        img: (B_v, L_v, C) unpruned raw image tokens (CLS first when there is one).
    """
    counts = token_counts(opt, img.shape[1])
    cls = img[:, :1] if counts["has_cls"] else None
    return _image_part(opt, _Weights(opt, weights, img.dtype), cls, img[:, int(counts["has_cls"]) :])


def _pairing(dense_pairing: str | None, dense_index, weights, has_dense: bool) -> str:
    """The dense pairing scored: the one asked for, else the one a ``dense_index`` implies, else that of the
    matcher given as ``weights``. Dense text with none is refused: the official code pairs with captions, the
    library by default with images, and guessing either would score the other protocol without a word."""
    if dense_pairing is not None and dense_pairing not in ("caption", "image"):
        raise ValueError(f"dense_pairing must be 'caption' or 'image', got {dense_pairing!r}")
    if dense_index is not None and dense_pairing == "image":
        raise ValueError("dense_index gives each caption a dense row: it needs dense_pairing='caption'")
    matcher_pairing = getattr(getattr(weights, "config", None), "dense_pairing", None)
    pairing = dense_pairing or ("caption" if dense_index is not None else matcher_pairing)
    if pairing is None and has_dense:
        raise ValueError(
            "dense text given but no dense_pairing: pass dense_pairing='caption' (official) or 'image', a "
            "dense_index, or the matcher itself as weights (its config.dense_pairing is used)"
        )
    return pairing or "caption"


@torch.no_grad()
def independent_seps_scores(
    opt: SEPSOptions,
    weights: dict[str, torch.Tensor] | torch.nn.Module,
    img: torch.Tensor,
    caps: torch.Tensor,
    cap_lens: torch.Tensor,
    dense: torch.Tensor | None = None,
    dense_lens: torch.Tensor | None = None,
    *,
    dense_pairing: str | None = None,
    dense_index: torch.Tensor | None = None,
    patch_prior: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eval-mode scores of every (image, caption) pair, one caption at a time against all images.

    Args:
        opt: the option values (never a library config).
        weights: raw tensors named as in :data:`WEIGHT_NAMES` (a matcher's ``state_dict()`` fits; so does an
            official ``cross_net`` state without its ``cross_net.`` prefix, for the code variant), or the
            matcher itself: its ``state_dict()`` and, as the default ``dense_pairing``, its
            ``config.dense_pairing`` (nothing else of its config is read).
        img: (B_v, L_v, C) raw image tokens, CLS first when there is one; pruned: (B_v, [1 +] M, C).
        caps: (B_t, L_t, C) raw caption tokens; cap_lens: (B_t,) valid lengths (CLS/SEP included).
        dense: raw dense-text tokens, or None (LAPS). ``dense_pairing="caption"`` (official): caption j uses
            row ``dense_index[j]`` (default j: (B_t, L_d, C)). ``"image"``: (B_v, L_d, C), row v of image v.
        dense_lens: valid lengths of the dense rows.
        dense_pairing: ``"caption"`` or ``"image"``; None: ``"caption"`` when a ``dense_index`` is given, else
            the matcher's when ``weights`` is one; dense text with neither is refused. An explicit value
            scores that protocol whatever the matcher was built with.
        dense_index: (B_t,) dense row of each caption (``"caption"`` pairing only).
        patch_prior: (B_v, M) image part of the selection scores of images pruned to M patches, or None.

    Returns:
        (B_v, B_t) scores in ``img``'s dtype.

    Raises:
        ValueError: weights that do not fit the switches, an unknown or missing ``dense_pairing`` (dense
            text given), or a ``dense_index`` with ``dense_pairing="image"``.
    """
    dense_pairing = _pairing(dense_pairing, dense_index, weights, dense is not None)
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict()
    w = _Weights(opt, weights, img.dtype)
    counts = token_counts(opt, img.shape[1], None if patch_prior is None else patch_prior.shape[1])
    k, n_c, has_cls = counts["K"], counts["N_c"], counts["has_cls"]
    for net in ("aggr_net", "aggr_net_dense"):
        if f"{net}.weight.3.weight" in w.t and w(f"{net}.weight.3.weight").shape[0] != n_c:
            raise ValueError(f"{net} has {w(f'{net}.weight.3.weight').shape[0]} outputs, N_c = {n_c}")
    paper_scores = opt.switch("score_mode") == "predictor"
    guide = opt.switch("dense_mode") == "guide"
    topk = opt.switch("hrpa_topk")
    slope = opt.leaky_slope if opt.switch("similarity") == "leaky_relu" else None
    dense_net = "aggr_net_dense" if opt.switch("aggregation") == "dual" else "aggr_net"

    cls = img[:, :1] if has_cls else None
    patches = img[:, int(has_cls) :]
    unit = F.normalize(patches, dim=-1)
    image_part = _image_part(opt, w, cls, patches) if patch_prior is None else patch_prior.to(img.dtype)

    def relevance(text: torch.Tensor, rows: slice) -> torch.Tensor:
        """s_t (B, N): cosine of the patches ``rows`` with the normalised mean of a text's raw tokens."""
        return (F.normalize(text.mean(dim=0), dim=-1) * unit[rows]).sum(dim=-1)

    def score(terms: list[torch.Tensor], rows: slice) -> torch.Tensor:
        """The selection score of the patches ``rows`` from its text terms: image part + text part."""
        if not paper_scores:
            return image_part[rows] + sum(terms)
        return image_part[rows] + opt.beta * (2 / len(terms)) * sum(_minmax(t) for t in terms)

    def hrpa(aggr: torch.Tensor, extra: torch.Tensor, words: torch.Tensor, rows: slice) -> torch.Tensor:
        """``mask_xattn_one_text`` of the images ``rows`` with one text's words (L, C): (B,)."""
        parts = [aggr, extra] if cls is None else [cls[rows], aggr, extra]
        tokens = F.normalize(torch.cat(parts, dim=1), dim=-1)
        words = F.normalize(words, dim=-1).unsqueeze(0).repeat(tokens.shape[0], 1, 1)
        attn = torch.bmm(words, tokens.transpose(1, 2))  # (B, L, M)
        if slope is not None:
            attn = F.leaky_relu(attn, negative_slope=slope)
        row_sim, column_sim = attn.max(dim=2)[0], attn.max(dim=1)[0]
        sims = row_sim.mean(dim=1) + column_sim.mean(dim=1)
        if topk > 0:
            sims = sims + _topk_mlp(w, "hrpa.word_topk.mlp", row_sim, topk)
            sims = sims + _topk_mlp(w, "hrpa.patch_topk.mlp", column_sim, topk)
        return sims

    def branch(terms: list[torch.Tensor], net: str, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        select, extra = _token_sparse(patches[rows], score(terms, rows), k)
        return _aggregate(w, net, select), extra

    n_img = img.shape[0]
    sims = img.new_zeros(n_img, caps.shape[0])
    if dense is not None and dense_pairing == "caption" and dense_index is None:
        dense_index = torch.arange(caps.shape[0])
    for i in range(caps.shape[0]):
        words = caps[i, : int(cap_lens[i])]
        if dense is None:
            everyone = slice(None)
            sims[:, i] = hrpa(*branch([relevance(words, everyone)], "aggr_net", everyone), words, everyone)
            continue
        # caption-tied: one dense text for all images; image-tied: each image its own
        if dense_pairing == "caption":
            groups = [(slice(None), int(dense_index[i]))]
        else:
            groups = [(slice(v, v + 1), v) for v in range(n_img)]
        for rows, d in groups:
            dense_words = dense[d, : int(dense_lens[d])]
            s_st, s_dt = relevance(words, rows), relevance(dense_words, rows)
            if guide:  # one token set, guided by both texts, aligned with the caption
                joint = [s_st, s_dt] if opt.joint_score else None
                aggr_s, extra_s = branch(joint or [s_st], "aggr_net", rows)
                aggr_d, extra_d = branch(joint or [s_dt], dense_net, rows)
                sims[rows, i] = hrpa(aggr_s + aggr_d, 0.5 * (extra_s + extra_d), words, rows)
            else:  # official SEPS: a dense branch of its own, aligned with the dense words, summed
                caption_score = hrpa(*branch([s_st], "aggr_net", rows), words, rows)
                sims[rows, i] = caption_score + hrpa(*branch([s_dt], dense_net, rows), dense_words, rows)
    return sims
