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
resumable staging area), then uploads it (a collection holding an earlier upload of the same index gets
only the points whose rows changed: :func:`~patchword.search.qdrant_upload._upload`) and records the
collection in ``INDEX_DIR/qdrant.json``: where (an embedded store's directory as an absolute path), how many
points and which version of the index it holds (:func:`~patchword.search.manifest.rows_digest`: point ids
are index ids). The build connects once every flag and file is checked
(:func:`~patchword.search.index.plan_build`: a refused flag leaves no store behind) and before it writes
anything (:func:`open_for_upload`: a collection another index holds is refused there): a store in use (a
``serve --qdrant``) or a server out of reach leaves the index, the last upload's record and its collection
(and their servers) as they were; the record is removed before the collection is changed and written once
every point is in. ``patchword search`` / ``serve`` read that file and take vectors from Qdrant: the index
directory a server needs is then the manifest and ``qdrant.json`` only.
An index updated since its upload, a collection holding another number of points, or one whose marker
point (:data:`~patchword.search.qdrant_connect.MARKER_ID`) names another index (two indexes given one
collection name) or another version, is refused there, naming the command that uploads it again. Each
point carries its image's path, checked on every hit and every point read by id: a collection uploaded
again since the index was opened (renumbered ids) is a :class:`~patchword.search.store.StaleIndexError`,
never other images under the old ids.
A server is asked once per open what the collection holds (``get_collection``): with no vector in an HNSW
index and no optimization pending it scans every point, and the first stage is reported exact
(``qdrant_server_unindexed``), else approximate with how many vectors are indexed
(:func:`~patchword.search.fidelity.search_kind`); embedded mode always scans. ``exact=True``
(``search --qdrant --exact``) makes every query an exact search (``SearchParams(exact=True)``: a server scans
every point, whatever HNSW index it has; embedded mode: nothing changes), reported exact
(``qdrant_server_exact``) without asking the server.

The upload is :mod:`patchword.search.qdrant_upload`, the client :mod:`patchword.search.qdrant_connect`; this
module re-exports what they offer.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.errors import ConfigError, DataError, MissingFileError
from patchword.search.entries import IndexEntries
from patchword.search.manifest import Manifest, rows_digest, unfinished_build
from patchword.search.qdrant_connect import (  # noqa: F401  (re-exported: the backend's one import)
    MARKER_ID,
    QDRANT_FILE,
    _client_module,
    _upload_again,
    connect,
    is_local,
    read_marker,
    unreachable,
    upload_command,
)
from patchword.search.qdrant_upload import _upload, open_for_upload, upload_index  # noqa: F401
from patchword.search.store import StaleIndexError

__all__ = ["QDRANT_FILE", "connect", "open_for_upload", "upload_index", "QdrantIndex"]


class QdrantIndex(IndexEntries):
    """An index read from Qdrant: what :class:`~patchword.search.query.Searcher` asks of a
    :class:`~patchword.search.store.SearchIndex` (entries from the local manifest, vectors from Qdrant),
    plus :meth:`shortlist`, the first stage done by Qdrant.

    Safe to use from several threads at once: the vectors a :meth:`shortlist` returns with its hits are kept
    for the thread that asked (the re-ranking of the same query, in the same thread, reads them), never in
    state another thread's query replaces."""

    def __init__(
        self, index_dir: Path, manifest: Manifest, record: dict[str, Any], client=None, *, exact: bool = False
    ) -> None:
        self.index_dir, self.manifest, self.record = index_dir, manifest, record
        self.entries = manifest.entries
        self.client = client if client is not None else connect(record["location"])
        self.exact = bool(exact)  # every query an exact search: what the first stage is (fidelity)
        _, models = _client_module()
        self._search_params = models.SearchParams(exact=True) if self.exact else None
        self.collection = record["collection"]
        self._hits = threading.local()  # .vectors: id -> vectors of this thread's last shortlist
        self.server: dict[str, Any] | None = None  # a server's collection when opened: _server_state()
        self.marked = False  # the collection holds a marker point (read when opened: _collection_problem)

    @classmethod
    def open(
        cls, index_dir: str | Path, *, reuse: QdrantIndex | None = None, exact: bool = False
    ) -> QdrantIndex:
        """Open an uploaded index; ``reuse``: an index opened before (a server reopening it after an update)
        whose client is shared when the record names the same location: an embedded store admits one
        client, which that index holds. ``exact``: every :meth:`shortlist` is an exact search
        (``SearchParams(exact=True)``: a server scans every point rather than its HNSW index, slower on a
        large collection; an embedded store always does, so there it changes nothing), and the server is
        not asked what its collection holds (the first stage is exact whatever it has indexed).

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
            command = upload_command(index_dir, "PATH_OR_URL", Manifest.read(index_dir))
            raise ConfigError(
                "--qdrant",
                f"{index_dir} was not uploaded to Qdrant, or its upload did not finish (no {QDRANT_FILE}): "
                f"upload it with `{command}`",
            )
        manifest = Manifest.read(index_dir)
        if manifest.state != "complete":
            raise DataError(unfinished_build(index_dir))
        record = json.loads(path.read_text())
        location = str(record.get("location"))
        again = _upload_again(index_dir, location, manifest, record.get("collection"))
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
        index = cls(index_dir, manifest, record, reuse.client if shared else None, exact=exact)
        from qdrant_client.http.exceptions import ApiException  # installed: connect() imported the client

        try:
            problem = index._collection_problem()
            if problem is None and not exact and location.startswith(("http://", "https://")):
                index.server = index._server_state()  # once per open: what the first stage is
        except ApiException as err:  # a server that cannot be reached or refuses: one line, not a traceback
            if not shared:
                index.client.close()
            raise DataError(f"{index_dir}: {unreachable(location, index.collection, err)}") from err
        if problem is not None:
            if not shared:
                index.client.close()
            raise DataError(f"{index_dir}: {problem}")
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
        """What keeps the collection from answering for the index, with what to do, or None: missing, its
        marker (:data:`~patchword.search.qdrant_connect.MARKER_ID`) naming another index or version (two
        indexes given one collection name; an upload under way or stopped), holding another number of
        points than the record (an upload stopped part-way, points deleted). A collection without a marker
        (uploaded before markers were written) is checked by its point count only."""
        location, collection = self.record["location"], self.collection
        again = _upload_again(self.index_dir, location, self.manifest, collection)
        where = f"the {'embedded ' if is_local(location) else ''}Qdrant store {location}"
        if not self.client.collection_exists(collection):
            return f"{where} has no collection {collection!r}; {again}"
        marker = read_marker(self.client, collection)
        self.marked = marker is not None
        here = str(self.index_dir.resolve())
        if marker is not None:
            owner, build = marker.get("index"), self.manifest.build_id
            # another folder, and another build (an index written before build ids: its folder decides)
            if owner != here and (build is None or marker.get("build_id") != build):
                command = upload_command(self.index_dir, location, self.manifest, "NAME")
                return (
                    f"Qdrant collection {collection!r} at {location} holds the index {owner}, uploaded to it "
                    f"after this one (both given that collection name); upload this index to a collection "
                    f"of its own: `{command}`"
                )
            if marker.get("rows") != self.record.get("rows"):
                return (
                    f"Qdrant collection {collection!r} holds another version of this index (an upload to it "
                    f"is under way or was stopped part-way); {again}"
                )
        elif self.record.get("marked"):
            return (
                f"Qdrant collection {collection!r} was replaced since this index was uploaded to it; {again}"
            )
        points = self.client.count(collection, exact=True).count - self.marked
        if points != self.record.get("points"):
            return (
                f"Qdrant collection {collection!r} holds {points} points, but the index uploaded to it "
                f"has {self.record.get('points')} (an upload stopped part-way, or points deleted since); "
                + again
            )
        return None

    def _server_state(self) -> dict[str, Any]:
        """What a Qdrant server says of the collection: ``{"status": "green" | "yellow" | "grey" | "red",
        "points": P, "vectors": P x named vectors, "indexed": vectors in an HNSW index (None: not said)}``.

        A server scans every vector of a segment without an HNSW index (an exact search); a segment gets one
        once it passes the collection's indexing threshold (``optimizer_config.indexing_threshold``), built by
        the optimizer in the background (status yellow meanwhile, grey when it is pending). No vector indexed
        and a green status: every segment is scanned (:func:`~patchword.search.fidelity.search_kind`)."""
        info = self.client.get_collection(self.collection)
        points = max(0, int(info.points_count or 0) - self.marked)  # the marker holds no vector
        named = getattr(getattr(info.config, "params", None), "vectors", None)
        indexed = info.indexed_vectors_count
        return {
            "status": str(getattr(info.status, "value", info.status)),
            "points": points,
            "vectors": points * (len(named) if isinstance(named, dict) else 1),
            "indexed": None if indexed is None else int(indexed),
        }

    @property
    def has_dense(self) -> bool:
        return bool(self.record.get("dense"))

    def shortlist(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, C) global query embedding -> ((1, k) scores, (1, k) ids) by Qdrant, best first; the hits'
        tokens are kept for :meth:`image_tokens` / :meth:`dense_tokens` of the same ids in this thread. An
        exact search when the index was opened ``exact``."""
        names = ["tokens", "dense"] if self.has_dense else ["tokens"]
        self._hits.vectors = {}  # an earlier query's vectors are never read for this one's hits
        hits = self.client.query_points(
            self.collection,
            query=query[0].tolist(),
            using="global",
            limit=k,
            search_params=self._search_params,  # None: the server's own (HNSW once it has indexed)
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
                + _upload_again(self.index_dir, self.record["location"], self.manifest, self.collection)
            )
        return [found[int(i)] for i in ids]

    def image_tokens(self, ids) -> torch.Tensor:
        """(k,) ids -> (k, L_v, C) float32 image tokens from Qdrant."""
        ids = self.check_ids(ids)
        return torch.tensor(np.stack([np.asarray(v["tokens"], np.float32) for v in self._vectors(ids)]))

    def prefetch(self, ids) -> None:
        """Nothing to do: the shortlist's vectors came back with the hits (:meth:`shortlist`); ``ids`` are
        checked as :class:`~patchword.search.store.SearchIndex` checks them."""
        self.check_ids(ids)

    def dense_scores(self, ids) -> None:
        """Always None: a Qdrant collection holds dense tokens, never precomputed dense scores."""
        self.check_ids(ids)
        return None

    def patch_priors(self, ids) -> None:
        """Always None: a Qdrant collection holds every patch (pruned indexes are not uploaded)."""
        self.check_ids(ids)
        return None

    def dense_tokens(self, ids) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k,) ids -> ((k, L_d, C) zero-padded dense tokens, (k,) lengths), or None."""
        ids = self.check_ids(ids)
        if not self.has_dense:
            return None
        parts = [np.asarray(v["dense"], np.float32) for v in self._vectors(ids)]
        lens = torch.tensor([len(p) for p in parts], dtype=torch.int64)
        out = np.zeros((len(parts), int(lens.max()), parts[0].shape[1]), np.float32)
        for row, part in enumerate(parts):
            out[row, : len(part)] = part
        return torch.from_numpy(out), lens

    def global_rows(self, ids) -> torch.Tensor:
        """(k,) ids -> (k, C) float32 global image embeddings from Qdrant (a shortlist's hits do not carry
        them: they are fetched here)."""
        ids = self.check_ids(ids).tolist()
        retrieved = list(
            self.client.retrieve(self.collection, ids=ids, with_vectors=["global"], with_payload=["path"])
        )
        self._check_paths(retrieved)
        points = {int(p.id): p.vector for p in retrieved}
        absent = [i for i in ids if i not in points]
        if absent:
            raise DataError(
                f"{self.index_dir}: Qdrant collection {self.collection!r} has no point {absent[0]}; "
                + _upload_again(self.index_dir, self.record["location"], self.manifest, self.collection)
            )
        return torch.tensor(np.stack([np.asarray(points[i]["global"], np.float32) for i in ids]))

    def global_embeddings(self) -> torch.Tensor:
        raise NotImplementedError("the Qdrant backend shortlists in Qdrant")
