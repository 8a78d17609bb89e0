"""Uploading a local index to a Qdrant collection (``patchword index build ... --qdrant PATH_OR_URL``):
:func:`open_for_upload` connects before the index is written (and refuses a collection another index holds),
:func:`upload_index` brings the collection in line with the index and records it in ``INDEX_DIR/qdrant.json``
(see :mod:`patchword.search.qdrant`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import ConfigError
from patchword.fileio import atomic_write_text
from patchword.search.manifest import Manifest, rows_digest
from patchword.search.qdrant_connect import (
    MARKER_ID,
    QDRANT_FILE,
    _client_module,
    connect,
    is_local,
    read_marker,
    unreachable,
)
from patchword.search.store import SearchIndex

__all__ = ["open_for_upload", "upload_index"]

logger = logging.getLogger(__name__)


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


def _same_build(marker: dict[str, Any], index_dir: Path, manifest: Manifest) -> bool:
    """Whether ``marker`` (:func:`~patchword.search.qdrant_connect.read_marker`) names this index's build:
    its ``build_id`` (kept by updates and resumes, moved with the folder), or for an index written before
    build ids were recorded, its folder."""
    if manifest.build_id is not None:
        return marker.get("build_id") == manifest.build_id
    return marker.get("build_id") is None and marker.get("index") == str(index_dir.resolve())


def open_for_upload(
    index_dir: str | Path, location: str, collection: str, *, manifest: Manifest, replace: bool = False
):
    """The client an upload of ``index_dir`` will use, opened (a server asked once) before a build or update
    writes anything of the index (refused after an update, the manifest would be newer than the collection:
    its servers answer 503 until the upload is rerun), which it refuses when the backend cannot hold
    ``manifest``: the index's manifest as the caller read it (the build's, ``BuildPlan.manifest``: what an
    update or a resumed build keeps, a new index's settings), or when ``collection`` holds another index
    (its marker names another build and another folder) and ``replace`` is false: its own earlier upload,
    an index built again in the same folder, and a collection with no marker (uploaded before markers were
    written) are replaced. The caller closes the client (held until the upload: no other process takes the
    store meanwhile).

    Raises:
        ConfigError: the index keeps dense scores or was pruned; ``collection`` holds another index.
        DataError: the embedded store is held by another client, or the server cannot be reached or refuses.
    """
    _client_module()
    _check_uploadable(Path(index_dir), manifest.dense_store, manifest.pruning)
    location = str(Path(location).expanduser().resolve()) if is_local(location) else location
    client = connect(location)
    from qdrant_client.http.exceptions import ApiException  # installed: connect() imported the client

    try:
        marker = read_marker(client, collection) if client.collection_exists(collection) else None
        index_dir = Path(index_dir)
        owner = None if marker is None else marker.get("index")
        mine = marker is None or _same_build(marker, index_dir, manifest)
        # the same folder built anew (another build id) replaces its own upload
        if not (replace or mine or owner == str(index_dir.resolve())):
            raise ConfigError(
                "--collection",
                f"Qdrant collection {collection!r} at {location} holds the index {owner} (the collection "
                f"defaults to the --out folder's name): give --collection NAME to upload {index_dir} to "
                f"a collection of its own, or --replace-collection to replace it ({owner} is then "
                "refused by search until it is uploaded again)",
            )
    except BaseException as err:
        client.close()
        if isinstance(err, ApiException):  # a server that cannot be reached or refuses: one line
            raise unreachable(location, collection, err) from err
        raise
    return client


def upload_index(
    index_dir: str | Path,
    location: str,
    collection: str,
    *,
    batch: int = 64,
    client=None,
    replace: bool = False,
) -> dict[str, Any]:
    """Upload a complete local index to the Qdrant collection ``collection`` and record it in
    ``INDEX_DIR/qdrant.json``; returns that record. A collection holding an earlier upload of the same
    index build with the same vector layout keeps its points: only those whose stored row changed are
    written, those of removed ids deleted; any other collection is deleted and created again
    (:func:`_upload`).
    ``client``: one :func:`open_for_upload` returned (its caller closes it, and it checked ``collection``
    is not another index's); None: connected here (and closed), ``replace`` as for :func:`open_for_upload`."""
    _, models = _client_module()
    if is_local(location):  # recorded as typed, a relative path would name another store from elsewhere
        location = str(Path(location).expanduser().resolve())
    index = SearchIndex.open(index_dir)
    _check_uploadable(Path(index_dir), index.dense_store, index.pruning)
    owned = client is None  # connected first: a store not opened or reached leaves the last upload as it was
    if owned:
        client = open_for_upload(index_dir, location, collection, manifest=index.manifest, replace=replace)
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


def _layout(index: SearchIndex) -> dict[str, Any]:
    """What decides the collection's vectors: a collection of another layout is created again."""
    float16 = index.manifest.dtype == "float16"  # float16 rows kept as float16: exact, half the size
    return {
        "dim": int(index.manifest.model["embed_dim"]),
        "dense": index.has_dense,
        "datatype": "float16" if float16 else "float32",
        "weights": index.manifest.model.get("weights_sha256"),
    }


def _held_rows(client, collection: str) -> dict[int, list]:
    """Point id -> the ``[path, shard, row]`` its payload says it was uploaded from (every point but the
    marker; a point uploaded before rows were recorded says ``[path, None, None]``)."""
    held, offset = {}, None
    while True:
        points, offset = client.scroll(
            collection, limit=2048, offset=offset, with_payload=["path", "row"], with_vectors=False
        )
        for point in points:
            if isinstance(point.id, int):
                payload = point.payload or {}
                held[point.id] = [payload.get("path"), *(payload.get("row") or [None, None])]
        if offset is None:
            return held


def _upload(index: SearchIndex, client, models, location: str, collection: str, batch: int) -> dict[str, Any]:
    """Bring the collection in line with ``index``; -> the record of what it holds.

    The marker (:data:`~patchword.search.qdrant_connect.MARKER_ID`) names this index with no digest while
    points change, and the digest once all are in: an upload stopped part-way is refused by search. A
    collection whose marker names this build with the same layout keeps the points whose payload says they
    hold an entry's current stored row (within one build a stored row is never rewritten), so an update
    writes only new and changed images' points and deletes those of ids past the end; otherwise the
    collection is deleted and created again.

    Tokens go up decoded (float32), as float16 for a float16 store (lossless); an int8 or pq store's
    compression is not carried over."""
    layout, index_dir = _layout(index), Path(index.index_dir)
    exists = client.collection_exists(collection)
    marker = read_marker(client, collection) if exists else None
    keep = (
        marker is not None
        and _same_build(marker, index_dir, index.manifest)
        and marker.get("layout") == layout
    )
    if not keep:
        if exists:
            client.delete_collection(collection)
        datatype = models.Datatype.FLOAT16 if layout["datatype"] == "float16" else None
        multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
        dim, dot = layout["dim"], models.Distance.DOT
        vectors = {
            "global": models.VectorParams(size=dim, distance=dot),  # stored float32 in every store
            "tokens": models.VectorParams(
                size=dim, distance=dot, multivector_config=multi, datatype=datatype
            ),
        }
        if index.has_dense:
            vectors["dense"] = models.VectorParams(
                size=dim, distance=dot, multivector_config=multi, datatype=datatype
            )
        client.create_collection(collection, vectors_config=vectors)
    mark = {"index": str(index_dir.resolve()), "build_id": index.manifest.build_id, "layout": layout}
    _write_marker(client, models, collection, {**mark, "rows": None})  # changing: refused by search
    held = _held_rows(client, collection) if keep else {}
    entries = index.manifest.entries
    todo = [i for i, e in enumerate(entries) if held.get(i) != [e.path, e.shard, e.row]]
    gone = sorted(i for i in held if i >= len(entries))
    if gone:
        client.delete(collection, points_selector=models.PointIdsList(points=gone), wait=True)
    for start in range(0, len(todo), batch):
        ids = np.asarray(todo[start : start + batch], dtype=np.int64)
        globals_, tokens = index.global_rows(ids).numpy(), index.image_tokens(ids).numpy()
        dense = index.dense_tokens(ids)
        points = []
        for row, i in enumerate(ids.tolist()):
            vector = {"global": globals_[row].tolist(), "tokens": tokens[row].tolist()}
            if dense is not None:
                vector["dense"] = dense[0][row, : int(dense[1][row])].tolist()
            payload = {"path": entries[i].path, "row": [entries[i].shard, entries[i].row]}
            points.append(models.PointStruct(id=i, vector=vector, payload=payload))
        client.upsert(collection, points=points, wait=True)
    digest = rows_digest(index.manifest)
    _write_marker(client, models, collection, {**mark, "rows": digest})
    logger.info(
        "Qdrant collection %r: %d points written, %d deleted, %d unchanged",
        collection,
        len(todo),
        len(gone),
        len(entries) - len(todo),
    )
    return {
        "location": location,
        "collection": collection,
        "points": len(index),
        "dense": index.has_dense,
        "rows": digest,
        "marked": True,  # a collection without the marker is no longer this upload's
        "written": len(todo),
    }


def _write_marker(client, models, collection: str, marker: dict[str, Any]) -> None:
    """Write the marker point (no vector: no search returns it)."""
    point = models.PointStruct(id=MARKER_ID, vector={}, payload={"patchword_index": marker})
    client.upsert(collection, points=[point], wait=True)
