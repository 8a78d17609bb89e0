"""The first stage of a search of a local index (:class:`~patchword.search.query.Searcher`): the global
shortlist, exact (torch, FAISS flat) or approximate (FAISS IVF / HNSW), the approximate ones kept beside
the index so that later opens load them."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from patchword.eval.two_stage import APPROXIMATE_BACKENDS, GlobalIndex
from patchword.search.manifest import Manifest, rows_digest
from patchword.search.store import SearchIndex

__all__ = ["first_stage_file", "local_first_stage"]

logger = logging.getLogger(__name__)


def first_stage_file(index_dir: Path, manifest: Manifest, backend: str) -> Path:
    """Where the approximate first stage ``backend`` (``faiss_ivf``, ``faiss_hnsw``) of the index ``manifest``
    describes is kept: ``index_dir / global.<stamp>.<ivf|hnsw>``, the stamp
    :func:`~patchword.search.manifest.rows_digest`. A tool that builds it ahead (benchmarks/scale_search.py)
    writes it here, so that searches load it instead of building their own."""
    return Path(index_dir) / f"global.{rows_digest(manifest)}.{backend.removeprefix('faiss_')}"


def local_first_stage(index: SearchIndex, backend: str, max_memory_mb: float) -> GlobalIndex:
    """The first stage of ``index`` with ``backend`` (one of ``GlobalIndex``'s). An approximate index (IVF
    lists, HNSW graph) is built once per version of the index and kept beside it
    (``global.<stamp>.<backend>``): later opens load it. The stamp is
    :func:`~patchword.search.manifest.rows_digest`, which row every index id reads: an update that only
    deletes files keeps the shards but moves the ids, and a graph of the old rows would answer with ids (and
    scores) of other images."""
    if backend not in APPROXIMATE_BACKENDS:
        return GlobalIndex(index.global_embeddings(), backend=backend, max_memory_mb=max_memory_mb)
    suffix = backend.removeprefix("faiss_")
    path = first_stage_file(index.index_dir, index.manifest, backend)
    if path.is_file():
        return GlobalIndex.load(path, backend)
    t0 = time.perf_counter()
    built = GlobalIndex(index.global_embeddings(), backend=backend, max_memory_mb=max_memory_mb)
    logger.info(
        "%s first stage of %d images built in %.1f s: %s",
        suffix,
        len(index),
        time.perf_counter() - t0,
        path,
    )
    for old in index.index_dir.glob(f"global.*.{suffix}"):  # built for earlier versions of the index
        old.unlink(missing_ok=True)
    try:
        built.save(path)
    except OSError as err:  # a read-only index still searches; it rebuilds the first stage next time
        logger.warning("could not keep the %s first stage at %s: %s", suffix, path, err)
    return built
