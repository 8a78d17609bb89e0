"""The official SCAN / NAAF forward, on the official checkpoint layout: the yardstick of the importer.

Written from reference/naaf_scan_vse.md (sections 1.1-1.2, 2.1, 3.1-3.5), not from the importer or the
matchers: the encoders are rebuilt under the official module names (``fc``, ``embed`` / ``embed.glove``,
``rnn``) and load the official state dicts (``checkpoint["model"] = [img_state, txt_state]``) with
``strict=True``; the similarities are the official per-caption loops (``xattn_score_t2i``,
``xattn_score_i2t``, NAAF's ``xattn_score_test``), reading their settings from the checkpoint's ``opt``.

As in the official evaluation (``encode_data``), the encoders run in float32 and their outputs are stored
in float64 arrays, so the cross attention runs in float64. Slow and literal: for tests only.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

__all__ = [
    "OfficialImageEncoder",
    "OfficialTextEncoder",
    "official_encoders",
    "official_similarities",
    "official_modules",
    "scan_xattn",
    "naaf_xattn_test",
]


def _l2norm(x: torch.Tensor, dim: int, eps: float = 1e-8) -> torch.Tensor:
    """Official ``l2norm``: ``x / (||x|| + eps)`` (eps outside the root)."""
    return x / (x.pow(2).sum(dim=dim, keepdim=True).sqrt() + eps)


class OfficialImageEncoder(nn.Module):
    """``EncoderImagePrecomp`` (``basic``) / ``EncoderImageWeightNormPrecomp`` (``weight_norm``, dim=None):
    (B, R, img_dim) -> (B, R, embed_size), L2-normalised unless ``no_imgnorm``."""

    def __init__(self, img_dim: int, embed_size: int, enc_type: str, no_imgnorm: bool) -> None:
        super().__init__()
        self.no_imgnorm = no_imgnorm
        fc = nn.Linear(img_dim, embed_size)
        if enc_type == "weight_norm":  # the official (deprecated) hook, for its fc.weight_g / fc.weight_v
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                fc = torch.nn.utils.weight_norm(fc, dim=None)
        self.fc = fc

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.fc(images)
        return features if self.no_imgnorm else _l2norm(features, -1)


class _GloveEmb(nn.Module):
    """NAAF's ``GloveEmb`` without the random part (``add_rand_embed=False``): only ``glove``."""

    def __init__(self, vocab_size: int, word_dim: int) -> None:
        super().__init__()
        self.glove = nn.Embedding(vocab_size, word_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.glove(ids)


class OfficialTextEncoder(nn.Module):
    """SCAN / NAAF ``EncoderText`` and NAAF's ``GloveRNNEncoder``: embedding, GRU over packed sequences,
    the two directions averaged (bidirectional), L2-normalised per word unless ``no_txtnorm``."""

    def __init__(
        self,
        vocab_size: int,
        word_dim: int,
        embed_size: int,
        num_layers: int,
        bidirectional: bool,
        no_txtnorm: bool,
        glove: bool,
    ) -> None:
        super().__init__()
        self.no_txtnorm = no_txtnorm
        self.bidirectional = bidirectional
        self.embed = _GloveEmb(vocab_size, word_dim) if glove else nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(word_dim, embed_size, num_layers, batch_first=True, bidirectional=bidirectional)

    def forward(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """(B, L) ids sorted by decreasing length (the official collate sorts) -> (B, max(lengths), D)."""
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True)
        out, _ = self.rnn(packed)
        emb, _ = pad_packed_sequence(out, batch_first=True)
        if self.bidirectional:
            half = emb.shape[2] // 2
            emb = (emb[:, :, :half] + emb[:, :, half:]) / 2
        return emb if self.no_txtnorm else _l2norm(emb, -1)


def _is_naaf(opt: argparse.Namespace) -> bool:
    return hasattr(opt, "thres_safe")


def official_modules(opt: argparse.Namespace) -> tuple[OfficialImageEncoder, OfficialTextEncoder]:
    """The official encoders ``opt`` describes, freshly initialised (as ``SCAN(opt)`` / ``NAAF(opt)`` do)."""
    naaf = _is_naaf(opt)
    glove = naaf and opt.precomp_enc_text_type == "GloVe"
    image = OfficialImageEncoder(opt.img_dim, opt.embed_size, opt.precomp_enc_type, opt.no_imgnorm)
    text = OfficialTextEncoder(
        opt.vocab_size,
        opt.word_dim,
        opt.embed_size,
        opt.num_layers,
        bidirectional=True if naaf else opt.bi_gru,  # NAAF's encoders are always bidirectional
        no_txtnorm=False if glove else opt.no_txtnorm,  # GloveRNNEncoder is built with no_txtnorm=False
        glove=glove,
    )
    return image, text


def official_encoders(checkpoint: dict[str, Any]) -> tuple[OfficialImageEncoder, OfficialTextEncoder]:
    """The official encoders of ``checkpoint`` (its ``opt`` and ``model`` state dicts, loaded strictly)."""
    image, text = official_modules(checkpoint["opt"])
    img_state, txt_state = checkpoint["model"]
    image.load_state_dict(img_state, strict=True)
    text.load_state_dict(txt_state, strict=True)
    return image.eval(), text.eval()


def _raw_feature_norm(attn: torch.Tensor, kind: str) -> torch.Tensor:
    """``func_attention``'s first normalisation of (n, sourceL, queryL) scores, along the query axis."""
    if kind == "softmax":
        return torch.softmax(attn, dim=2)
    if kind in ("clipped_l2norm", "clipped"):
        attn = F.leaky_relu(attn, 0.1)
    if kind in ("l2norm", "clipped_l2norm"):
        attn = _l2norm(attn, 2)
    elif kind not in ("clipped", "no_norm"):
        raise ValueError(f"the official code cannot run raw_feature_norm={kind!r}")
    return attn


def _func_attention(query: torch.Tensor, context: torch.Tensor, kind: str, smooth: float) -> torch.Tensor:
    """query (n, queryL, d), context (n, sourceL, d) -> attended context (n, queryL, d)."""
    attn = torch.bmm(context, query.transpose(1, 2))  # (n, sourceL, queryL)
    attn = _raw_feature_norm(attn, kind).transpose(1, 2)  # (n, queryL, sourceL)
    attn = torch.softmax(attn * smooth, dim=2)
    return torch.bmm(attn, context)


def _scan_cosine(x1: torch.Tensor, x2: torch.Tensor, dim: int, eps: float = 1e-8) -> torch.Tensor:
    return (x1 * x2).sum(dim) / (x1.norm(2, dim) * x2.norm(2, dim)).clamp(min=eps)


def _aggregate(row_sim: torch.Tensor, opt: argparse.Namespace) -> torch.Tensor:
    """(n_image, n_items) relevances -> (n_image,) by ``opt.agg_func``."""
    if opt.agg_func == "LogSumExp":
        return torch.log(torch.exp(row_sim * opt.lambda_lse).sum(dim=1)) / opt.lambda_lse
    if opt.agg_func == "Max":
        return row_sim.max(dim=1).values
    if opt.agg_func == "Sum":
        return row_sim.sum(dim=1)
    if opt.agg_func == "Mean":
        return row_sim.mean(dim=1)
    raise ValueError(f"unknown agg_func {opt.agg_func!r}")


def scan_xattn(images, captions, cap_lens, opt) -> torch.Tensor:
    """SCAN's ``xattn_score_t2i`` / ``xattn_score_i2t`` by ``opt.cross_attn``: images (n_img, R, d),
    captions (n_cap, L, d), cap_lens (n_cap,) -> (n_img, n_cap).

    t2i: the words attend over the regions and the word relevances are aggregated; i2t: the regions attend
    over the words of the caption and the region relevances are aggregated.
    """
    columns = []
    for i in range(captions.shape[0]):
        cap_i = captions[i, : int(cap_lens[i])].unsqueeze(0).repeat(images.shape[0], 1, 1)
        query, context = (cap_i, images) if opt.cross_attn == "t2i" else (images, cap_i)
        attended = _func_attention(query, context, opt.raw_feature_norm, opt.lambda_softmax)
        columns.append(_aggregate(_scan_cosine(query, attended, 2), opt))
    return torch.stack(columns, dim=1)


def naaf_xattn_test(images, captions, cap_lens, opt) -> torch.Tensor:
    """NAAF's test-time score (``xattn_score_test``, intra relation on, threshold ``opt.thres_safe``)."""
    n_image, n_region = images.shape[:2]
    lam = opt.lambda_softmax
    columns = []
    for i in range(captions.shape[0]):
        n_word = int(cap_lens[i])
        cap = captions[i, :n_word].unsqueeze(0)
        cap_i = cap.repeat(n_image, 1, 1)
        attn = torch.bmm(cap_i, images.transpose(1, 2))  # (n_image, n_word, R)
        attn_row = (attn - opt.thres_safe).reshape(n_image * n_word, n_region)
        row_max = attn_row.max(dim=1).values.unsqueeze(-1)  # (n_image * n_word, 1)
        # Negative branch, gated by the intra-caption smoothing of Row_max (softmax of 5 U U^T).
        intra = torch.softmax(torch.bmm(cap, cap.transpose(1, 2)).reshape(n_word, n_word) * 5, dim=1)
        gate = torch.bmm(intra.expand(n_image, -1, -1), row_max.reshape(n_image, n_word, 1))
        neg = (row_max * gate.reshape(-1, 1).lt(0).double()).reshape(n_image, n_word)
        # Positive branch 1: masked exp over the regions above threshold, l1-normalised.
        weights = torch.exp(attn_row.masked_fill(attn_row.le(0), -1e9) * lam)
        weights = (weights / (weights.abs().sum(dim=1, keepdim=True) + 1e-8)).reshape(
            n_image, n_word, n_region
        )
        attended = torch.bmm(weights, images)
        pos_f = (cap_i * attended).sum(2) / attended.norm(2, 2).clamp(min=1e-8)  # divides by ||x2|| only
        # Positive branch 2: SCAN t2i attention on the raw scores, the words' l2norm per region.
        relevance = _l2norm(F.leaky_relu(attn.transpose(1, 2), 0.1), 2).transpose(1, 2)
        relevance = torch.softmax(relevance.reshape(n_image * n_word, n_region) * lam, dim=1)
        pos_r = (attn * relevance.reshape(n_image, n_word, n_region)).sum(-1)
        columns.append((neg + pos_f + pos_r).mean(dim=1))
    return torch.stack(columns, dim=1)


@torch.no_grad()
def official_similarities(
    checkpoint: dict[str, Any], images: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """The official evaluation's similarity matrix of ``checkpoint``.

    Args:
        checkpoint: ``{"model": [img_state, txt_state], "opt": argparse.Namespace, ...}`` as saved.
        images: (n_img, R, img_dim) float32 region features.
        ids: (n_cap, L) official token ids, padded with 0; ``lengths`` (n_cap,) valid counts.

    Returns:
        (n_img, n_cap) float64 scores (NAAF: ``xattn_score_test``; SCAN: by ``opt.cross_attn``).
    """
    opt = checkpoint["opt"]
    image_encoder, text_encoder = official_encoders(checkpoint)
    img = image_encoder(images.float()).double()
    # The official loader sorts each batch by decreasing length; encode in that order, then put back.
    order = torch.argsort(lengths, descending=True, stable=True)
    emb = text_encoder(ids[order], [int(n) for n in lengths[order]]).double()
    cap = torch.zeros_like(emb)
    cap[order] = emb
    if _is_naaf(opt):
        return naaf_xattn_test(img, cap, lengths, opt)
    return scan_xattn(img, cap, lengths, opt)
