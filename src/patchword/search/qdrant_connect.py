"""Connecting to Qdrant for :mod:`patchword.search.qdrant` (searching) and
:mod:`patchword.search.qdrant_upload` (uploading): the client, where a store is, and the one-line errors of
a store that cannot be used."""

from __future__ import annotations

import re
from pathlib import Path

from patchword.errors import ConfigError, DataError, MissingExtraError

__all__ = ["QDRANT_FILE", "connect", "is_local", "unreachable"]

#: The record of an upload in the index directory, written once every point is in
#: (:func:`~patchword.search.qdrant_upload.upload_index`).
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


def _upload_again(index_dir: Path, location: str) -> str:
    """How to bring a Qdrant collection back in line with its index: the build that uploads it again."""
    command = f"patchword index build RUN_DIR --images DIR --out {index_dir} --update --qdrant {location}"
    return f"rerun `{command}` to upload it again"
