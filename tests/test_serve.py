"""The search server: API values against the library, explain shapes, and what a hostile or clumsy client
gets (path traversal, unknown ids, bad queries, malformed UTF-8, overload, internal errors)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from patchword.errors import MissingExtraError
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app, require_serve_extra
from patchword.serve.cli import main_serve
from search_support import caption_queries, library_t2i_scores, live_server, rank_bounds

pytestmark = pytest.mark.usefixtures("one_thread")

STATIC = Path(__file__).resolve().parents[1] / "src" / "patchword" / "serve" / "static"


@pytest.fixture(scope="module")
def client(searcher):
    with TestClient(create_app(searcher), raise_server_exceptions=False) as client:
        yield client


def _error(response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    message = response.json()["error"]
    assert isinstance(message, str) and message
    return message


def test_search_api_returns_the_library_results(client, searcher, env):
    captions, _ = caption_queries(env)
    response = client.get("/api/search", params={"q": captions[3], "k": 5})
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    body = response.json()
    assert set(body) == {"query", "results", "ms", "shortlist"} and body["query"] == captions[3]
    expected = searcher.search(captions[3], k=5)
    assert [r["id"] for r in body["results"]] == [h.id for h in expected.hits]
    assert [r["path"] for r in body["results"]] == [h.path for h in expected.hits]
    assert [r["score"] for r in body["results"]] == pytest.approx([h.score for h in expected.hits], abs=1e-6)
    assert [r["global_score"] for r in body["results"]] == pytest.approx(
        [h.global_score for h in expected.hits], abs=1e-6
    )
    assert all(set(r) == {"id", "path", "score", "global_score"} for r in body["results"])
    assert all(not r["path"].startswith("/") for r in body["results"]) and body["ms"] > 0


def test_known_captions_find_their_image_at_the_rank_the_library_computes(client, searcher, env):
    captions, truth = caption_queries(env)
    scores, _ = library_t2i_scores(env, searcher.shortlist)
    for j in range(0, len(captions), 3):
        body = client.get("/api/search", params={"q": captions[j], "k": len(searcher)}).json()
        ids = [r["id"] for r in body["results"]]
        low, high = rank_bounds(scores[:, j], truth[j])  # up to near ties (float rounding of the CPU)
        assert low <= ids.index(truth[j]) + 1 <= high, captions[j]


def test_explain_api_returns_kept_masks_and_word_heat_on_the_patch_grid(client, searcher, env):
    captions, truth = caption_queries(env)
    response = client.get("/api/explain", params={"q": captions[0], "id": truth[0]})
    assert response.status_code == 200
    body = response.json()
    assert (body["query"], body["id"], body["path"]) == (captions[0], truth[0], searcher.index.path(truth[0]))
    assert body["method"] == "seps_selection" and body["grid"] == [4, 4] and body["num_keep"] == 8
    assert [b["name"] for b in body["branches"]] == ["sparse", "dense"]
    for branch in body["branches"]:
        assert len(branch["kept"]) == 4 and all(len(row) == 4 for row in branch["kept"])
        assert sum(map(sum, branch["kept"])) == branch["kept_count"] == 8
    tokens = searcher.encode_query(captions[0])
    assert len(body["words"]) == int(tokens.lens[0])
    assert all(len(w["heat"]) == 4 and all(len(r) == 4 for r in w["heat"]) for w in body["words"])
    expected = searcher.explain(captions[0], truth[0]).to_json()
    assert body["branches"] == expected["branches"] and body["score"] == pytest.approx(
        expected["score"], abs=1e-6
    )


def test_image_api_serves_the_indexed_file_by_id(client, searcher):
    response = client.get("/api/image/0")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert response.content == (searcher.index.images_root / searcher.index.path(0)).read_bytes()
    assert response.headers["x-content-type-options"] == "nosniff"


TRAVERSALS = [
    "/api/image/../../../../etc/passwd",
    "/api/image/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "/api/image/%2e%2e/%2e%2e/manifest.json",
    "/api/image/..\\..\\manifest.json",
    "/api/image/0/../../manifest.json",
    "/api/image//etc/passwd",
    "/api/image/%2Fetc%2Fpasswd",
    "/api/image/0%00.png",
    "/static/../search/index.py",
    "/static/..%2F..%2Fruns.py",
    "/static/%2e%2e%2fapp.py",
    "/api/explain?q=dog&id=../../etc/passwd",
]


def test_path_traversal_never_reaches_a_file(client, env):
    secrets = [b"root:", b"patchword-search-index", b"import ", b"def "]
    for url in TRAVERSALS:
        response = client.get(url)
        assert 400 <= response.status_code < 500, url
        assert not any(s in response.content for s in secrets), url
    # The same raw, unnormalised request lines sent to a real server (HTTP clients clean "..").
    with live_server(create_app(Searcher(SearchIndex.open(env.index_dir), env.run))) as url:
        host, port = url.removeprefix("http://").split(":")
        for path in TRAVERSALS:
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            status = int(data.split(b" ", 2)[1])
            assert 400 <= status < 500, (path, data[:200])
            assert not any(s in data for s in secrets), path


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        ("/api/image/24", 404, "no image with id 24"),
        ("/api/image/999999999999", 404, "no image with id"),
        ("/api/image/-1", 400, "integer index id"),
        ("/api/image/1e3", 400, "integer index id"),
        ("/api/image/0x1", 400, "integer index id"),
        ("/api/explain?q=dog&id=24", 404, "no image with id 24"),
        ("/api/explain?q=dog", 400, "missing parameter 'id'"),
        ("/api/search", 400, "missing parameter 'q'"),
        ("/api/search?q=", 400, "'q' is empty"),
        ("/api/search?q=%20%20%20", 400, "'q' is empty"),
        ("/api/search?q=" + "a" * 513, 400, "longer than 512"),
        ("/api/search?q=dog&k=0", 400, "must lie in [1, 100]"),
        ("/api/search?q=dog&k=101", 400, "must lie in [1, 100]"),
        ("/api/search?q=dog&k=-3", 400, "must lie in [1, 100]"),
        ("/api/search?q=dog&k=ten", 400, "must be an integer"),
        ("/api/search?q=dog&k=1.5", 400, "must be an integer"),
        ("/api/search?q=dog&q=cat", 400, "more than once"),
        ("/api/search?q=%FF%FE", 400, "not valid UTF-8"),
        ("/api/search?q=red%C3", 400, "not valid UTF-8"),
        ("/api/explain?q=%ED%A0%80&id=0", 400, "not valid UTF-8"),  # a UTF-16 surrogate
        ("/api/search?q=%00%01", 400, "control characters"),
        ("/api/search?q=%21%21%21", 400, "no words the model can read"),
        ("/nowhere", 404, "Not Found"),
        ("/static/secret.js", 404, "not found"),
    ],
)
def test_bad_requests_get_json_4xx_with_a_message(client, url, status, message):
    assert message in _error(client.get(url), status)


def test_a_query_with_no_known_word_is_a_400_naming_the_words(client):
    """docs/search.md promised a 400; the API answered 200 with confident results for <unk>."""
    response = client.get("/api/search", params={"q": "zzzqqq xxyyzz", "k": 5})
    assert "'zzzqqq', 'xxyyzz'" in _error(response, 400)
    assert response.json()["unknown_words"] == ["zzzqqq", "xxyyzz"]
    response = client.get("/api/explain", params={"q": "zzzqqq", "id": 0})
    assert "'zzzqqq'" in _error(response, 400) and response.json()["unknown_words"] == ["zzzqqq"]


def test_a_query_with_some_unknown_words_answers_with_a_warning(client, searcher):
    response = client.get("/api/search", params={"q": "a red zzzqqq circle", "k": 5})
    assert response.status_code == 200
    body = response.json()
    expected = searcher.search("a red zzzqqq circle", k=5)
    assert [r["id"] for r in body["results"]] == [h.id for h in expected.hits]
    assert body["warning"] == expected.warning and "'zzzqqq'" in body["warning"]
    assert body["unknown_words"] == ["zzzqqq"]
    page = client.get("/").text  # the page shows the warning as a note above the results
    assert page.index('id="note"') < page.index('id="results"')
    assert "body.warning" in (STATIC / "app.js").read_text()


def test_malformed_utf8_in_the_raw_request_line(env):
    with live_server(create_app(Searcher(SearchIndex.open(env.index_dir), env.run))) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /api/search?q=\xff\xfe\xc3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert 400 <= int(data.split(b" ", 2)[1]) < 500
        with urllib.request.urlopen(f"{url}/healthz", timeout=10) as response:  # still serving
            assert json.load(response)["status"] == "ok"


def test_an_internal_error_is_a_500_and_the_server_keeps_serving(client, searcher, monkeypatch):
    def broken(query, k):
        raise RuntimeError("secret detail of the failure")

    monkeypatch.setattr(searcher, "search", broken)
    response = client.get("/api/search", params={"q": "a red circle"})
    assert "internal error" in _error(response, 500) and b"secret detail" not in response.content
    monkeypatch.undo()
    assert client.get("/api/search", params={"q": "a red circle"}).status_code == 200


def test_an_overloaded_server_answers_503_and_its_event_loop_stays_free(env):
    searcher = Searcher(SearchIndex.open(env.index_dir), env.run)
    entered, release = threading.Event(), threading.Event()
    real_search = searcher.search

    def slow_search(query, k):
        entered.set()
        release.wait(timeout=30)
        return real_search(query, k)

    searcher.search = slow_search
    app = create_app(searcher, ServeLimits(workers=1, max_pending=1))
    with live_server(app) as url:
        result = {}

        def first():
            with urllib.request.urlopen(f"{url}/api/search?q=red+circle&k=2", timeout=60) as response:
                result["body"] = json.load(response)

        thread = threading.Thread(target=first)
        thread.start()
        assert entered.wait(timeout=30)
        with pytest.raises(urllib.error.HTTPError) as busy:
            urllib.request.urlopen(f"{url}/api/search?q=blue+square", timeout=10)
        assert busy.value.code == 503 and busy.value.headers["Retry-After"] == "1"
        assert "busy" in json.load(busy.value)["error"]
        # The event loop is not blocked by the running search: health checks answer meanwhile.
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert json.load(response)["images"] == 24
        release.set()
        thread.join(timeout=60)
        assert [r["id"] for r in result["body"]["results"]] == [
            h.id for h in real_search("red circle", 2).hits
        ]


def test_the_page_is_self_contained_and_locked_down(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    html = page.text
    for element in (
        'id="q"',
        'id="results"',
        'id="words"',
        'src="/static/app.js"',
        'href="/static/style.css"',
    ):
        assert element in html
    assert "<script>" not in html  # no inline script (the CSP forbids it)
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        response = client.get(f"/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind)
        assert response.content == (STATIC / name).read_bytes()
    for path in STATIC.iterdir():  # nothing fetched from elsewhere: no CDN, no web font
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", path.read_text()), path.name
    assert "innerHTML" not in (STATIC / "app.js").read_text()


def test_missing_extra_names_the_pip_command(monkeypatch, env, capsys):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'patchword\[serve\]'"):
        require_serve_extra()
    assert main_serve([str(env.index_dir)]) == 2
    assert "pip install 'patchword[serve]'" in capsys.readouterr().err


def test_serve_cli_reports_a_missing_index(tmp_path, capsys):
    assert main_serve([str(tmp_path / "nothing")]) == 2
    assert "not a search index" in capsys.readouterr().err


def test_healthz(client):
    body = client.get("/healthz").json()
    assert body == {
        "status": "ok",
        "images": 24,
        "matcher": "seps",
        "run": "tiny",
        "shortlist": 24,
        "dense": True,
    }


def test_http_client_sees_json_errors_on_the_live_server(env):
    with live_server(create_app(Searcher(SearchIndex.open(env.index_dir), env.run))) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/api/search?q=dog&k=1000")
        response = conn.getresponse()
        assert response.status == 400 and "must lie in" in json.loads(response.read())["error"]
        conn.close()
