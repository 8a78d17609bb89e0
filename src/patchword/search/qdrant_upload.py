"""Uploading a local index to a Qdrant collection (``patchword index build ... --qdrant PATH_OR_URL``):
:func:`open_for_upload` connects before the index is written, :func:`upload_index` replaces the collection
and records it in ``INDEX_DIR/qdrant.json`` (see :mod:`patchword.search.qdrant`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import ConfigError
from patchword.fileio import atomic_write_text
from patchword.search.manifest import Manifest, rows_digest
from patchword.search.qdrant_connect import QDRANT_FILE, _client_module, connect, is_local, unreachable
from patchword.search.store import SearchIndex

__all__ = ["open_for_upload", "upload_index"]


def _check_uploadable(index_dir: Path, dense_store: str | None, pruning: dict[str, Any] | None) -> None:
    """Refuse an index the Qdrant backend cannot hold (dense scores, pruned patches)."""
    if dense_store == "scores":
        raise ConfigError(
            "--qdrant",
            f"{index_dir} keeps dense scores, the Qdrant backend dense tokens: build it with "
            "--dense-store tokens",
        )
    if pruning is not None:
        raise ConfigError(
            "--qdrant", f"{index_dir} was pruned (--keep-patches); the Qdrant backend holds every patch"
        )


def open_for_upload(index_dir: str | Path, location: str, collection: str, *, manifest: Manifest):
    """The client an upload of ``index_dir`` will use, opened (a server asked once) before a build or update
    writes anything of the index (refused after an update, the manifest would be newer than the collection:
    its servers answer 503 until the upload is rerun), which it refuses when the backend cannot hold
    ``manifest``: the index's manifest as the caller read it (the build's, ``BuildPlan.manifest``: what an
    update or a resumed build keeps, a new index's settings). The caller closes the client (held until the
    upload: no other process takes the store meanwhile).

    Raises:
        ConfigError: the index keeps dense scores or was pruned.
        DataError: the embedded store is held by another client, or the server cannot be reached or refuses.
    """
    _client_module()
    _check_uploadable(Path(index_dir), manifest.dense_store, manifest.pruning)
    location = str(Path(location).expanduser().resolve()) if is_local(location) else location
    client = connect(location)
    from qdrant_client.http.exceptions import ApiException  # installed: connect() imported the client

    try:
        client.collection_exists(collection)
    except BaseException as err:
        client.close()
        if isinstance(err, ApiException):  # a server that cannot be reached or refuses: one line
            raise unreachable(location, collection, err) from err
        raise
    return client


def upload_index(
    index_dir: str | Path, location: str, collection: str, *, batch: int = 64, client=None
) -> dict[str, Any]:
    """Upload a complete local index to the Qdrant collection ``collection`` (created, or replaced when its
    vector layout differs) and record it in ``INDEX_DIR/qdrant.json``; returns that record. ``client``: one
    :func:`open_for_upload` returned (its caller closes it); None: connected here (and closed)."""
    _, models = _client_module()
    if is_local(location):  # recorded as typed, a relative path would name another store from elsewhere
        location = str(Path(location).expanduser().resolve())
    index = SearchIndex.open(index_dir)
    _check_uploadable(Path(index_dir), index.dense_store, index.pruning)
    owned = client is None  # connected first: a store not opened or reached leaves the last upload as it was
    if owned:
        client = open_for_upload(index_dir, location, collection, manifest=index.manifest)
    from qdrant_client.http.exceptions import ApiException  # installed: connect() imported the client

    try:
        # The record goes before the collection is touched: while the collection is replaced it describes
        # no collection, so an upload stopped half-way leaves an index that search / serve refuse (naming
        # the upload), never a record whose digest still matches and a collection missing points.
        (Path(index_dir) / QDRANT_FILE).unlink(missing_ok=True)
        record = _upload(index, client, models, location, collection, batch)
    except ApiException as err:  # a server that cannot be reached or refuses: one line, not a traceback
        raise unreachable(location, collection, err) from err
    finally:
        if owned:
            client.close()  # an embedded store admits one client at a time: let the next command open it
    atomic_write_text(Path(index_dir) / QDRANT_FILE, json.dumps(record, indent=2))
    return record


def _upload(index: SearchIndex, client, models, location: str, collection: str, batch: int) -> dict[str, Any]:
    """Replace the collection with ``index``'s points; -> the record of what it holds."""
    dim = int(index.manifest.model["embed_dim"])
    multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
    vectors = {
        "global": models.VectorParams(size=dim, distance=models.Distance.DOT),
        "tokens": models.VectorParams(size=dim, distance=models.Distance.DOT, multivector_config=multi),
    }
    if index.has_dense:
        vectors["dense"] = models.VectorParams(
            size=dim, distance=models.Distance.DOT, multivector_config=multi
        )
    if client.collection_exists(collection):
        client.delete_collection(collection)
    client.create_collection(collection, vectors_config=vectors)
    globals_ = index.global_embeddings().numpy()
    for start in range(0, len(index), batch):
        ids = np.arange(start, min(start + batch, len(index)))
        tokens = index.image_tokens(ids).numpy()
        dense = index.dense_tokens(ids)
        points = []
        for row, i in enumerate(ids):
            vector = {"global": globals_[i].tolist(), "tokens": tokens[row].tolist()}
            if dense is not None:
                vector["dense"] = dense[0][row, : int(dense[1][row])].tolist()
            points.append(models.PointStruct(id=int(i), vector=vector, payload={"path": index.path(int(i))}))
        client.upsert(collection, points=points, wait=True)
    return {
        "location": location,
        "collection": collection,
        "points": len(index),
        "dense": index.has_dense,
        "rows": rows_digest(index.manifest),
    }
