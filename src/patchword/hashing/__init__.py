"""UCMFH cross-modal hashing: data, model, losses (in :mod:`patchword.losses`), metrics, codes and search.

>>> from patchword.hashing import map_at_k, UCMFH, HammingIndex, pack_codes
>>> mAP = map_at_k(q_codes, db_codes, q_labels, db_labels, k=50)   # doctest: +SKIP

See ``docs/hashing.md`` for the protocol, the decisions that differ from the official code (codes are
unimodal at query time by default; the official fused encoder only as ``fusion="official_fused"``) and the
loss analysis.
"""

from patchword.hashing.codes import (
    HammingIndex,
    as_pm1_codes,
    binarize,
    cosine_topk,
    hamming_distance,
    hamming_distance_packed,
    hamming_topk,
    pack_codes,
    unpack_codes,
)
from patchword.hashing.data import (
    HashDataset,
    HashSplit,
    load_mat,
    load_mirflickr25k_text,
    load_pairs,
    load_split,
    load_split_dir,
    make_split,
    make_synthetic_multilabel,
    split_dataset,
    synthetic_dataset,
)
from patchword.hashing.metrics import (
    PRCurve,
    map_at_all,
    map_at_k,
    plot_pr_curves,
    precision_at_k,
    precision_recall_curve,
    recall_at_k,
    retrieval_report,
)
from patchword.hashing.model import FUSION_MODES, UCMFH, HashHead, UCMFHOutput

__all__ = [
    "FUSION_MODES",
    "HammingIndex",
    "HashDataset",
    "HashHead",
    "HashSplit",
    "PRCurve",
    "UCMFH",
    "UCMFHOutput",
    "as_pm1_codes",
    "binarize",
    "cosine_topk",
    "hamming_distance",
    "hamming_distance_packed",
    "hamming_topk",
    "load_mat",
    "load_mirflickr25k_text",
    "load_pairs",
    "load_split",
    "load_split_dir",
    "make_split",
    "make_synthetic_multilabel",
    "map_at_all",
    "map_at_k",
    "pack_codes",
    "plot_pr_curves",
    "precision_at_k",
    "precision_recall_curve",
    "recall_at_k",
    "retrieval_report",
    "split_dataset",
    "synthetic_dataset",
    "unpack_codes",
]
