"""What search and serve say when a request or a command cannot be answered: a 4xx naming what is wrong,
never a 500, and words that say what happened. Each case was wrong in old code: an indexed TIFF replaced by
bytes that no longer decode was a 500 (a logged ``UnidentifiedImageError``); ``k=99999999999999`` was
"must be an integer"; ``/healthz?k=5`` and ``/api/image/0?k=5`` answered 200 though a parameter a route does
not take is a 400; a query of punctuation said "text 0 is empty"; a path that does not exist "has no
manifest.json"; ``--dense-store`` on an index without dense captions "keeps dense nothing"; a malformed
``--dense`` line's message ended in ``}}}}``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from conftest import one_error_line
from patchword.cli.search import main_index, main_search
from patchword.cli.serve import main_serve
from patchword.errors import DataError
from patchword.search.encode import read_dense_file
from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import create_app

pytestmark = pytest.mark.usefixtures("one_thread")


def _picture(seed: int, fmt: str) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def small(env, tmp_path_factory) -> tuple[Path, Path]:
    """(folder, index) of a PNG and a TIFF (sent as PNG: browsers do not show TIFF), no dense captions."""
    folder = tmp_path_factory.mktemp("small") / "imgs"
    folder.mkdir()
    (folder / "a.png").write_bytes(_picture(0, "PNG"))
    (folder / "b.tiff").write_bytes(_picture(1, "TIFF"))
    out = folder.parent / "idx"
    build_index(env.run, folder, out)
    return folder, out


@pytest.fixture
def client(env, small):
    searcher = Searcher(SearchIndex.open(small[1]), env.run)
    with TestClient(create_app(searcher), raise_server_exceptions=False) as client:
        yield client


def test_an_indexed_file_that_no_longer_decodes_is_a_404_saying_so(small, client, caplog):
    folder, _ = small
    tiff = folder / "b.tiff"
    image_id = 1
    assert client.get(f"/api/image/{image_id}").headers["content-type"] == "image/png"
    before = tiff.read_bytes()
    try:
        tiff.write_bytes(b"II*\x00" + b"\x00" * 60)  # a TIFF header, nothing readable after it
        response = client.get(f"/api/image/{image_id}")
    finally:
        tiff.write_bytes(before)
    assert response.status_code == 404
    assert response.json() == {
        "error": f"the file of image {image_id} changed since it was indexed and cannot be read; "
        "run index build --update"
    }
    assert "Traceback" not in caplog.text and "UnidentifiedImageError" not in caplog.text


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        ("/api/search?q=dog&k=99999999999999", 400, "parameter 'k' must lie in [1, 100], got 99999999999999"),
        ("/api/search?q=dog&k=" + "9" * 50, 400, f"parameter 'k' must lie in [1, 100], got {'9' * 40}..."),
        (
            "/api/search?q=dog&k=-99999999999999",
            400,
            "parameter 'k' must lie in [1, 100], got -99999999999999",
        ),
        ("/api/image/99999999999999", 404, "no image with id 99999999999999 (the index holds 2)"),
        ("/api/image/" + "9" * 50, 404, f"no image with id {'9' * 40}..."),
        ("/api/explain?q=dog&id=99999999999999", 404, "no image with id 99999999999999 (the index holds 2)"),
        ("/healthz?k=5", 400, "unknown parameter 'k' (this endpoint takes no parameters)"),
        ("/api/image/0?k=5", 400, "unknown parameter 'k' (this endpoint takes version)"),
        (
            "/api/search?q=%21%21%21",
            400,
            "the query has no words the model can read (no words: the alnum word split finds none): '!!!'",
        ),
    ],
)
def test_a_request_is_answered_with_what_is_wrong(client, url, status, message):
    response = client.get(url)
    assert response.status_code == status and response.json() == {"error": message}


def test_routes_without_parameters_still_answer_without_them(client):
    assert client.get("/healthz").status_code == 200
    assert client.head("/healthz").status_code == 200
    assert client.get("/api/image/0").status_code == 200
    assert client.get("/").status_code == 200


def test_a_query_of_no_words_names_no_internal_text_number(small, capsys):
    assert main_search([str(small[1]), "🙂 !!"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        "error: the query has no words the model can read (no words: the alnum word split finds none): "
        "'🙂 !!'"
    )


@pytest.mark.parametrize("command", ["search", "serve"])
def test_an_index_path_that_does_not_exist_is_said_to_not_exist(tmp_path, capsys, command):
    def run(path: Path) -> int:
        return main_search([str(path), "red"]) if command == "search" else main_serve([str(path)])

    assert run(tmp_path / "nothere") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: search index not found: {tmp_path / 'nothere'} does not exist"
    )
    (tmp_path / "empty").mkdir()
    assert run(tmp_path / "empty") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {tmp_path / 'empty'} is not a search index: it has no manifest.json"
    )


def test_dense_store_on_an_index_without_dense_captions_says_so(env, small, capsys):
    folder, out = small
    before = (out / "manifest.json").read_bytes()
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--update"]
    assert main_index([*args, "--dense-store", "scores"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --dense-store: {out} was built without --dense; build a new index to change it"
    )
    assert (out / "manifest.json").read_bytes() == before


def test_a_dense_line_without_its_fields_shows_the_expected_shape_with_balanced_braces(tmp_path):
    dense = tmp_path / "dense.jsonl"
    dense.write_text('{"text": "a red circle"}\n')
    with pytest.raises(DataError) as err:
        read_dense_file(dense)
    assert str(err.value) == (
        f"--dense: {dense}:1: expected {{'text': ..., 'metadata': {{'file': <image path relative to "
        "--images>}}"
    )
