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

import pytest
from fastapi.testclient import TestClient

from patchword.cli.serve import main_serve
from patchword.errors import MissingExtraError
from patchword.search.manifest import rows_digest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app, require_serve_extra
from project_paths import ROOT
from search_support import caption_queries, library_t2i_scores, live_server, rank_bounds, stalled_searcher
from stall_support import HANG_GUARD_S

pytestmark = pytest.mark.usefixtures("one_thread")

STATIC = ROOT / "src" / "patchword" / "serve" / "static"

#: How long a request that the event loop answers itself (/healthz, a 503) may take while a search holds
#: the only worker: generous, and shorter than the held search's own guard (HANG_GUARD_S), so that a loop
#: blocked by that search fails here rather than answering once the search is let go.
HEALTHZ_GUARD_S = HANG_GUARD_S / 3


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
    assert (
        set(body) == {"query", "results", "ms", "shortlist", "index", "version"}
        and body["query"] == captions[3]
    )
    assert body["index"] == searcher.index_info  # what /healthz says of the index (test_healthz)
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
            with socket.create_connection((host, int(port)), timeout=HANG_GUARD_S) as sock:
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
        with socket.create_connection((host, int(port)), timeout=HANG_GUARD_S) as sock:
            sock.sendall(b"GET /api/search?q=\xff\xfe\xc3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert 400 <= int(data.split(b" ", 2)[1]) < 500
        with urllib.request.urlopen(f"{url}/healthz", timeout=HANG_GUARD_S) as response:  # still serving
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
    searcher, entered, release = stalled_searcher(env)
    app = create_app(searcher, ServeLimits(workers=1, max_pending=1))
    with live_server(app) as url:
        result = {}

        def first():
            held = f"{url}/api/search?q=red+circle&k=2"
            with urllib.request.urlopen(held, timeout=HANG_GUARD_S) as response:
                result["body"] = json.load(response)

        thread = threading.Thread(target=first)
        thread.start()
        try:
            if not entered.wait(timeout=HANG_GUARD_S):
                pytest.fail(f"hang guard: the first search did not reach the searcher in {HANG_GUARD_S:g} s")
            # Both answers come from the event loop, not the held worker: a server that makes them wait
            # for the running search answers only once it is released, at the searcher's guard
            # (HANG_GUARD_S), after HEALTHZ_GUARD_S.
            try:
                with pytest.raises(urllib.error.HTTPError) as busy:
                    urllib.request.urlopen(f"{url}/api/search?q=blue+square", timeout=HEALTHZ_GUARD_S)
            except TimeoutError:
                pytest.fail(f"a second search got no 503 in {HEALTHZ_GUARD_S:g} s: it waits for the first")
            assert busy.value.code == 503 and busy.value.headers["Retry-After"] == "1"
            assert "busy" in json.load(busy.value)["error"]
            try:  # the event loop is not blocked by the running search: health checks answer meanwhile
                with urllib.request.urlopen(f"{url}/healthz", timeout=HEALTHZ_GUARD_S) as response:
                    assert json.load(response)["images"] == 24
            except TimeoutError:
                pytest.fail(
                    f"/healthz did not answer in {HEALTHZ_GUARD_S:g} s while a search held the only "
                    "worker: it waits for that search"
                )
        finally:
            release.set()
            thread.join(timeout=HANG_GUARD_S)
        assert not thread.is_alive(), f"hang guard: the released search did not answer in {HANG_GUARD_S:g} s"
        assert [r["id"] for r in result["body"]["results"]] == [
            h.id
            for h in type(searcher).search(searcher, "red circle", 2).hits  # the unstalled search
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
    assert f"search index not found: {tmp_path / 'nothing'} does not exist" in capsys.readouterr().err


def test_healthz(client, searcher):
    body = client.get("/healthz").json()
    assert body == {
        "status": "ok",
        "images": 24,
        "version": rows_digest(searcher.index.manifest),
        "matcher": "seps",
        "run": "tiny",
        "shortlist": 24,
        "dense": True,
        "index": {
            "store": "float32",
            "pruning": None,
            "first_stage": searcher.backend,  # faiss_flat, or exact without FAISS
            "exact": True,
            "notes": [],
            "warnings": [],
            "summary": None,
        },
        "max_k": 100,
        "default_k": 10,
        "max_query_chars": 512,
    }


def test_http_client_sees_json_errors_on_the_live_server(env):
    with live_server(create_app(Searcher(SearchIndex.open(env.index_dir), env.run))) as url:
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=HANG_GUARD_S)
        conn.request("GET", "/api/search?q=dog&k=1000")
        response = conn.getresponse()
        assert response.status == 400 and "must lie in" in json.loads(response.read())["error"]
        conn.close()


# ----------------------------------------------------------------------------- flags, port, control chars
@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--port", "70000"], "error: --port: must lie in 0..65535 (0: any free port), got 70000"),
        (["--port", "-1"], "error: --port: must lie in 0..65535 (0: any free port), got -1"),
        (["--torch-threads", "-1"], "error: --torch-threads: must be >= 0 (0: CPUs // --workers), got -1"),
        (["--workers", "0"], "error: --workers: must be >= 1, got 0"),
        (["--max-pending", "0"], "error: --max-pending: must be >= 1, got 0"),
        (["--max-k", "-5"], "error: --max-k: must be >= 1, got -5"),
        (["--max-query-chars", "0"], "error: --max-query-chars: must be >= 1, got 0"),
        (["--shortlist", "0"], "error: --shortlist: must be >= 1, got 0"),
        (["--host", ""], "error: --host: is empty; give an address (0.0.0.0 listens on every interface)"),
    ],
)
def test_serve_flags_out_of_range_are_one_line_naming_the_flag_before_anything_loads(
    tmp_path, capsys, flags, line
):
    """--port 70000 ended in an OverflowError traceback, --torch-threads -1 crashed torch, and the limits
    said "serve limits must be positive" naming no flag. The index does not exist: the flag is checked
    first."""
    from conftest import one_error_line

    assert main_serve([str(tmp_path / "nothing"), *flags]) == 2
    captured = capsys.readouterr()
    assert one_error_line(captured.err) == line and captured.out == ""


def test_serve_limits_name_the_argument():
    for name in ("max_query_chars", "max_k", "workers", "max_pending"):
        with pytest.raises(ValueError, match=rf"^ServeLimits: {name} must be a positive int, got 0$"):
            ServeLimits(**{name: 0})


def _serve_argv(env, *flags: str) -> list[str]:
    # One worker thread, one torch thread: main_serve sets the process's torch threads (one_thread's count).
    return [str(env.index_dir), "--workers", "1", "--torch-threads", "1", "--log-level", "warning", *flags]


def test_a_busy_port_is_one_error_line_naming_host_and_port_and_nothing_is_announced(env, capsys):
    """The URL was printed, then uvicorn logged the bind error and exited 3."""
    from conftest import one_error_line

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main_serve(_serve_argv(env, "--port", str(port))) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert line.startswith(f"error: --port: cannot listen on 127.0.0.1:{port}: ") and "(EADDRINUSE)" in line
    assert "choose another --port" in line
    assert "serving" not in captured.out and "http://" not in captured.out + captured.err


def test_an_address_of_another_machine_is_one_error_line_naming_it(env, capsys):
    from conftest import one_error_line

    assert main_serve(_serve_argv(env, "--host", "192.0.2.1", "--port", "8123")) == 2  # TEST-NET-1
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert line.startswith("error: --host: cannot listen on 192.0.2.1:8123: ") and "(EADDRNOTAVAIL)" in line
    assert "serving" not in captured.out


def test_serve_hands_uvicorn_the_socket_it_bound_with_the_same_options(env, capsys, monkeypatch):
    """uvicorn serves on the socket bound before the announcement (no window in which the port could be
    taken), the announced URL names the port --port 0 got, and the uvicorn options are those of before."""
    import uvicorn

    seen = {}

    def fake_run(server, sockets=None):  # instead of serving forever: what uvicorn was given
        seen["config"], seen["sockets"] = server.config, sockets
        (sock,) = sockets
        host, port = sock.getsockname()[:2]
        seen["address"] = (host, port)
        with socket.create_connection((host, port), timeout=HANG_GUARD_S):  # already listening
            pass
        with socket.socket() as other, pytest.raises(OSError):  # and nobody else can have the port
            other.bind((host, port))

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    assert main_serve(_serve_argv(env, "--port", "0", "--max-pending", "100")) == 0
    host, port = seen["address"]
    assert host == "127.0.0.1" and port > 0
    out = capsys.readouterr().out
    assert f"serving 24 images of {env.index_dir} at http://127.0.0.1:{port}/ (1 workers x 1" in out
    config = seen["config"]
    assert (config.limit_concurrency, config.timeout_keep_alive, config.server_header) == (400, 5, False)
    assert config.log_level == "warning"
    assert seen["sockets"][0].fileno() == -1  # closed once uvicorn returns


CONTROL_CHARACTERS = ["%0a", "%09", "%0d", "%7f", "%00", "%1b", "%08", "%c2%85", "%c2%9b", "%c2%80"]


def test_queries_with_control_characters_are_a_400_naming_them(client, searcher):
    """docs/search.md said control characters are refused; newline, tab, CR, DEL and C1 passed (and a
    trailing newline was stripped away unseen)."""
    for raw in CONTROL_CHARACTERS:
        code = f"U+{ord(bytes.fromhex(raw.replace('%', '')).decode('utf-8')):04X}"
        for url in (
            f"/api/search?q=red{raw}circle",
            f"/api/search?q=red+circle{raw}",
            f"/api/explain?q={raw}red+circle&id=0",
        ):
            message = _error(client.get(url), 400)
            assert message.startswith("parameter 'q' contains control characters (") and code in message, url
    # Accents, CJK and other printable text still search.
    query = "a red circle café 赤い円"
    response = client.get("/api/search", params={"q": query, "k": 3})
    assert response.status_code == 200 and response.json()["query"] == query
    assert [r["id"] for r in response.json()["results"]] == [h.id for h in searcher.search(query, 3).hits]
    assert response.json()["unknown_words"] == ["café", "赤い円"]


def test_a_request_after_the_server_shut_down_is_a_503_not_a_500(searcher):
    """The worker pool is shut down with the app; a request arriving then raised "cannot schedule new
    futures after shutdown": a logged 500 instead of a 503 with Retry-After."""
    app = create_app(searcher)
    with TestClient(app) as running:
        assert running.get("/api/search", params={"q": "a red circle", "k": 1}).status_code == 200
    late = TestClient(app, raise_server_exceptions=False).get("/api/search", params={"q": "a red circle"})
    assert late.status_code == 503 and late.headers["Retry-After"] == "1"
    assert late.json() == {"error": "the server is shutting down"}
