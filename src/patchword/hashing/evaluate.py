"""Evaluation of a UCMFH model: binary codes of a split, then I->T and T->I Hamming-ranking metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from patchword.hashing.config import HashEvalConfig
from patchword.hashing.dataset import HashDataset
from patchword.hashing.metrics import retrieval_report
from patchword.hashing.model import UCMFH

__all__ = ["encode_hashing_split", "evaluate_hashing"]


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


def _report(q, db, ql, dbl, ec: HashEvalConfig, measure: str) -> dict[str, float]:
    rep = retrieval_report(q, db, ql, dbl, map_k=ec.topk, ks=ec.ks, measure=measure)
    out = {f"map@{ec.topk}": rep["map"]}
    out.update({f"p@{k}": v for k, v in rep["precision"].items()})
    out.update({f"r@{k}": v for k, v in rep["recall"].items()})
    if ec.map_all:
        out["map@all"] = retrieval_report(q, db, ql, dbl, map_k=len(db), ks=[1], measure=measure)["map"]
    return out


def evaluate_hashing(
    model: UCMFH, data: HashDataset, ec: HashEvalConfig, device: str | torch.device = "cpu"
) -> dict[str, Any]:
    """I->T and T->I metrics of ``model`` on ``data.query`` against ``data.retrieval`` (Hamming ranking).

    Keys: ``i2t_map@50``, ``i2t_p@k``, ``i2t_r@k`` and the ``t2i_`` versions, plus ``fusion`` (results of
    ``official_fused`` models use the target's paired modality at query time and must be labelled so).
    """
    q_img, q_txt = encode_hashing_split(model, data.query.image, data.query.text, device)
    db_img, db_txt = encode_hashing_split(model, data.retrieval.image, data.retrieval.text, device)
    ql, dbl = data.query.relevance, data.retrieval.relevance
    out: dict[str, Any] = {
        "bits": model.bits,
        "fusion": model.fusion,
        "relevance": "labels" if data.has_labels else "pair",
    }
    for name, q, db in (("i2t", q_img, db_txt), ("t2i", q_txt, db_img)):
        out.update({f"{name}_{k}": v for k, v in _report(q, db, ql, dbl, ec, "hamming").items()})
    return out
