"""Plain per-caption reference implementations of SEPS/LAPS, written from reference/seps_laps.md.

These follow the structure of the official ``lib/cross_net.py`` (sort, gather, aggregation MLP on the
gathered tokens, bmm, ``mask_xattn_one_text``) one caption at a time, so the vectorised matcher can be
checked against them. They borrow the matcher's parameters but none of its code paths.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _token_sparse(patches: torch.Tensor, score: torch.Tensor, k: int):
    """Official TokenSparse: (B, N, C), (B, N) -> select (B, K, C), extra (B, 1, C)."""
    c = patches.shape[-1]
    score_sort, score_index = torch.sort(score, dim=1, descending=True)
    keep = score_index[:, :k]
    select = torch.gather(patches, 1, keep.unsqueeze(-1).expand(-1, -1, c))
    non_keep = score_index[:, k:]
    non_tokens = torch.gather(patches, 1, non_keep.unsqueeze(-1).expand(-1, -1, c))
    non_score = F.softmax(score_sort[:, k:], dim=1).unsqueeze(-1)
    extra = torch.sum(non_tokens * non_score, dim=1, keepdim=True)
    return select, extra


def _aggregate(aggr_net, select: torch.Tensor) -> torch.Tensor:
    """Official TokenAggregation.forward on gathered tokens: (B, K, C) -> (B, N_c, C)."""
    weight = aggr_net.weight(select).transpose(2, 1) * aggr_net.scale
    weight = F.softmax(weight, dim=2)
    return torch.bmm(weight, select)


def _xattn_one_text(tokens: torch.Tensor, words: torch.Tensor, slope: float | None) -> torch.Tensor:
    """Official mask_xattn_one_text: (B_v, M, C) unit tokens, (L, C) unit words -> (B_v,)."""
    words = words.unsqueeze(0).expand(tokens.shape[0], -1, -1)
    attn = torch.bmm(words, tokens.transpose(1, 2))  # (B_v, L, M)
    if slope is not None:
        attn = F.leaky_relu(attn, negative_slope=slope)
    row_sim = attn.max(dim=2)[0].mean(dim=1)
    col_sim = attn.max(dim=1)[0].mean(dim=1)
    return row_sim + col_sim


def _split(img: torch.Tensor, has_cls: bool):
    if has_cls:
        return img[:, :1], img[:, 1:]
    return None, img


def _final(cls_tok, aggr, extra):
    parts = ([cls_tok] if cls_tok is not None else []) + [aggr, extra]
    return F.normalize(torch.cat(parts, dim=1), dim=-1)


def seps_code_reference(matcher, img, caps, lens, dense=None, dense_lens=None, pairing="image"):
    """Official SEPS (dense given) / LAPS (dense None) scores, one caption at a time: (B_v, B_t)."""
    cfg = matcher.config
    k = math.ceil(cfg.num_patches * cfg.sparse_ratio)
    cls_tok, patches = _split(img, cfg.has_cls)
    patches_n = F.normalize(patches, dim=-1)
    glo = F.normalize(patches.mean(dim=1, keepdim=True), dim=-1)
    s_im = (glo * patches_n).sum(dim=-1)
    b_v, b_t = img.shape[0], caps.shape[0]
    sims = torch.zeros(b_v, b_t, dtype=img.dtype)

    def branch(text: torch.Tensor, v_index=None) -> torch.Tensor:
        # text: (L, C) raw tokens of one caption; scores every image (or image v_index) against it
        p, pn, sim, ct = patches, patches_n, s_im, cls_tok
        if v_index is not None:
            p, pn, sim = p[v_index : v_index + 1], pn[v_index : v_index + 1], sim[v_index : v_index + 1]
            ct = ct[v_index : v_index + 1] if ct is not None else None
        glo_t = F.normalize(text.mean(dim=0, keepdim=True), dim=-1)
        score = sim + (glo_t.unsqueeze(0) * pn).sum(dim=-1)
        select, extra = _token_sparse(p, score, k)
        tokens = _final(ct, _aggregate(matcher.aggr_net, select), extra)
        return _xattn_one_text(tokens, F.normalize(text, dim=-1), cfg.leaky_slope)

    for i in range(b_t):
        sims[:, i] = branch(caps[i, : lens[i]])
        if dense is None:
            continue
        if pairing == "caption":
            sims[:, i] += branch(dense[i, : dense_lens[i]])
        else:
            for v in range(b_v):
                sims[v, i] += branch(dense[v, : dense_lens[v]], v_index=v)[0]
    return sims


def _minmax(x: torch.Tensor) -> torch.Tensor:
    return (x - x.min()) / (x.max() - x.min() + 1e-8)


def _topk_mlp(mlp_module, values: torch.Tensor) -> torch.Tensor:
    k = mlp_module.k
    top = values.sort(descending=True).values[:k]
    top = F.pad(top, (0, k - top.shape[0]))
    return mlp_module.mlp(top).squeeze(-1)


def seps_paper_reference(matcher, img, caps, lens, dense=None, dense_lens=None, pairing="image"):
    """Paper-variant scores (Eqs. 1-5 as the project reads them) one pair at a time: (B_v, B_t).

    Eval mode only (hard decisions). Per pair (v, i): s_p = sigmoid(MLP(P_v)); each branch's score is
    (1 - 2 beta) s_p + 2 beta (minmax(s_text) + minmax(s_im)); top-K; W_s / W_d aggregation on the gathered
    tokens; aggregated tokens summed, fusion tokens averaged; HRPA against the sparse caption with cosine
    and the TopK-MLP terms.
    """
    cfg = matcher.config
    beta = cfg.beta
    k = math.ceil(cfg.num_patches * cfg.sparse_ratio)
    cls_tok, patches = _split(img, cfg.has_cls)
    b_v, b_t = img.shape[0], caps.shape[0]
    sims = torch.zeros(b_v, b_t, dtype=img.dtype)
    for v in range(b_v):
        p = patches[v]
        pn = F.normalize(p, dim=-1)
        s_im = pn @ F.normalize(p.mean(dim=0), dim=-1)
        s_p = torch.sigmoid(matcher.scorer.mlp(p).squeeze(-1))

        def select(text: torch.Tensor, aggr_net, p=p, pn=pn, s_p=s_p, s_im=s_im):
            s_t = pn @ F.normalize(text.mean(dim=0), dim=-1)
            score = (1 - 2 * beta) * s_p + 2 * beta * (_minmax(s_t) + _minmax(s_im))
            sel, extra = _token_sparse(p[None], score[None], k)
            return _aggregate(aggr_net, sel)[0], extra[0]

        for i in range(b_t):
            cap = caps[i, : lens[i]]
            aggr, extra = select(cap, matcher.aggr_net)
            if dense is not None:
                d = dense[i] if pairing == "caption" else dense[v]
                n_d = dense_lens[i] if pairing == "caption" else dense_lens[v]
                aggr_d, extra_d = select(d[:n_d], matcher.aggr_net_dense)
                aggr, extra = aggr + aggr_d, 0.5 * (extra + extra_d)
            parts = ([cls_tok[v]] if cls_tok is not None else []) + [aggr, extra]
            tokens = F.normalize(torch.cat(parts, dim=0), dim=-1)  # (M, C)
            attn = F.normalize(cap, dim=-1) @ tokens.T  # (L, M) plain cosine
            word_best, patch_best = attn.max(dim=1)[0], attn.max(dim=0)[0]
            sims[v, i] = (
                word_best.mean()
                + _topk_mlp(matcher.hrpa.word_topk, word_best)
                + patch_best.mean()
                + _topk_mlp(matcher.hrpa.patch_topk, patch_best)
            )
    return sims
