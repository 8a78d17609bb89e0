"""The global index of two-stage search (:mod:`patchword.eval.two_stage`): the top-k candidates of every
query by the inner product of L2-normalised global embeddings, exact (torch, blocked matmul + top-k) or
through FAISS (``IndexFlatIP``: the same up to ties; ``IndexIVFFlat`` / ``IndexHNSWFlat``: approximate),
saved and loaded with a search index.
"""

from __future__ import annotations

import logging
import os

import torch

from patchword._validation import check_positive_int
from patchword.eval.engine.memory import budget_bytes
from patchword.matching.ops import autocast_off

__all__ = ["APPROXIMATE_BACKENDS", "GlobalIndex", "faiss_available", "import_faiss", "ivf_lists"]


_BACKENDS = ("exact", "faiss_flat", "faiss_ivf", "faiss_hnsw")
APPROXIMATE_BACKENDS = ("faiss_ivf", "faiss_hnsw")


def ivf_lists(size: int) -> int:
    """Inverted lists of the IVF index over ``size`` vectors: ``4 sqrt(N)`` (FAISS's guideline), at most
    ``N / 39`` so k-means has 39 training points per centroid."""
    return max(1, min(int(4 * size**0.5), size // 39))


def import_faiss():
    """The ``faiss`` module, imported without its loader's INFO lines.

    Raises:
        ImportError: faiss is not installed or cannot be loaded.
    """
    # The first import logs at INFO each instruction set it tries and misses (``Could not load library with
    # AVX512 support due to: ModuleNotFoundError("No module named 'faiss.swigfaiss_avx512'")``...): ~8 lines
    # on the stderr of every command, although the build it falls back to is the normal case. WARNING for
    # the import only: the loader's errors (no build loads at all) still show, and a level the application
    # set on that logger itself is kept.
    loader = logging.getLogger("faiss.loader")
    quiet = loader.level == logging.NOTSET
    if quiet:
        loader.setLevel(logging.WARNING)
    try:
        import faiss
    finally:
        if quiet:
            loader.setLevel(logging.NOTSET)
    return faiss


def faiss_available() -> bool:
    """Whether the optional ``faiss`` package (``pip install faiss-cpu``) can be imported."""
    try:
        import_faiss()
    except ImportError:
        return False
    return True


def _faiss():
    try:
        faiss = import_faiss()
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the FAISS backends need the optional faiss package: pip install faiss-cpu "
            "(or use backend='exact')"
        ) from err
    return faiss


class GlobalIndex:
    """Top-k inner-product search over a database of L2-normalised embeddings.

    Args:
        database: (N, C) embeddings (any float dtype; searched in float32).
        backend: ``"exact"`` (torch matmul + top-k in query blocks), ``"faiss_flat"`` (FAISS
            ``IndexFlatIP``: exact, same results as ``"exact"`` up to ties and float rounding) or
            ``"faiss_ivf"`` (FAISS ``IndexIVFFlat``: k-means lists, the ``nprobe`` lists nearest the query
            scanned exactly: approximate, built in seconds) or ``"faiss_hnsw"`` (FAISS ``IndexHNSWFlat``
            with inner product: approximate, slow to build; docs/search.md compares them).
        nlist: IVF lists (default :func:`ivf_lists`); ``nprobe``: lists scanned per query (default
            ``nlist // 8``: 97% of the exact top-100 on benchmarks/ann_recall.py's clustered data).
        hnsw_m: HNSW graph degree. ``ef_search`` / ``ef_construction``: HNSW search/build breadth.
        max_memory_mb: bound on the (queries x N) score block of the exact backend.
    """

    def __init__(
        self,
        database: torch.Tensor,
        *,
        backend: str = "exact",
        nlist: int | None = None,
        nprobe: int | None = None,
        hnsw_m: int = 32,
        ef_search: int = 256,
        ef_construction: int = 200,
        max_memory_mb: float = 256,
    ) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
        if database.dim() != 2 or database.shape[0] == 0:
            raise ValueError(f"database must be a non-empty (N, C) matrix, got shape {tuple(database.shape)}")
        self.backend = backend
        self.size, self.dim = database.shape
        self._budget = budget_bytes(max_memory_mb)
        self._ef_search, self._nprobe = ef_search, nprobe
        if backend == "exact":
            self._db = database.detach().float()
            return
        faiss = _faiss()
        data = database.detach().float().cpu().contiguous().numpy()
        if backend == "faiss_flat":
            self._index = faiss.IndexFlatIP(self.dim)
        elif backend == "faiss_ivf":
            lists = nlist or ivf_lists(self.size)
            self._index = faiss.IndexIVFFlat(
                faiss.IndexFlatIP(self.dim), self.dim, lists, faiss.METRIC_INNER_PRODUCT
            )
            # k-means on an evenly spaced sample of 64 points per list (deterministic, no RNG state)
            sample = data[:: max(1, self.size // (64 * lists))]
            self._index.train(sample)
        else:
            self._index = faiss.IndexHNSWFlat(self.dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            self._index.hnsw.efConstruction = ef_construction
        self._index.add(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a FAISS backend's index (an HNSW graph is slow to build: build it once) atomically."""
        if self.backend == "exact":
            raise ValueError("the exact backend has nothing to save")
        from patchword.fileio import atomic_write

        faiss = _faiss()

        def write(fh) -> None:  # streamed to the file: no second copy of the index in memory
            writer = faiss.PyCallbackIOWriter(fh.write)
            faiss.write_index(self._index, writer)
            del writer  # flushes its buffer into ``fh``

        atomic_write(path, write)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], backend: str, *, ef_search: int = 256, nprobe: int | None = None
    ) -> GlobalIndex:
        """A FAISS backend's index written by :meth:`save`."""
        faiss = _faiss()
        self = cls.__new__(cls)
        self.backend, self._ef_search, self._nprobe, self._budget = (
            backend,
            ef_search,
            nprobe,
            budget_bytes(256),
        )
        # read from the file directly: deserialising a bytes copy would hold the index twice while loading
        # (1M x 512 IVF lists: 2 GB more at the server's peak)
        self._index = faiss.read_index(str(path))
        self.size, self.dim = self._index.ntotal, self._index.d
        return self

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` database entries of each query by inner product.

        Args:
            queries: (Q, C) embeddings.
            k: candidates per query (clipped to the database size).

        Returns:
            ``(scores, indices)``, (Q, k) float32 and int64 on the CPU, best first. An approximate index
            may find fewer than ``k`` entries for a query (IVF: the lists it scans hold fewer): the empty
            slots, last, have index -1 and score ``-inf``.
        """
        if queries.dim() != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be (Q, {self.dim}), got shape {tuple(queries.shape)}")
        k = min(check_positive_int("k", k), self.size)
        if self.backend != "exact":
            if self.backend == "faiss_hnsw":
                self._index.hnsw.efSearch = max(self._ef_search, k)
            elif self.backend == "faiss_ivf":
                self._index.nprobe = self._nprobe or max(1, self._index.nlist // 8)
                # FAISS splits a batch over its threads by query; one query (a search) has its lists
                # split instead (the same hits: 1M x 512, 500 lists, 2 threads: 13.5 -> 9.9 ms)
                self._index.parallel_mode = 1 if queries.shape[0] == 1 else 0
            scores, indices = self._index.search(queries.detach().float().cpu().contiguous().numpy(), k)
            scores, indices = torch.from_numpy(scores), torch.from_numpy(indices).long()
            # FAISS marks an empty slot with label -1 and the lowest float32 (-3.4e38), no score at all
            return scores.masked_fill(indices < 0, float("-inf")), indices
        queries = queries.detach().float().to(self._db.device)
        block = max(1, self._budget // (3 * 4 * self.size))  # scores + top-k temporaries per query
        scores, indices = [], []
        # float32 products under a caller's autocast too: they feed the top-k (the shortlist)
        with autocast_off(queries):
            for start in range(0, queries.shape[0], block):
                top = (queries[start : start + block] @ self._db.T).topk(k, dim=1)
                scores.append(top.values.cpu())
                indices.append(top.indices.cpu())
        return torch.cat(scores), torch.cat(indices)
