"""Connecting to Qdrant for :mod:`patchword.search.qdrant` (searching) and
:mod:`patchword.search.qdrant_upload` (uploading): the client, where a store is, and the one-line errors of
a store that cannot be used."""

from __future__ import annotations

from pathlib import Path

from patchword.errors import DataError, MissingExtraError

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


def _upload_again(index_dir: Path, location: str) -> str:
    """How to bring a Qdrant collection back in line with its index: the build that uploads it again."""
    command = f"patchword index build RUN_DIR --images DIR --out {index_dir} --update --qdrant {location}"
    return f"rerun `{command}` to upload it again"
