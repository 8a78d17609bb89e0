"""Hashing retrieval metrics: mAP@K (UCMFH / DJSRH ``calculate_top_map``), mAP@all, precision@K, recall@K
and the Hamming-radius precision-recall curve.

Conventions (as the official ``calculate_top_map``, with its unstable tie order made deterministic):

* **relevance**: a database item is relevant to a query when they share at least one label (multi-hot
  ``(N, L)`` labels), or when their ids are equal (``(N,)`` integer ids; pair-based relevance for data
  without labels: query i's only relevant item is database item i);
* **ranking**: ascending Hamming distance ``(K - q . b) / 2``, ties broken by database position (the
  official code uses ``np.argsort``'s unstable quicksort, so its tie order is arbitrary; with 16-bit
  codes ties are the rule, not the exception);
* **AP@K** ``= (1/R_K) sum_{j <= K} P@j * rel_j`` with ``R_K`` the relevant items in the top K; a query
  with ``R_K = 0`` has AP 0 and *still counts* in the mean;
* **recall@K**: relevant items in the top K / relevant items in the database, averaged over the queries
  that have at least one relevant item (a query with none has no defined recall).

Everything is vectorised over queries and processed in blocks of queries, so memory stays bounded for
any database size. Real-valued embeddings can be ranked with ``measure="cosine"`` (descending cosine,
ties by database position) for the float baselines.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from patchword._validation import check_tensor
from patchword.errors import MissingExtraError
from patchword.fileio import atomic_write
from patchword.hashing.codes import as_pm1_codes

__all__ = [
    "map_at_k",
    "map_at_all",
    "precision_at_k",
    "recall_at_k",
    "retrieval_report",
    "PRCurve",
    "precision_recall_curve",
    "plot_pr_curves",
]

_BLOCK_ELEMENTS = 1 << 23
MEASURES = ("hamming", "cosine")


def _as_float(x: object, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return check_tensor(x, name, ndim=2, floating=False)


def _prepare_items(q: object, db: object, measure: str) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """-> (q (Nq, K) float32, db (Ndb, K) float32, K for Hamming / None for cosine)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    if measure == "hamming":
        qa = as_pm1_codes(q, "q_codes")
        dba = as_pm1_codes(db, "db_codes")
        if qa.shape[1] != dba.shape[1]:
            raise ValueError(f"q_codes has {qa.shape[1]} bits but db_codes has {dba.shape[1]}")
        return torch.from_numpy(qa.astype(np.float32)), torch.from_numpy(dba.astype(np.float32)), qa.shape[1]
    qt = _as_float(q, "q_codes").float()
    dbt = _as_float(db, "db_codes").float()
    if qt.shape[1] != dbt.shape[1]:
        raise ValueError(f"q_codes has dimension {qt.shape[1]} but db_codes has {dbt.shape[1]}")
    qt = torch.nn.functional.normalize(qt, dim=1)
    dbt = torch.nn.functional.normalize(dbt, dim=1)
    return qt, dbt, None


def _prepare_labels(
    q_labels: object, db_labels: object, n_q: int, n_db: int
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """-> (q, db, multi_hot). Multi-hot labels as float32 (N, L), ids as int64 (N,)."""
    tensors = []
    for x, name, n in ((q_labels, "q_labels", n_q), (db_labels, "db_labels", n_db)):
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(np.ascontiguousarray(x))
        x = check_tensor(x, name, floating=False, finite=True)
        if x.dim() not in (1, 2) or x.shape[0] != n:
            raise ValueError(
                f"{name} must be ({n},) ids or ({n}, L) multi-hot labels, one row per code, got shape "
                f"{tuple(x.shape)}"
            )
        tensors.append(x)
    ql, dbl = tensors
    if ql.dim() != dbl.dim():
        raise ValueError(
            f"q_labels and db_labels must both be ids (1-D) or both multi-hot (2-D), got {ql.dim()}-D and "
            f"{dbl.dim()}-D"
        )
    if ql.dim() == 1:
        if ql.is_floating_point() or dbl.is_floating_point():
            raise ValueError("1-D labels are ids and must be integers")
        return ql.long(), dbl.long(), False
    if ql.shape[1] != dbl.shape[1]:
        raise ValueError(f"q_labels has {ql.shape[1]} classes but db_labels has {dbl.shape[1]}")
    return (ql > 0).float(), (dbl > 0).float(), True


def _relevance(ql: torch.Tensor, dbl: torch.Tensor, multi_hot: bool) -> torch.Tensor:
    """(c, Ndb) bool relevance of a block of queries."""
    if multi_hot:
        return (ql @ dbl.T) > 0
    return ql.unsqueeze(1) == dbl.unsqueeze(0)


def _ranked_blocks(
    q: object,
    db: object,
    q_labels: object,
    db_labels: object,
    k: int | None,
    measure: str,
    need_full: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    """Yield per query block: (rel_topk (c, k) bool, n_relevant (c,), dist (c, Ndb), rel (c, Ndb)).

    ``dist`` and the full relevance are only returned with ``need_full`` (the PR curve).
    """
    qt, dbt, bits = _prepare_items(q, db, measure)
    n_q, n_db = qt.shape[0], dbt.shape[0]
    if n_q == 0 or n_db == 0:
        raise ValueError(f"need at least one query and one database item, got {n_q} and {n_db}")
    ql, dbl, multi_hot = _prepare_labels(q_labels, db_labels, n_q, n_db)
    k = n_db if k is None else int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, n_db)
    chunk = max(1, _BLOCK_ELEMENTS // n_db)
    positions = torch.arange(n_db)
    for s in range(0, n_q, chunk):
        rel = _relevance(ql[s : s + chunk], dbl, multi_hot)
        sims = qt[s : s + chunk] @ dbt.T
        dist = None
        if bits is not None:
            dist = ((bits - sims) / 2).round().long()  # exact integers (float32 is exact below 2**24)
            # Unique keys (distance, position): top-k of the keys is the stable Hamming order.
            key = dist * n_db + positions
            order = key.topk(k, dim=1, largest=False, sorted=True).indices if k < n_db else key.argsort(1)
        else:
            order = torch.sort(sims, dim=1, descending=True, stable=True).indices[:, :k]
        yield (
            rel.gather(1, order),
            rel.sum(1),
            dist if need_full else None,
            rel if need_full else None,
        )


def _average_precision(rel: torch.Tensor) -> torch.Tensor:
    """(c, k) bool ranked relevance -> (c,) AP over the top k (0 where nothing relevant is retrieved)."""
    relf = rel.double()
    hits = relf.cumsum(1)
    precision = hits / torch.arange(1, rel.shape[1] + 1, dtype=torch.float64)
    n_hit = relf.sum(1)
    return torch.where(n_hit > 0, (precision * relf).sum(1) / n_hit.clamp(min=1), torch.zeros_like(n_hit))


def map_at_k(
    q_codes: object,
    db_codes: object,
    q_labels: object,
    db_labels: object,
    k: int | None = 50,
    *,
    measure: str = "hamming",
    return_per_query: bool = False,
) -> float | tuple[float, np.ndarray]:
    """Mean average precision over the top ``k`` of a Hamming ranking (UCMFH's mAP@50 by default).

    Args:
        q_codes: (Nq, K) ±1 query codes (numpy or torch); real-valued (Nq, d) with ``measure="cosine"``.
        db_codes: (Ndb, K) ±1 database codes.
        q_labels: (Nq, L) multi-hot labels or (Nq,) integer ids of the queries.
        db_labels: (Ndb, L) or (Ndb,) likewise for the database.
        k: cut-off (clipped to Ndb); ``None`` ranks the whole database (mAP@all).
        measure: ``"hamming"`` (codes) or ``"cosine"`` (float embeddings, ties by database position).
        return_per_query: also return the (Nq,) AP of every query.

    Returns:
        mAP as a float in [0, 1] (queries without a relevant item in the top k count as 0), and the
        per-query APs when asked.
    """
    aps = torch.cat(
        [
            _average_precision(rel)
            for rel, *_ in _ranked_blocks(q_codes, db_codes, q_labels, db_labels, k, measure)
        ]
    )
    value = float(aps.mean())
    return (value, aps.numpy()) if return_per_query else value


def map_at_all(q_codes: object, db_codes: object, q_labels: object, db_labels: object, **kwargs) -> float:
    """mAP over the full ranking (official ``calculate_map``): :func:`map_at_k` with ``k=None``."""
    return map_at_k(q_codes, db_codes, q_labels, db_labels, None, **kwargs)


def _check_ks(ks: Sequence[int] | int) -> list[int]:
    ks = [ks] if isinstance(ks, int) else [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive cut-offs, got {ks}")
    return ks


def precision_at_k(
    q_codes: object,
    db_codes: object,
    q_labels: object,
    db_labels: object,
    ks: Sequence[int] | int = 50,
    *,
    measure: str = "hamming",
) -> dict[int, float]:
    """Mean precision@k (relevant items in the top k / k) for every k in ``ks`` (k clipped to Ndb)."""
    return retrieval_report(q_codes, db_codes, q_labels, db_labels, map_k=None, ks=ks, measure=measure)[
        "precision"
    ]


def recall_at_k(
    q_codes: object,
    db_codes: object,
    q_labels: object,
    db_labels: object,
    ks: Sequence[int] | int = (1, 5, 10),
    *,
    measure: str = "hamming",
) -> dict[int, float]:
    """Mean recall@k over the queries with at least one relevant database item (R@K for pair relevance)."""
    return retrieval_report(q_codes, db_codes, q_labels, db_labels, map_k=None, ks=ks, measure=measure)[
        "recall"
    ]


def retrieval_report(
    q_codes: object,
    db_codes: object,
    q_labels: object,
    db_labels: object,
    *,
    map_k: int | None = 50,
    ks: Sequence[int] | int = (1, 5, 10, 50),
    measure: str = "hamming",
) -> dict[str, object]:
    """mAP@``map_k``, precision@k and recall@k from one ranking pass (the expensive part is shared).

    Returns:
        ``{"map": float | None, "precision": {k: float}, "recall": {k: float}, "queries_without_relevant":
        int}``; ``map`` is None when ``map_k`` is None. Precision uses ``min(k, Ndb)`` as denominator.
    """
    ks = _check_ks(ks)
    if map_k is not None and int(map_k) < 1:  # map@0 read 0.0; map@-5 was the mAP over all but 5 (map@45)
        raise ValueError(f"map_k must be >= 1 (or None for no mAP), got {map_k}")
    depth = max(ks + ([map_k] if map_k is not None else []))
    aps, hits, totals = [], [], []
    for rel, n_rel, _, _ in _ranked_blocks(q_codes, db_codes, q_labels, db_labels, depth, measure):
        cum = rel.double().cumsum(1)
        hits.append(cum[:, [min(k, rel.shape[1]) - 1 for k in ks]])
        totals.append(n_rel)
        if map_k is not None:
            aps.append(_average_precision(rel[:, :map_k]))
    hit = torch.cat(hits)
    total = torch.cat(totals).double()
    has_rel = total > 0
    n_db_eff = [min(k, int(rel.shape[1])) for k in ks]
    recall = {
        k: float((hit[has_rel, i] / total[has_rel]).mean()) if bool(has_rel.any()) else float("nan")
        for i, k in enumerate(ks)
    }
    return {
        "map": float(torch.cat(aps).mean()) if map_k is not None else None,
        "precision": {k: float((hit[:, i] / n_db_eff[i]).mean()) for i, k in enumerate(ks)},
        "recall": recall,
        "queries_without_relevant": int((~has_rel).sum()),
    }


@dataclass(frozen=True)
class PRCurve:
    """Hamming-radius precision-recall curve: entry r is for "retrieve everything within distance r"."""

    radius: np.ndarray  # (K+1,) 0..K
    precision: np.ndarray  # (K+1,) mean over queries that retrieve >= 1 item within r
    recall: np.ndarray  # (K+1,) mean over queries with >= 1 relevant item


def precision_recall_curve(q_codes: object, db_codes: object, q_labels: object, db_labels: object) -> PRCurve:
    """Precision and recall of Hamming-ball retrieval at every radius 0..K (codes only).

    Per query and radius r: precision = relevant within r / retrieved within r, recall = relevant within
    r / relevant in the database; each is averaged over the queries for which it is defined.
    """
    sums_p = sums_r = n_p = n_r = None
    bits = as_pm1_codes(q_codes, "q_codes").shape[1]
    for _, n_rel, dist, rel in _ranked_blocks(q_codes, db_codes, q_labels, db_labels, 1, "hamming", True):
        c = dist.shape[0]
        # Histograms of retrieved / relevant items per distance, then cumulative over the radius.
        retrieved = (
            torch.zeros(c, bits + 1, dtype=torch.float64)
            .scatter_add_(1, dist, torch.ones_like(dist, dtype=torch.float64))
            .cumsum(1)
        )
        relevant = torch.zeros(c, bits + 1, dtype=torch.float64).scatter_add_(1, dist, rel.double()).cumsum(1)
        has_ret = retrieved > 0
        has_rel = (n_rel > 0).unsqueeze(1).expand_as(retrieved)
        prec = torch.where(has_ret, relevant / retrieved.clamp(min=1), torch.zeros_like(relevant))
        rec = torch.where(
            has_rel, relevant / n_rel.double().clamp(min=1).unsqueeze(1), torch.zeros_like(relevant)
        )
        blocks = (prec.sum(0), rec.sum(0), has_ret.sum(0), has_rel.sum(0))
        if sums_p is None:
            sums_p, sums_r, n_p, n_r = blocks
        else:
            sums_p, sums_r, n_p, n_r = (
                a + b for a, b in zip((sums_p, sums_r, n_p, n_r), blocks, strict=True)
            )
    precision = torch.where(n_p > 0, sums_p / n_p.clamp(min=1), torch.full_like(sums_p, float("nan")))
    recall = torch.where(n_r > 0, sums_r / n_r.clamp(min=1), torch.full_like(sums_r, float("nan")))
    return PRCurve(np.arange(bits + 1), precision.numpy(), recall.numpy())


def plot_pr_curves(
    curves: Mapping[str, PRCurve], out: str | Path, title: str = "Hamming-radius PR curve"
) -> None:
    """Draw one or more :class:`PRCurve` s (e.g. ``{"I->T 64 bits": c1, "T->I 64 bits": c2}``) to a PNG
    (or the format ``out``'s suffix names), written atomically."""
    try:
        # A Figure of its own (no pyplot): the process's matplotlib backend and figure list stay untouched.
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - only without the extra
        raise MissingExtraError("plotting needs matplotlib: pip install 'patchword[plots]'") from err
    fig = Figure(figsize=(5.5, 4.5))
    ax = fig.subplots()
    for name, curve in curves.items():
        ax.plot(curve.recall, curve.precision, marker=".", label=name)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fmt = Path(out).suffix.lstrip(".").lower() or "png"  # what savefig(out) would pick
    atomic_write(out, lambda fh: fig.savefig(fh, format=fmt, dpi=110))
