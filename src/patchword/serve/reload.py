"""The index a server answers from, reopened when it changes on disk.

``patchword index build --update`` replaces ``manifest.json`` last (and an upload to Qdrant rewrites
``qdrant.json`` once every point is in): a server that opened the index before would answer from the old
version for as long as it runs, with ids that name other images in the new one. :class:`ServedIndex` stats
those files on every request (two ``stat`` calls) and, when they changed, reopens the index under a lock
(:meth:`~patchword.search.query.Searcher.reopen`: the loaded run is kept; an open that meets a manifest
replaced mid-way opens the new one, :meth:`~patchword.search.store.SearchIndex.open`). Requests answered
meanwhile by another thread keep the index they started with.

A reopen that fails (an upload to Qdrant still running, an index damaged or built by another model) is
logged once per version of the files and every request until they change again gets
:class:`IndexUnavailable`: the server never answers from an index it knows is out of date.
"""

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

from patchword.search.manifest import MANIFEST_FILE, rows_digest
from patchword.search.query import Searcher

__all__ = ["IndexUnavailable", "ServedIndex"]

logger = logging.getLogger(__name__)

#: The file a Qdrant upload writes last (:data:`patchword.search.qdrant.QDRANT_FILE`, not imported: the
#: ``qdrant`` extra may be missing).
_QDRANT_FILE = "qdrant.json"

Stamp = tuple[tuple[int, int, int] | None, ...]


class IndexUnavailable(Exception):
    """The index changed on disk and cannot be opened as it is now (the reason is in the server's log)."""


class ServedIndex:
    """The :class:`~patchword.search.query.Searcher` a server answers with, reopened when the index's files
    change. Safe to use from several threads at once."""

    def __init__(self, searcher: Searcher) -> None:
        self._files = [Path(searcher.index.index_dir) / MANIFEST_FILE]
        if searcher.backend == "store":  # Qdrant: the record of the collection's upload too
            self._files.append(Path(searcher.index.index_dir) / _QDRANT_FILE)
        self._lock = threading.Lock()
        # the stamp is taken before the open that it describes: a file replaced after it is noticed
        self._stamp: Stamp | None = self.stamp()
        # one attribute for both, replaced at once: a thread never reads a searcher with another's version
        self._served: tuple[Searcher, str] = (searcher, rows_digest(searcher.index.manifest))
        self._failed: tuple[Stamp, Exception] | None = None
        # an index /healthz opened as the files are now (:meth:`probe`), for the next request to answer from
        self._pending: tuple[Stamp, Searcher] | None = None

    def stamp(self) -> Stamp:
        """(inode, size, mtime) of each watched file, None for one that is absent: what a build's atomic
        replace changes."""
        stamps = []
        for file in self._files:
            try:
                st = os.stat(file)
            except OSError:  # absent (an upload under way removed its record), or the index is gone
                stamps.append(None)
            else:
                stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(stamps)

    def current_version(self) -> tuple[Searcher, str]:
        """(searcher, version) of the index as it is on disk, reopened first when its files changed (call it
        from a worker thread: a reopen reads the manifest and maps the shards); the version
        (:func:`~patchword.search.manifest.rows_digest`, as ``/healthz`` says it) is that of this searcher,
        even while another thread reopens the index.

        Raises:
            IndexUnavailable: the files changed and the index cannot be opened as they are now.
        """
        if self.stamp() == self._stamp:
            return self._served
        if not self._lock.acquire(blocking=False):
            # another request is reopening it: this one is answered from the index it knows is there
            if self._failed is not None:
                raise IndexUnavailable(str(self._failed[1]))
            return self._served
        try:
            stamp = self.stamp()
            if stamp == self._stamp:
                return self._served
            if self._failed is not None and self._failed[0] == stamp:
                raise IndexUnavailable(str(self._failed[1]))
            searcher = self._open(stamp)
            self._served = served = (searcher, rows_digest(searcher.index.manifest))
            self._stamp, self._failed = stamp, None
            logger.info(
                "reopened %s: %d images (version %s)", searcher.index.index_dir, len(searcher), served[1]
            )
            return served
        finally:
            self._lock.release()

    def _open(self, stamp: Stamp) -> Searcher:
        """The index opened as its files are now (``stamp``): the one :meth:`probe` opened at this stamp, else
        a reopen. The caller holds the lock.

        Raises:
            IndexUnavailable: it cannot be opened (recorded for ``stamp`` and logged, once).
        """
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == stamp:
            return pending[1]
        try:
            return self._served[0].reopen()
        except Exception as err:  # noqa: BLE001 - whatever it is, this version of the files is not served
            self._failed = (stamp, err)
            logger.error("the index changed on disk and cannot be opened as it is now: %s", err)
            raise IndexUnavailable(str(err)) from err

    def changed_on_disk(self) -> bool:
        """Whether the watched files changed since the index answered from was opened."""
        return self.stamp() != self._stamp

    def probe(self) -> None:
        """When the files changed, open the index as it is now, as the next request would (call it from a
        worker thread), without answering from it yet: a failure is recorded and logged as that request's
        would be (so :meth:`describe` says ``error``), a success kept for the next request to answer from.
        Nothing is done while a request reopens it (the lock is taken without waiting) or when this version
        of the files was opened or refused already (unchanged files: that of the index answered from)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            stamp = self.stamp()
            tried = [self._stamp]
            tried += [known[0] for known in (self._failed, self._pending) if known is not None]
            if stamp in tried:
                return
            with contextlib.suppress(IndexUnavailable):  # recorded: describe() reports it
                self._pending = (stamp, self._open(stamp))
        finally:
            self._lock.release()

    def invalidate(self) -> None:
        """Reopen the index at the next request even when its files look unchanged (a Qdrant collection
        found holding other images than the index opened, or a shard file cut short in place:
        :class:`~patchword.search.store.StaleIndexError`); only a change of the watched files retries an
        open that fails then. Without the lock (the event loop calls it): a reopen finishing meanwhile is as
        good."""
        self._stamp, self._failed, self._pending = None, None, None

    def describe(self) -> dict[str, Any]:
        """What ``/healthz`` says of the index: the one answered from, all of one searcher even while
        another thread reopens the index (its ``matcher``, ``run`` (directory name), ``shortlist`` (the
        least a search re-ranks: one for more results re-ranks ``k``), ``dense``: whether the fine stage
        reads its dense captions; ``images``; ``version``: which row every id reads,
        :func:`~patchword.search.manifest.rows_digest`; ``index``: its kind, warnings (the run and the index
        named by their folder names) and summary, :func:`~patchword.search.fidelity.describe_index`),
        ``changed_on_disk`` when the files changed
        since it was opened (the next search, explanation or image request reopens it), and ``error`` when
        they cannot be opened as they are (found by a request or by :meth:`probe`)."""
        searcher, version = self._served  # one read: the searcher and its version together
        model = searcher.index.manifest.model
        body = {
            "matcher": model.get("matcher"),
            "run": Path(model.get("run_dir", "")).name,
            "shortlist": searcher.shortlist,
            "dense": searcher.use_dense,
            "images": len(searcher),
            "version": version,
            "index": searcher.index_info,
        }
        stamp = self.stamp()  # the files stat-ed once for both
        if stamp != self._stamp:
            body["changed_on_disk"] = True
        failed = self._failed
        if failed is not None and failed[0] == stamp:
            body["error"] = (
                "the index changed on disk and cannot be opened as it is now (logged on the server)"
            )
        return body

    @property
    def searcher(self) -> Searcher:
        """The searcher last opened (without looking at the files)."""
        return self._served[0]
