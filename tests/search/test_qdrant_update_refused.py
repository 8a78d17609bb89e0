"""``index build --update --qdrant`` refused by the store leaves the index as it was.

Old code updated the index (a new ``manifest.json``) and only then connected for the upload: with the
embedded store held by a ``serve --qdrant``, or a Qdrant server out of reach, the command ended in one error
line but the manifest no longer matched the collection's record, so every server of the index answered 503
until it was restarted and the upload rerun. The build now connects before it writes anything."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import one_error_line
from patchword.cli import main
from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.serve.app import create_app
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
pytest.importorskip("qdrant_client")


def _index_files(index_dir: Path) -> dict[str, bytes]:
    """Every file of ``index_dir`` (relative path -> bytes): what a refused command must leave alone."""
    return {
        str(p.relative_to(index_dir)): p.read_bytes() for p in sorted(index_dir.rglob("*")) if p.is_file()
    }


def _uploaded(env, tmp_path: Path, **build) -> tuple[Path, Path, Path, list[str]]:
    """An index of a copy of the exported images, uploaded to an embedded store, whose folder then loses its
    first image (an update would change the index): (images, index, store, the update's command line)."""
    folder, out, store = tmp_path / "imgs", tmp_path / "idx", tmp_path / "store"
    shutil.copytree(env.export.files["images"], folder)
    build_index(env.run, folder, out, dense=env.export.files["dense"], shard_size=10, **build)
    if not build:
        qdrant.upload_index(out, str(store), "idx")
    (folder / sorted(p.name for p in folder.iterdir())[0]).unlink()
    command = ["index", "build", str(env.run_dir), "--images", str(folder), "--out", str(out)]
    command += ["--dense", str(env.export.files["dense"]), "--shard-size", "10", "--update"]
    return folder, out, store, command


def test_an_update_refused_by_a_served_embedded_store_leaves_the_index_and_the_server(env, tmp_path, capsys):
    folder, out, store, update = _uploaded(env, tmp_path)
    before = _index_files(out)
    captions, _ = caption_queries(env)
    searcher = Searcher(qdrant.QdrantIndex.open(out), env.run)  # a `serve --qdrant` holding the store
    try:
        with TestClient(create_app(searcher)) as client:
            assert client.get("/api/search", params={"q": captions[0], "k": 3}).status_code == 200
            capsys.readouterr()
            assert main([*update, "--qdrant", str(store)]) == 2
            line = one_error_line(capsys.readouterr().err)
            assert line.startswith(f"error: the embedded Qdrant store {store} is in use by another process")
            assert _index_files(out) == before  # nothing of the index written: no manifest, shard, record
            # the server goes on answering from the index and collection it opened
            response = client.get("/api/search", params={"q": captions[0], "k": 3})
            assert response.status_code == 200, response.text
            assert client.get("/healthz").json()["images"] == 24
    finally:
        searcher.index.client.close()
    # the server stopped, the same command updates and uploads
    assert main([*update, "--qdrant", str(store)]) == 0
    index = qdrant.QdrantIndex.open(out)
    assert len(index) == 23 and index.record["points"] == 23
    index.client.close()


def test_an_update_refused_by_an_unreachable_server_leaves_the_index(env, tmp_path, capsys):
    folder, out, store, update = _uploaded(env, tmp_path)
    before = _index_files(out)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    capsys.readouterr()
    assert main([*update, "--qdrant", url]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot use Qdrant collection 'idx' at {url}: ")
    assert _index_files(out) == before
    assert main(["search", str(out), caption_queries(env)[0][0], "--qdrant", "-k", "2"]) == 0


def test_an_update_of_an_index_qdrant_cannot_hold_is_refused_before_it_runs(env, tmp_path, capsys):
    folder, out, store, update = _uploaded(env, tmp_path, keep_patches=0.75)
    before = _index_files(out)
    capsys.readouterr()
    assert main([*update, "--qdrant", str(store)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: --qdrant: {out} was pruned (--keep-patches); the Qdrant backend holds every patch"
    assert _index_files(out) == before
