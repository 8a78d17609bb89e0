"""How a search's answers relate to the exact search of its model: the approximations an index or a first
stage makes, and the settings that change every ranking.

Exact means: float32 tokens of every patch, re-ranked by the run's fine matcher after an exact global
shortlist; a shortlist as large as the index then ranks as the run's own evaluation (docs/search.md,
section 3). What departs from it:

- the token store (``--store``): float16 and int8 round the tokens, ``pq`` quantises them (approximate fine
  scores; docs/search.md, section 7, measures the recall each costs);
- index-time patch pruning (``--keep-patches``): the fine scores of a pruned image (approximate);
- an approximate first stage (FAISS IVF / HNSW above :data:`~patchword.search.query.APPROXIMATE_ABOVE`
  images, or a Qdrant server's HNSW index, built once a segment passes the server's indexing threshold: a
  server whose collection has none, and no optimization pending, scans every point, and so does one
  searched with ``exact``): the scores are exact, the shortlist may miss images;
- dense captions the model reads and the index lacks (built without ``--dense``), or a matcher that pairs
  them with captions: every ranking differs from the evaluated one (:func:`dense_problem`).

:class:`~patchword.search.query.Searcher` describes itself with :func:`search_kind` and
:func:`dense_problem`, once per opened index (:func:`describe_index`); ``patchword search``, ``search
--json``, ``serve``'s ``/healthz`` and ``/api/search`` and its page show them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "approximation_note",
    "dense_problem",
    "describe_index",
    "index_summary",
    "reads_index_dense",
    "search_kind",
]

#: First stages that find the exact shortlist (FAISS flat: up to ties; embedded Qdrant scans every point, and
#: so does a Qdrant server whose collection has no HNSW index yet, or that is asked for an exact search).
EXACT_FIRST_STAGES = (
    "exact",
    "faiss_flat",
    "qdrant_embedded",
    "qdrant_server_unindexed",
    "qdrant_server_exact",
)

_MISSES = "the shortlist may miss images an exact one holds"


def _first_stage(index: Any, backend: str) -> tuple[str, str | None]:
    """The first stage's name, and the note of an approximate one (None: exact): the searcher's backend, or
    for a store that shortlists itself (Qdrant) ``qdrant_embedded`` (a local directory: every point
    scanned), ``qdrant_server_exact`` (a URL, the index opened ``exact``: every point scanned) or a server's
    (a URL, :func:`_qdrant_server_stage`)."""
    if backend != "store":
        approximate = backend not in EXACT_FIRST_STAGES
        return backend, (f"approximate first stage ({backend}): {_MISSES}" if approximate else None)
    location = str(getattr(index, "record", {}).get("location", ""))
    if not location.startswith(("http://", "https://")):
        return "qdrant_embedded", None
    if getattr(index, "exact", False):
        return "qdrant_server_exact", None
    return _qdrant_server_stage(getattr(index, "server", None))


def _qdrant_server_stage(state: dict[str, Any] | None) -> tuple[str, str | None]:
    """A Qdrant server's first stage from what it said of the collection when the index was opened
    (``state``: :meth:`~patchword.search.qdrant.QdrantIndex._server_state`; None: not asked):
    ``qdrant_server_unindexed`` (exact: no vector HNSW-indexed and no optimization pending, so every segment
    is scanned) or ``qdrant_server`` (approximate, or possibly so) with the note saying why."""
    indexed = None if state is None else state.get("indexed")
    if indexed is None:
        return "qdrant_server", (
            "first stage in a Qdrant server that did not say whether the collection has HNSW indexes: "
            f"approximate once a segment passes the server's indexing threshold, so {_MISSES}"
        )
    if indexed == 0 and state["status"] == "green":
        return "qdrant_server_unindexed", None
    if indexed == 0:
        return "qdrant_server", (
            f"first stage in a Qdrant server whose collection is being optimized (status {state['status']}; "
            "no vector HNSW-indexed when the index was opened): approximate once the server has built an "
            f"HNSW index, so {_MISSES}"
        )
    return "qdrant_server", (
        f"first stage in a Qdrant server's HNSW index ({indexed} of the collection's {state['vectors']} "
        f"vectors indexed when the index was opened): approximate, so {_MISSES}"
    )


def search_kind(index: Any, backend: str) -> dict[str, Any]:
    """What kind of search ``index`` (a :class:`~patchword.search.store.SearchIndex` or a Qdrant index)
    answers with the first stage ``backend``.

    Returns:
        ``{"store": the token store, "pruning": None or {"kept", "of", "fraction"}, "first_stage": its
        name (``backend``, or ``qdrant_embedded``, ``qdrant_server_exact``: a server asked for exact
        searches, ``qdrant_server_unindexed``, ``qdrant_server``: what a Qdrant index's server said when it
        was opened), "exact": whether the scores are the exact float32 fine scores of an exact shortlist,
        "notes": one sentence per approximation}``.
    """
    manifest = index.manifest
    notes = []
    store = manifest.dtype
    if store == "pq":
        per_token = (manifest.codec or {}).get("pq_m")
        size = f", {per_token} bytes per token" if per_token else ""
        notes.append(f"tokens product-quantised (--store pq{size}): approximate fine scores")
    elif store != "float32":
        notes.append(f"tokens stored as {store} (--store {store}): fine scores rounded")
    pruning = manifest.pruning
    if pruning:
        pruning = {key: pruning[key] for key in ("kept", "of", "fraction")}
        notes.append(
            f"patches pruned at build time ({pruning['kept']} of {pruning['of']} kept per image, "
            f"--keep-patches {pruning['fraction']}): approximate fine scores"
        )
    first, first_note = _first_stage(index, backend)
    if first_note is not None:
        notes.append(first_note)
    return {"store": store, "pruning": pruning, "first_stage": first, "exact": not notes, "notes": notes}


def approximation_note(kind: dict[str, Any]) -> str | None:
    """One line saying how the search departs from the exact one (``kind``: :func:`search_kind`), or None
    for an exact search."""
    if kind["exact"]:
        return None
    return "not the exact float32 search: " + "; ".join(kind["notes"]) + " (docs/search.md, section 7)"


def reads_index_dense(fine) -> bool:
    """Whether a search re-ranking with the fine matcher ``fine`` reads an index's dense text: the condition
    of :class:`~patchword.search.query.Searcher`'s ``use_dense`` (besides the index having it). A matcher
    that ignores dense text reads none; caption-tied dense text (``dense_pairing=caption``) is the text of a
    caption's target image, which a search query has none of."""
    return bool(fine.consumes_dense) and fine.dense_pairing == "image"


def dense_problem(index: Any, run: Any, fine: Any) -> tuple[str, str] | None:
    """What a search of ``index`` with ``run``'s fine matcher ``fine`` scores without though the model
    reads it, as (a few words for the page's line, :func:`index_summary`; the sentence), or None: dense
    captions of an index built without them, or (a matcher pairing dense text with captions) dense text a
    query never has."""
    if not fine.consumes_dense:
        return None
    if fine.dense_pairing != "image":
        if not index.has_dense:
            return None
        return "dense text unused (paired with captions)", (
            f"the matcher pairs dense text with captions (dense_pairing={fine.dense_pairing}): a search "
            "query has none, so the fine stage scores without dense text"
        )
    if index.has_dense or not run.config.data.dense:
        return None
    # the run and the index by their folder names: what a server sends its clients names no path of its own
    run_name, index_name = (Path(path).resolve().name for path in (run.run_dir, index.index_dir))
    return "dense captions missing", (
        f"the run {run_name}'s model reads dense captions, but the index {index_name} was built without "
        "them: every ranking differs from the model's evaluated one; build the index with --dense FILE"
    )


def index_summary(kind: dict[str, Any], warning_labels: list[str]) -> str | None:
    """One short line of what ``kind`` (:func:`search_kind`) approximates and what the warnings are about
    (their labels, :func:`dense_problem`), the page's line above the results: ``"approximate: pq store,
    12 of 16 patches kept; dense captions missing"``; None for an exact search without warnings."""
    parts = []
    if kind["store"] != "float32":
        parts.append(f"{kind['store']} store")
    if kind["pruning"]:
        parts.append(f"{kind['pruning']['kept']} of {kind['pruning']['of']} patches kept")
    if kind["first_stage"] not in EXACT_FIRST_STAGES:
        parts.append(f"{kind['first_stage']} first stage")
    line = ([f"approximate: {', '.join(parts)}"] if parts else []) + list(warning_labels)
    return "; ".join(line) or None


def describe_index(kind: dict[str, Any], problems: list[tuple[str, str]]) -> dict[str, Any]:
    """The ``index`` object of ``/healthz``, ``/api/search`` and ``search --json``: ``kind``
    (:func:`search_kind`) plus ``warnings`` (the sentences of ``problems``, :func:`dense_problem`) and
    ``summary`` (:func:`index_summary`)."""
    return {
        **kind,
        "warnings": [sentence for _, sentence in problems],
        "summary": index_summary(kind, [label for label, _ in problems]),
    }
