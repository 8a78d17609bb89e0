"""Hostile inputs to ``index build``, ``search`` and ``serve``: a ``--qdrant`` value that is a server's
address without its scheme (or a URL of another scheme) is refused instead of becoming an embedded store
named like it, a manifest with two entries on one row or one path is refused naming the entry, and
``/healthz`` says ``error`` when the index on disk can no longer be opened, before any request tried."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.search.manifest import MANIFEST_FILE
from patchword.search.qdrant_connect import is_local
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import create_app
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "location, said",
    [
        (
            "localhost:6333",
            "localhost:6333 looks like a server's host:port, not an embedded store's directory: write "
            "http://localhost:6333 for a server (or ./localhost:6333 for a new store of that name)",
        ),
        (
            "qdrant://localhost:6333",
            "qdrant://localhost:6333: a Qdrant server is reached over http:// or https:// (write "
            "http://localhost:6333); a directory path names an embedded store",
        ),
        ("ftp://x", "ftp://x: a Qdrant server is reached over http:// or https:// (write http://x)"),
    ],
)
def test_qdrant_refuses_a_server_address_it_would_take_for_a_directory(
    env, tmp_path, capsys, monkeypatch, location, said
):
    """Old code made ./localhost:6333/ (or ./qdrant:/localhost:6333/) an embedded store, "uploaded"."""
    pytest.importorskip("qdrant_client")
    monkeypatch.chdir(tmp_path)
    images = str(env.export.files["images"])
    argv = ["index", "build", str(env.run_dir), "--images", images, "--out", "idx", "--qdrant", location]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: --qdrant: {said}")
    assert list(tmp_path.iterdir()) == []


def test_a_store_directory_named_like_host_port_is_still_a_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_local("./localhost:6333") and is_local("store") and not is_local("http://localhost:6333")
    (tmp_path / "localhost:6333").mkdir()  # one that exists was made on purpose
    assert is_local("localhost:6333")
    with pytest.raises(ConfigError):
        is_local("10.0.0.5:6334")


def _copy(env, tmp_path):
    index = tmp_path / "idx"
    shutil.copytree(env.index_dir, index)
    return index


def _edit_entries(index, edit) -> None:
    manifest = json.loads((index / MANIFEST_FILE).read_text())
    edit(manifest["entries"])
    (index / MANIFEST_FILE).write_text(json.dumps(manifest))


def _same_row(entries):
    entries[4][4:6] = entries[1][4:6]  # [path, size, mtime_ns, format, shard, row, dense_sha]


def _same_path(entries):
    entries[4][0] = entries[1][0]


@pytest.mark.parametrize(
    "edit, said",
    [
        (_same_row, "points at row {row} of shard {shard}, as entries[1] does"),
        (_same_path, "names {path!r}, as entries[1] does"),
    ],
)
def test_a_manifest_with_two_entries_on_one_row_or_path_is_refused(env, tmp_path, capsys, edit, said):
    """Old code opened it: two images answered with one's vectors, or one image listed twice."""
    index = _copy(env, tmp_path)
    entry = json.loads((index / MANIFEST_FILE).read_text())["entries"][1]
    path, shard, row = entry[0], entry[4], entry[5]
    _edit_entries(index, edit)
    assert main(["search", str(index), "a red circle"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {index / MANIFEST_FILE}: malformed index manifest: field 'entries[4]' "
        f"{said.format(row=row, shard=shard, path=path)}; build a new index with `patchword index build`"
    )


def test_healthz_says_error_when_the_index_on_disk_cannot_be_opened(env, tmp_path):
    """Old code: status ok, changed_on_disk, no "error" (only a search request found out)."""
    index = _copy(env, tmp_path)
    captions, _ = caption_queries(env)
    manifest = (index / MANIFEST_FILE).read_bytes()
    with TestClient(create_app(Searcher(SearchIndex.open(index), env.run))) as client:
        (index / MANIFEST_FILE).write_text("{not json")
        response = client.get("/healthz")
        health = response.json()
        assert response.status_code == 200 and health["status"] == "ok"  # alive; docs/search.md
        assert health["changed_on_disk"] is True
        assert health["error"] == (
            "the index changed on disk and cannot be opened as it is now (logged on the server)"
        )
        assert client.get("/api/search", params={"q": captions[0]}).status_code == 503
        # the same files once more: a new inode, which opens; the next request answers from it
        (index / MANIFEST_FILE).unlink()
        (index / MANIFEST_FILE).write_bytes(manifest)
        health = client.get("/healthz").json()
        assert health["changed_on_disk"] is True and "error" not in health
        response = client.get("/api/search", params={"q": captions[0], "k": 3})
        assert response.status_code == 200 and len(response.json()["results"]) == 3
        health = client.get("/healthz").json()
        assert "changed_on_disk" not in health and "error" not in health
