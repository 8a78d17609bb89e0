"""Evaluation of a UCMFH model: binary codes of a split, then I->T and T->I Hamming-ranking metrics."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from patchword.hashing.config import HashEvalConfig
from patchword.hashing.dataset import HashDataset
from patchword.hashing.metrics import retrieval_report
from patchword.hashing.model import UCMFH

__all__ = ["effective_cutoffs", "encode_hashing_split", "evaluate_hashing"]

_logger = logging.getLogger(__name__)


@torch.no_grad()
def encode_hashing_split(
    model: UCMFH, image: np.ndarray, text: np.ndarray, device: str | torch.device = "cpu"
) -> tuple[np.ndarray, np.ndarray]:
    """±1 int8 codes ``(image (N, bits), text (N, bits))`` of N feature pairs, in eval mode.

    Args:
        model: the hashing model (put in eval mode).
        image: (N, d_img) float32 image features.
        text: (N, d_txt) float32 text features; row i pairs with ``image[i]`` (only ``official_fused``
            models use the pairing; unimodal codes depend on their own modality alone).
        device: where to run the model.
    """
    model.eval()
    img, txt = torch.from_numpy(image).to(device), torch.from_numpy(text).to(device)
    h_img, h_txt = model.encode_pairs(img, txt)
    return (
        UCMFH.codes(h_img).cpu().numpy().astype(np.int8),
        UCMFH.codes(h_txt).cpu().numpy().astype(np.int8),
    )


def effective_cutoffs(ec: HashEvalConfig, n_db: int) -> tuple[int, list[int], dict[str, Any]]:
    """The cut-offs a database of ``n_db`` items can measure: ``(topk, ks, capped)``, each ``min(k, n_db)``
    (``ks`` without repeats), and ``capped`` (empty when none was): ``{"retrieval_items": n_db,
    "eval.topk": {asked: used}, "eval.ks": {asked: used}}``. A cut-off past the database measured the
    whole ranking under the asked label (``eval.topk=500`` on 96 items printed a "map@500" that was mAP@96,
    ``eval.ks=[96,200]`` a p@200 equal to p@96); the defaults (``topk`` 50) exceed tiny test sets, so the
    metrics are labelled with the cut-off used rather than refused."""
    topk = min(ec.topk, n_db)
    ks = sorted({min(k, n_db) for k in ec.ks})
    capped: dict[str, Any] = {}
    if ec.topk > n_db:
        capped["eval.topk"] = {str(ec.topk): topk}
    if any(k > n_db for k in ec.ks):
        capped["eval.ks"] = {str(k): n_db for k in ec.ks if k > n_db}
    return topk, ks, ({"retrieval_items": n_db, **capped} if capped else {})


def _finite_or_none(value: float | None) -> float | None:
    """A metric for JSON: NaN (recall of queries none of which has a relevant item) is ``null``, which
    strict parsers accept (a bare ``NaN`` is not JSON)."""
    return None if value is None or math.isnan(value) else value


def _report(q, db, ql, dbl, ec: HashEvalConfig, measure: str) -> dict[str, float | int | None]:
    topk, ks, _ = effective_cutoffs(ec, len(db))
    rep = retrieval_report(q, db, ql, dbl, map_k=topk, ks=ks, measure=measure)
    out: dict[str, float | int | None] = {f"map@{topk}": _finite_or_none(rep["map"])}
    out.update({f"p@{k}": _finite_or_none(v) for k, v in rep["precision"].items()})
    out.update({f"r@{k}": _finite_or_none(v) for k, v in rep["recall"].items()})
    # queries with no relevant item score 0 in mAP and are left out of recall: how many there were
    out["queries_without_relevant"] = rep["queries_without_relevant"]
    if ec.map_all:
        out["map@all"] = _finite_or_none(
            retrieval_report(q, db, ql, dbl, map_k=len(db), ks=[1], measure=measure)["map"]
        )
    return out


def evaluate_hashing(
    model: UCMFH, data: HashDataset, ec: HashEvalConfig, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """I->T and T->I metrics of ``model`` on ``data.query`` against ``data.retrieval`` (Hamming ranking).

    Keys: ``i2t_map@50``, ``i2t_p@k``, ``i2t_r@k`` (``None`` when no query has a relevant item),
    ``i2t_queries_without_relevant`` and the ``t2i_`` versions, plus ``fusion`` (results of
    ``official_fused`` models use the target's paired modality at query time and must be labelled so; with
    their ``eval_batch_size``, the size of the blocks whose pairs attend to each other, which changes the
    codes). A cut-off larger than the retrieval set is labelled with the one measured (``map@96``) and
    listed under ``capped_cutoffs`` (:func:`effective_cutoffs`), with a warning.
    """
    q_img, q_txt = encode_hashing_split(model, data.query.image, data.query.text, device)
    db_img, db_txt = encode_hashing_split(model, data.retrieval.image, data.retrieval.text, device)
    ql, dbl = data.query.relevance, data.retrieval.relevance
    out: dict[str, Any] = {
        "bits": model.bits,
        "fusion": model.fusion,
        "relevance": "labels" if data.has_labels else "pair",
    }
    if model.fusion == "official_fused":  # its blocks' pairs attend to each other: the size changes the codes
        out["eval_batch_size"] = model.eval_batch_size
    capped = effective_cutoffs(ec, len(data.retrieval))[2]
    if capped:
        _logger.warning(
            "cut-offs past the %d retrieval items are reported at %d: %s",
            len(data.retrieval),
            len(data.retrieval),
            ", ".join(f"{key}={asked}" for key in ("eval.topk", "eval.ks") for asked in capped.get(key, {})),
        )
        out["capped_cutoffs"] = capped
    for name, q, db in (("i2t", q_img, db_txt), ("t2i", q_txt, db_img)):
        out.update({f"{name}_{k}": v for k, v in _report(q, db, ql, dbl, ec, "hamming").items()})
    return out
