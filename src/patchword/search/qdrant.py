"""A search index whose vectors live in Qdrant: one machine (embedded, a local path) or a cluster (a URL),
with the same client API.

Why Qdrant for this workload: it stores **multi-vector** points natively (a point holds the global embedding
as one named vector and the image tokens and dense-caption tokens as two multi-vectors, returned with the
hits), shards and replicates a collection over a cluster, filters by payload (the image path), and has an
embedded mode (``QdrantClient(path=...)``) that runs in-process with the same API, which is how the tests
run it. Qdrant ranks the first stage (the global cosine, ``DOT`` on L2-normalised vectors); patchword's
fine matcher re-ranks the shortlist from the tokens Qdrant returns, so the rankings are those of the local
backend (tested).

``patchword index build ... --qdrant PATH_OR_URL`` builds the local index as usual (its shards are the
resumable staging area), then uploads every entry (idempotent: a rerun uploads again, overwriting by id) and
records the collection in ``INDEX_DIR/qdrant.json``: where (an embedded store's directory as an absolute
path), how many points and which version of the index it holds
(:func:`~patchword.search.manifest.rows_digest`: point ids are index ids). The build connects before it
writes anything (:func:`open_for_upload`): a store in use (a ``serve --qdrant``) or a server out of reach
leaves the index, the last upload's record and its collection (and their servers) as they were; the record
is removed before the collection is replaced and written once every point is in.
``patchword search`` / ``serve`` read that file and take vectors from Qdrant: the index directory a server
needs is then the manifest and ``qdrant.json`` only.
An index updated since its upload, or a collection holding another number of points, is refused there,
naming the command that uploads it again. Each point carries its image's path, checked on every hit and
every point read by id: a collection uploaded again since the index was opened (renumbered ids) is a
:class:`~patchword.search.store.StaleIndexError`, never other images under the old ids.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.errors import ConfigError, DataError, MissingExtraError, MissingFileError
from patchword.fileio import atomic_write_text
from patchword.search.manifest import MANIFEST_FILE, Manifest, rows_digest, unfinished_build
from patchword.search.store import IndexEntries, SearchIndex, StaleIndexError

__all__ = ["QDRANT_FILE", "connect", "open_for_upload", "upload_index", "QdrantIndex"]

QDRANT_FILE = "qdrant.json"


def _client_module():
    try:
        import qdrant_client
        from qdrant_client import models
    except ImportError:
        raise MissingExtraError(
            "the Qdrant backend needs qdrant-client: pip install 'patchword[qdrant]'"
        ) from None
    return qdrant_client, models


def is_local(location: str) -> bool:
    """Whether ``location`` names an embedded store's directory (not a URL, not ``:memory:``)."""
    return not location.startswith(("http://", "https://")) and location != ":memory:"


def connect(location: str):
    """A Qdrant client: ``http(s)://host:port`` (a server or cluster), ``:memory:``, or a local directory
    (embedded mode, in-process; created when missing).

    Raises:
        DataError: the embedded store is held by another client (another process searching, serving or
            uploading it: embedded mode admits one at a time).
    """
    qdrant_client, _ = _client_module()
    if location.startswith(("http://", "https://")):
        return qdrant_client.QdrantClient(url=location)
    if location == ":memory:":
        return qdrant_client.QdrantClient(location=":memory:")
    try:
        return qdrant_client.QdrantClient(path=location)
    except RuntimeError as err:  # qdrant-client's only word for a store another client holds
        if "already accessed" not in str(err):
            raise
        raise DataError(
            f"the embedded Qdrant store {location} is in use by another process (a `patchword serve`, "
            "`search` or `index build` holding it: embedded mode admits one at a time): stop that process "
            "and run this command again, or serve the collection from a Qdrant server (a URL)"
        ) from None


def unreachable(location: str, collection: str, err: Exception) -> DataError:
    """The error of a Qdrant server that cannot be reached or refuses a request (``ApiException``): one
    line naming where, not a traceback."""
    return DataError(f"cannot use Qdrant collection {collection!r} at {location}: {err}")


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


def open_for_upload(index_dir: str | Path, location: str, collection: str):
    """The client an upload of ``index_dir`` will use, opened (a server asked once) before a build or update
    writes anything of the index (refused after an update, the manifest would be newer than the collection:
    its servers answer 503 until the upload is rerun), which it refuses when the backend cannot hold it. The
    caller closes the client (held until the upload: no other process takes the store meanwhile).

    Raises:
        ConfigError: the existing index keeps dense scores or was pruned.
        DataError: the embedded store is held by another client, or the server cannot be reached or refuses.
    """
    _client_module()
    if (Path(index_dir) / MANIFEST_FILE).is_file():  # an update (or a resumed build): what it keeps
        manifest = Manifest.read(index_dir)
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
        client = open_for_upload(index_dir, location, collection)
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


def _upload_again(index_dir: Path, location: str) -> str:
    """How to bring a Qdrant collection back in line with its index: the build that uploads it again."""
    command = f"patchword index build RUN_DIR --images DIR --out {index_dir} --update --qdrant {location}"
    return f"rerun `{command}` to upload it again"


class QdrantIndex(IndexEntries):
    """An index read from Qdrant: what :class:`~patchword.search.query.Searcher` asks of a
    :class:`~patchword.search.store.SearchIndex` (entries from the local manifest, vectors from Qdrant),
    plus :meth:`shortlist`, the first stage done by Qdrant.

    Safe to use from several threads at once: the vectors a :meth:`shortlist` returns with its hits are kept
    for the thread that asked (the re-ranking of the same query, in the same thread, reads them), never in
    state another thread's query replaces."""

    def __init__(self, index_dir: Path, manifest: Manifest, record: dict[str, Any], client=None) -> None:
        self.index_dir, self.manifest, self.record = index_dir, manifest, record
        self.entries = manifest.entries
        self.client = client if client is not None else connect(record["location"])
        self.collection = record["collection"]
        self._hits = threading.local()  # .vectors: id -> vectors of this thread's last shortlist

    @classmethod
    def open(cls, index_dir: str | Path, *, reuse: QdrantIndex | None = None) -> QdrantIndex:
        """Open an uploaded index; ``reuse``: an index opened before (a server reopening it after an update)
        whose client is shared when the record names the same location: an embedded store admits one
        client, which that index holds.

        Raises:
            ConfigError: the index was not uploaded (``--qdrant``), or its upload did not finish.
            DataError: the build did not finish, the index changed since its upload (the collection's
                point ids would name other images), or the collection is missing, holds another number of
                points than the upload recorded, or cannot be read.
            MissingFileError: the embedded store recorded is not there.
        """
        index_dir = Path(index_dir)
        path = index_dir / QDRANT_FILE
        if not path.is_file():
            raise ConfigError(
                "--qdrant",
                f"{index_dir} was not uploaded to Qdrant, or its upload did not finish (no {QDRANT_FILE}): "
                f"upload it with `patchword index build RUN_DIR --images DIR --out {index_dir} --update "
                "--qdrant PATH_OR_URL`",
            )
        manifest = Manifest.read(index_dir)
        if manifest.state != "complete":
            raise DataError(unfinished_build(index_dir))
        record = json.loads(path.read_text())
        location = str(record.get("location"))
        again = _upload_again(index_dir, location)
        if record.get("rows") != rows_digest(manifest):
            raise DataError(
                f"{index_dir}: the index changed since it was uploaded to Qdrant ({path} describes an "
                f"older version, whose point ids name other images); {again}"
            )
        if is_local(location) and not Path(location).is_dir():
            raise MissingFileError(
                f"{index_dir}: the embedded Qdrant store {location} named in {path} does not exist; {again}"
            )
        shared = reuse is not None and reuse.record.get("location") == location
        index = cls(index_dir, manifest, record, reuse.client if shared else None)
        from qdrant_client.http.exceptions import ApiException  # installed: connect() imported the client

        try:
            problem = index._collection_problem()
        except ApiException as err:  # a server that cannot be reached or refuses: one line, not a traceback
            if not shared:
                index.client.close()
            raise DataError(f"{index_dir}: {unreachable(location, index.collection, err)}") from err
        if problem is not None:
            if not shared:
                index.client.close()
            raise DataError(f"{index_dir}: {problem}; {again}")
        return index

    def _check_paths(self, points) -> None:
        """Refuse ``points`` (Qdrant records with their ``path`` payload) that hold other images than this
        index's entries of the same ids: the collection was uploaded again since this index was opened
        (an update renumbers ids), and its ids now name other images than the manifest read here.

        Raises:
            StaleIndexError: naming the first such point.
        """
        for point in points:
            point_id, path = int(point.id), (point.payload or {}).get("path")
            mine = self.entries[point_id].path if 0 <= point_id < len(self.entries) else None
            if mine is None or path != mine:
                raise StaleIndexError(
                    f"{self.index_dir}: Qdrant collection {self.collection!r} was uploaded again since this "
                    f"index was opened: its point {point_id} is {path!r}, which the index opened here calls "
                    f"{mine!r}; open the index again (restart `patchword serve`, rerun the search)"
                )

    def _collection_problem(self) -> str | None:
        """What keeps the collection from answering for the index (missing, or holding another number of
        points than the record: an upload stopped part-way, points deleted), or None."""
        location = self.record["location"]
        where = f"the {'embedded ' if is_local(location) else ''}Qdrant store {location}"
        if not self.client.collection_exists(self.collection):
            return f"{where} has no collection {self.collection!r}"
        points = self.client.count(self.collection, exact=True).count
        if points != self.record.get("points"):
            return (
                f"Qdrant collection {self.collection!r} holds {points} points, but the index uploaded to it "
                f"has {self.record.get('points')} (an upload stopped part-way, or points deleted since)"
            )
        return None

    @property
    def has_dense(self) -> bool:
        return bool(self.record.get("dense"))

    def shortlist(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, C) global query embedding -> ((1, k) scores, (1, k) ids) by Qdrant, best first; the hits'
        tokens are kept for :meth:`image_tokens` / :meth:`dense_tokens` of the same ids in this thread."""
        names = ["tokens", "dense"] if self.has_dense else ["tokens"]
        self._hits.vectors = {}  # an earlier query's vectors are never read for this one's hits
        hits = self.client.query_points(
            self.collection,
            query=query[0].tolist(),
            using="global",
            limit=k,
            with_vectors=names,
            with_payload=["path"],  # a few bytes per hit: which image each id holds is checked
        ).points
        self._check_paths(hits)
        self._hits.vectors = {int(h.id): h.vector for h in hits}
        scores = torch.tensor([[h.score for h in hits]], dtype=torch.float32)
        ids = torch.tensor([[int(h.id) for h in hits]], dtype=torch.int64)
        return scores, ids

    def _vectors(self, ids: np.ndarray) -> list[dict[str, Any]]:
        """The vectors of ``ids``: from this thread's last shortlist, the others retrieved from Qdrant (held
        for this call only)."""
        found = dict(getattr(self._hits, "vectors", {}))
        missing = [int(i) for i in ids if int(i) not in found]
        if missing:
            points = list(
                self.client.retrieve(self.collection, ids=missing, with_vectors=True, with_payload=["path"])
            )
            self._check_paths(points)
            found.update((int(point.id), point.vector) for point in points)
        absent = [i for i in missing if i not in found]
        if absent:
            raise DataError(
                f"{self.index_dir}: Qdrant collection {self.collection!r} has no point {absent[0]}; "
                + _upload_again(self.index_dir, self.record["location"])
            )
        return [found[int(i)] for i in ids]

    def image_tokens(self, ids) -> torch.Tensor:
        """(k,) ids -> (k, L_v, C) float32 image tokens from Qdrant."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return torch.tensor(np.stack([np.asarray(v["tokens"], np.float32) for v in self._vectors(ids)]))

    def prefetch(self, ids) -> None:
        """Nothing to do: the shortlist's vectors came back with the hits (:meth:`shortlist`)."""

    def dense_scores(self, ids) -> None:
        """Always None: a Qdrant collection holds dense tokens, never precomputed dense scores."""
        return None

    def patch_priors(self, ids) -> None:
        """Always None: a Qdrant collection holds every patch (pruned indexes are not uploaded)."""
        return None

    def dense_tokens(self, ids) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k,) ids -> ((k, L_d, C) zero-padded dense tokens, (k,) lengths), or None."""
        if not self.has_dense:
            return None
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        parts = [np.asarray(v["dense"], np.float32) for v in self._vectors(ids)]
        lens = torch.tensor([len(p) for p in parts], dtype=torch.int64)
        out = np.zeros((len(parts), int(lens.max()), parts[0].shape[1]), np.float32)
        for row, part in enumerate(parts):
            out[row, : len(part)] = part
        return torch.from_numpy(out), lens

    def global_rows(self, ids) -> torch.Tensor:
        """(k,) ids -> (k, C) float32 global image embeddings from Qdrant (a shortlist's hits do not carry
        them: they are fetched here)."""
        ids = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
        retrieved = list(
            self.client.retrieve(self.collection, ids=ids, with_vectors=["global"], with_payload=["path"])
        )
        self._check_paths(retrieved)
        points = {int(p.id): p.vector for p in retrieved}
        absent = [i for i in ids if i not in points]
        if absent:
            raise DataError(
                f"{self.index_dir}: Qdrant collection {self.collection!r} has no point {absent[0]}; "
                + _upload_again(self.index_dir, self.record["location"])
            )
        return torch.tensor(np.stack([np.asarray(points[i]["global"], np.float32) for i in ids]))

    def global_embeddings(self) -> torch.Tensor:
        raise NotImplementedError("the Qdrant backend shortlists in Qdrant")
