"""UCMFH cross-modal hashing: data, model, losses (in :mod:`patchword.losses`), metrics, codes and search.

Modules, one job each: :mod:`~patchword.hashing.config` (``HashRunConfig``), :mod:`~.dataset` (``HashSplit``,
``HashDataset``, validation, protocol split), :mod:`~.readers` (file formats), :mod:`~.unpickle` (the
restricted pickle reader), :mod:`~.synthetic`, :mod:`~.model` (``UCMFH``), :mod:`~.build` (config ->
dataset / model), :mod:`~.usedkeys` (keys a new run's settings would not use), :mod:`~.trainer`,
:mod:`~.evaluate`, :mod:`~.runner` (``train_hashing``, ``resume_hashing``), :mod:`~.openrun`
(``load_hashing_run``), :mod:`~.rundir` (claiming and locking a run directory),
:mod:`~.codes` (binary codes, Hamming search), :mod:`~.metrics`, :mod:`~.cli`.

>>> from patchword.hashing import map_at_k, UCMFH, HammingIndex, pack_codes
>>> mAP = map_at_k(q_codes, db_codes, q_labels, db_labels, k=50)   # doctest: +SKIP

See ``docs/hashing.md`` for the protocol, the decisions that differ from the official code (codes are
unimodal at query time by default; the official fused encoder only as ``fusion="official_fused"``) and the
loss analysis.
"""

from patchword.hashing.build import build_hashing_dataset, build_hashing_model
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
from patchword.hashing.config import HashRunConfig
from patchword.hashing.dataset import HashDataset, HashSplit, make_split, split_dataset
from patchword.hashing.evaluate import encode_hashing_split, evaluate_hashing
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
from patchword.hashing.readers import (
    convert_pickle_to_npz,
    load_mat,
    load_mirflickr25k_text,
    load_pairs,
    load_split,
    load_split_dir,
)
from patchword.hashing.runner import load_hashing_run, resume_hashing, train_hashing
from patchword.hashing.synthetic import make_synthetic_multilabel, synthetic_dataset

__all__ = [
    "FUSION_MODES",
    "HammingIndex",
    "HashDataset",
    "HashHead",
    "HashRunConfig",
    "HashSplit",
    "PRCurve",
    "UCMFH",
    "UCMFHOutput",
    "as_pm1_codes",
    "binarize",
    "build_hashing_dataset",
    "build_hashing_model",
    "convert_pickle_to_npz",
    "cosine_topk",
    "encode_hashing_split",
    "evaluate_hashing",
    "hamming_distance",
    "hamming_distance_packed",
    "hamming_topk",
    "load_hashing_run",
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
    "resume_hashing",
    "retrieval_report",
    "split_dataset",
    "synthetic_dataset",
    "train_hashing",
    "unpack_codes",
]
