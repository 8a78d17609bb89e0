"""SEPS/LAPS scores computed the way the official code does: one caption at a time, nothing shared.

This is the yardstick the vectorised matcher (``patchword.matching.seps``) and the scoring engine
(``patchword.eval.engine``) are checked against (``tests/matching/test_seps.py``, ``patchword bench
scoring``). It
is written from reference/seps_laps.md and follows the structure of the official ``lib/cross_net.py`` /
``lib/xttn.py``: per caption, the text-guided patch scores, ``torch.sort``, a gather of the kept patches,
the aggregation MLP on the gathered tokens, the softmax-weighted fusion of the dropped ones, L2
normalisation of ``[CLS, aggregated, fusion]`` and ``mask_xattn_one_text``. The paper variant uses the same
loop with its equations: the learned score (Eq. 1), the min-max normalised mixture (Eqs. 2-3), dual
aggregation with the dense text guiding the same token set, and the HRPA TopK-MLP terms (Eq. 5).

It borrows the matcher's *parameters* (``aggr_net.weight`` / ``.scale``, ``aggr_net_dense``,
``scorer.mlp``, ``hrpa.word_topk.mlp`` / ``.patch_topk.mlp``) and its resolved *config*, never one of its
code paths: a bug in the vectorised computation cannot hide here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from patchword.eval.metrics import check_txt2img

__all__ = ["seps_reference_scores"]


def _token_sparse(patches: torch.Tensor, score: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Official TokenSparse: sort, gather the top K, softmax-fuse the rest.

    Args:
        patches: (B, N, C) raw patches; score: (B, N).

    Returns:
        (B, K, C) kept patches, (B, 1, C) fusion token of the dropped ones.
    """
    c = patches.shape[-1]
    score_sort, order = torch.sort(score, dim=1, descending=True)
    select = torch.gather(patches, 1, order[:, :k, None].expand(-1, -1, c))
    rest = torch.gather(patches, 1, order[:, k:, None].expand(-1, -1, c))
    extra = (rest * F.softmax(score_sort[:, k:], dim=1)[..., None]).sum(dim=1, keepdim=True)
    return select, extra


def _aggregate(net, select: torch.Tensor) -> torch.Tensor:
    """Official TokenAggregation.forward on the gathered tokens: (B, K, C) -> (B, N_c, C)."""
    weight = F.softmax(net.weight(select).transpose(2, 1) * net.scale, dim=2)
    return torch.bmm(weight, select)


def _minmax(x: torch.Tensor) -> torch.Tensor:
    """Paper Eq. (2): min-max normalisation over the patches of each row of (B, N)."""
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    return (x - lo) / (hi - lo + 1e-8)


def _topk_mlp(topk_module, values: torch.Tensor) -> torch.Tensor:
    """Paper Eq. (5) ``MLP(TOPK(.))``: the k largest of each row of (B, L), zero-padded when L < k -> (B,)."""
    k = topk_module.k
    top = values.sort(dim=-1, descending=True).values[:, :k]
    top = F.pad(top, (0, k - top.shape[1]))
    return topk_module.mlp(top).squeeze(-1)


def _hrpa(hrpa, leaky_slope: float | None, tokens: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Official ``mask_xattn_one_text`` (+ the paper's TopK-MLP terms when the matcher has them).

    Args:
        tokens: (B, M, C) unit image tokens; words: (L, C) unit words of one text.

    Returns:
        (B,) scores.
    """
    attn = torch.einsum("lc,bmc->blm", words, tokens)
    if leaky_slope is not None:
        attn = F.leaky_relu(attn, negative_slope=leaky_slope)
    word_best, patch_best = attn.amax(dim=2), attn.amax(dim=1)  # (B, L), (B, M)
    sims = word_best.mean(dim=1) + patch_best.mean(dim=1)
    if hrpa.word_topk is not None:
        sims = sims + _topk_mlp(hrpa.word_topk, word_best) + _topk_mlp(hrpa.patch_topk, patch_best)
    return sims


def _pairing(dense_pairing: str | None, dense_index: torch.Tensor | None, matcher_pairing: str) -> str:
    """The dense pairing scored: the one asked for, else the one a ``dense_index`` implies, else the
    matcher's (a reference with a default of its own would score another protocol than the matcher's
    forward without a word)."""
    if dense_pairing is not None and dense_pairing not in ("image", "caption"):
        raise ValueError(f"dense_pairing must be 'image' or 'caption', got {dense_pairing!r}")
    if dense_index is not None:
        if dense_pairing == "image":
            raise ValueError("dense_index gives each caption a dense row: it needs dense_pairing='caption'")
        return "caption"
    return dense_pairing if dense_pairing is not None else matcher_pairing


@torch.no_grad()
def seps_reference_scores(
    matcher,
    img: torch.Tensor,
    caps: torch.Tensor,
    lens: torch.Tensor,
    dense: torch.Tensor | None = None,
    dense_lens: torch.Tensor | None = None,
    *,
    dense_pairing: str | None = None,
    dense_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores of every (image, caption) pair, one caption at a time against all images.

    Args:
        matcher: a SEPS/LAPS matcher in eval mode (its resolved ``config`` chooses code or paper
            equations: ``score_mode``, ``dense_mode``, ``similarity``, ``hrpa_topk``, ``use_dense``, and
            the default ``dense_pairing``).
        img: (B_v, L_v, C) raw image tokens (token 0 is CLS when ``config.has_cls``).
        caps: (B_t, L, C) raw caption tokens; lens: (B_t,) valid lengths.
        dense: raw dense-text tokens, or None (LAPS). ``dense_pairing="image"``: (B_v, L_d, C), image v
            scored with its own dense text. ``"caption"`` (official protocol): caption j uses dense row
            ``dense_index[j]`` (default j, i.e. (B_t, L_d, C)).
        dense_lens: valid lengths of the dense rows.
        dense_pairing: ``"image"`` or ``"caption"``; None: the matcher's ``config.dense_pairing`` (what its
            forward scores), or ``"caption"`` when a ``dense_index`` is given. An explicit value scores that
            protocol whatever the matcher was built with.
        dense_index: (B_t,) dense row of each caption (``"caption"`` pairing only).

    Returns:
        (B_v, B_t) scores in ``img``'s dtype.

    Raises:
        ValueError: a training-mode matcher or a switch the reference lacks, an unknown ``dense_pairing``,
            a ``dense_index`` with ``dense_pairing="image"``, or inputs the matcher's forward refuses (its
            own checks: token count and width, lengths in [1, L], finiteness); a ``dense_index`` that is not
            (B_t,) integer rows of ``dense``.
    """
    cfg = matcher.config
    if matcher.training:
        raise ValueError("the reference scores eval-mode matchers (hard top-K selection)")
    if cfg.joint_score:
        raise ValueError("the reference implements joint_score=False only")
    if cfg.saliency != "mean_patch":
        raise ValueError("the reference implements the official mean-patch saliency only")
    pairing = _pairing(dense_pairing, dense_index, cfg.dense_pairing)
    use_dense = dense is not None and cfg.use_dense
    # The matcher's own input checks, those of its forward: a reference that scored what the matcher
    # refuses (lengths past the token axis cut short, 20 tokens read as CLS + 19 patches) would compare
    # the matcher with nothing it computes.
    matcher.validate_images(img)
    lens = matcher.validate_text(caps, lens)
    if use_dense:  # image-tied: a row per image; caption-tied: one per caption, or those dense_index picks
        rows = img.shape[0] if pairing == "image" else (caps.shape[0] if dense_index is None else None)
        dense_lens = matcher.validate_text(dense, dense_lens, "dense_tokens", batch=rows)
    if use_dense and pairing == "caption":
        index = torch.arange(caps.shape[0]) if dense_index is None else dense_index
        dense_index = check_txt2img(
            index, caps.shape[0], dense.shape[0], rows="dense rows", name="dense_index"
        )
    else:
        dense_index = None
    k, beta = cfg.num_keep, cfg.beta
    paper = cfg.score_mode == "predictor"
    slope = cfg.leaky_slope if cfg.similarity == "leaky_relu" else None
    cls_tok = img[:, :1] if cfg.has_cls else None
    patches = img[:, int(cfg.has_cls) :]
    unit = F.normalize(patches, dim=-1)
    s_im = (F.normalize(patches.mean(dim=1, keepdim=True), dim=-1) * unit).sum(dim=-1)  # (B_v, N)
    s_pred = torch.sigmoid(matcher.scorer.mlp(patches).squeeze(-1)) if paper else None  # Eq. (1)
    sims = torch.zeros(img.shape[0], caps.shape[0], dtype=img.dtype)

    def select(text: torch.Tensor, net, rows: slice = slice(None)):
        """Score, sort, gather, aggregate the patches of images ``rows`` for one text (L, C)."""
        s_t = (F.normalize(text.mean(dim=0), dim=-1) * unit[rows]).sum(dim=-1)
        if paper:  # Eq. (3) with one guiding text
            score = (1 - 2 * beta) * s_pred[rows] + 2 * beta * (_minmax(s_t) + _minmax(s_im[rows]))
        else:  # official: s_im + s_t
            score = s_im[rows] + s_t
        chosen, extra = _token_sparse(patches[rows], score, k)
        return _aggregate(net, chosen), extra

    def align(aggr, extra, words, rows: slice = slice(None)):
        parts = ([cls_tok[rows]] if cls_tok is not None else []) + [aggr, extra]
        tokens = F.normalize(torch.cat(parts, dim=1), dim=-1)
        return _hrpa(matcher.hrpa, slope, tokens, F.normalize(words, dim=-1))

    aggr_dense = matcher.aggr_net_dense or matcher.aggr_net
    image_rows = [slice(v, v + 1) for v in range(img.shape[0])]
    for i in range(caps.shape[0]):
        words = caps[i, : lens[i]]
        aggr, extra = select(words, matcher.aggr_net)
        if not use_dense:
            sims[:, i] = align(aggr, extra, words)
            continue
        # Caption-tied dense text meets every image at once; image-tied dense text one image at a time.
        for rows in [slice(None)] if dense_index is not None else image_rows:
            row = int(dense_index[i]) if dense_index is not None else rows.start
            text = dense[row, : dense_lens[row]]
            aggr_d, extra_d = select(text, aggr_dense, rows)
            if cfg.dense_mode == "guide":  # paper: one token set, aligned with the caption
                sims[rows, i] = align(aggr[rows] + aggr_d, 0.5 * (extra[rows] + extra_d), words, rows)
            else:  # official SEPS: its own branch, aligned with the dense text, scores summed
                sims[rows, i] = align(aggr[rows], extra[rows], words, rows) + align(
                    aggr_d, extra_d, text, rows
                )
    return sims
