"""Connecting to Qdrant for :mod:`patchword.search.qdrant` (searching) and
:mod:`patchword.search.qdrant_upload` (uploading): the client, where a store is, and the one-line errors of
a store that cannot be used."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError, DataError, MissingExtraError

__all__ = ["QDRANT_FILE", "MARKER_ID", "connect", "is_local", "read_marker", "unreachable", "upload_command"]

#: The record of an upload in the index directory, written once every point is in
#: (:func:`~patchword.search.qdrant_upload.upload_index`).
QDRANT_FILE = "qdrant.json"
#: The id of the point that says which index a collection holds: a payload (``{"patchword_index": {"index":
#: absolute index directory, "build_id", "rows": rows_digest or None while an upload runs, "layout"}}``) and
#: no vector, so no search returns it; a UUID, never an index id (those are integers). Two indexes given the
#: same collection (by default the --out folder's name) would otherwise overwrite each other's points and
#: search the other's images under their own paths.
MARKER_ID = "70617463-6877-6f72-6400-000000000001"


def _client_module():
    try:
        import qdrant_client
        from qdrant_client import models
    except ImportError:
        raise MissingExtraError(
            "the Qdrant backend needs qdrant-client: pip install 'patchword[qdrant]'"
        ) from None
    return qdrant_client, models


#: A URL of any scheme (``qdrant://``, ``grpc://``, ``ftp://``): taken for a directory, it became an
#: embedded store at ``./qdrant:/host:6333``.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: ``host:port`` (``localhost:6333``, ``10.0.0.5:6334``): a server's address without its scheme, which
#: became a new embedded store in ``./localhost:6333/`` and the upload "succeeded".
_HOST_PORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*:\d+/?$")


def is_local(location: str) -> bool:
    """Whether ``location`` names an embedded store's directory (not a URL, not ``:memory:``).

    Raises:
        ConfigError: naming ``--qdrant``: a URL of another scheme than ``http://`` / ``https://``, or a
            ``host:port`` without its scheme that is no existing directory (a server meant, never a new
            store named like it).
    """
    if location.startswith(("http://", "https://")) or location == ":memory:":
        return False
    if _URL.match(location):
        rest = location.split("://", 1)[1]
        raise ConfigError(
            "--qdrant",
            f"{location}: a Qdrant server is reached over http:// or https:// (write http://{rest}); "
            "a directory path names an embedded store",
        )
    if _HOST_PORT.match(location) and not Path(location).expanduser().is_dir():
        raise ConfigError(
            "--qdrant",
            f"{location} looks like a server's host:port, not an embedded store's directory: write "
            f"http://{location.rstrip('/')} for a server (or ./{location} for a new store of that name)",
        )
    return True


def connect(location: str):
    """A Qdrant client: ``http(s)://host:port`` (a server or cluster), ``:memory:``, or a local directory
    (embedded mode, in-process; created when missing).

    Raises:
        DataError: the embedded store is held by another client (another process searching, serving or
            uploading it: embedded mode admits one at a time).
    """
    qdrant_client, _ = _client_module()
    if not is_local(location):  # is_local raises for a URL of another scheme, or a server's host:port
        if location == ":memory:":
            return qdrant_client.QdrantClient(location=":memory:")
        return qdrant_client.QdrantClient(url=location)
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


def read_marker(client, collection: str) -> dict[str, Any] | None:
    """What the marker point of ``collection`` (:data:`MARKER_ID`) says of the index it holds, or None: no
    marker (uploaded before it was written, or by another program)."""
    points = client.retrieve(collection, ids=[MARKER_ID], with_payload=True, with_vectors=False)
    marker = (points[0].payload or {}).get("patchword_index") if points else None
    return marker if isinstance(marker, dict) else None


def upload_command(index_dir: Path, location: str, manifest=None, collection: str | None = None) -> str:
    """The ``index build --update --qdrant`` command that uploads ``index_dir`` to ``location``: the run and
    image folder from ``manifest`` (placeholders without one), ``--collection`` when ``collection`` is not
    the default (the --out folder's name), every path shell-quoted."""
    q = shlex.quote
    run, images, extra = "RUN_DIR", "DIR", ""
    if manifest is not None:
        run, images = q(str(manifest.model.get("run_dir", "RUN_DIR"))), q(str(manifest.images_root))
        checkpoint = Path(str(manifest.model.get("checkpoint") or "best.pt"))
        if checkpoint.name != "best.pt":  # an update refuses other weights than the index's
            inside = checkpoint.parent == Path(str(manifest.model.get("run_dir")))
            extra = f" --checkpoint {q(checkpoint.name if inside else str(checkpoint))}"
    if collection is not None and collection != Path(index_dir).name:
        extra += f" --collection {q(collection)}"
    return (
        f"patchword index build {run} --images {images} --out {q(str(index_dir))} --update "
        f"--qdrant {q(location)}{extra}"
    )


def _upload_again(index_dir: Path, location: str, manifest=None, collection: str | None = None) -> str:
    """How to bring a Qdrant collection back in line with its index: the build that uploads it again."""
    return f"rerun `{upload_command(index_dir, location, manifest, collection)}` to upload it again"
