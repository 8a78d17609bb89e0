"""The search server's security headers on every kind of response: the page, its static files, JSON
answers, images, and errors (404, 400, 405, 500, 503), those the app answers itself and those Starlette does.

What each header guards: ``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'`` keep the page out of
another site's frame (click-jacking); ``object-src 'none'`` refuses plug-in content; ``base-uri 'none'``
stops an injected ``<base>`` from redirecting the page's relative URLs; ``Referrer-Policy: no-referrer``
keeps query text out of the Referer header; ``nosniff`` keeps a browser from reading an image as a script.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request

import pytest
from fastapi.testclient import TestClient

from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from patchword.serve.app import ServeLimits, create_app
from search_support import live_server, stalled_searcher
from stall_support import HANG_GUARD_S

pytestmark = pytest.mark.usefixtures("one_thread")

#: directive -> its sources, as every response must carry them
CSP_REQUIRED = {"frame-ancestors": ["'none'"], "object-src": ["'none'"], "base-uri": ["'none'"]}


def parse_csp(value: str) -> dict[str, list[str]]:
    """``"a x y; b z"`` -> ``{"a": ["x", "y"], "b": ["z"]}`` (a repeated directive is an error here: browsers
    keep only the first, so a second one would be a policy that says something it does not do)."""
    directives: dict[str, list[str]] = {}
    for part in value.split(";"):
        words = part.split()
        if words:
            assert words[0].lower() not in directives, f"directive {words[0]} given twice in {value!r}"
            directives[words[0].lower()] = words[1:]
    return directives


def test_parse_csp_by_hand():
    assert parse_csp("default-src 'self'; img-src 'self' data: ;object-src 'none';") == {
        "default-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
    }
    with pytest.raises(AssertionError, match="given twice"):
        parse_csp("object-src 'none'; object-src *")


def assert_locked_down(headers, what: str) -> None:
    """``headers`` (any case-insensitive mapping) carry every security header with its value."""
    assert headers.get("x-frame-options") == "DENY", what
    assert headers.get("referrer-policy") == "no-referrer", what
    assert headers.get("x-content-type-options") == "nosniff", what
    csp = headers.get("content-security-policy")
    assert csp is not None, f"{what}: no Content-Security-Policy"
    directives = parse_csp(csp)
    for directive, sources in CSP_REQUIRED.items():
        assert directives.get(directive) == sources, (what, directive, csp)
    # the page runs its own files only: no inline or evaluated script anywhere
    assert directives.get("script-src") == ["'self'"] and directives.get("default-src") == ["'self'"], what


@pytest.fixture(scope="module")
def client(searcher):
    with TestClient(create_app(searcher), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(
    "method, url, status, kind",
    [
        ("GET", "/", 200, "text/html"),
        ("HEAD", "/", 200, "text/html"),
        ("GET", "/static/app.js", 200, "text/javascript"),
        ("GET", "/static/style.css", 200, "text/css"),
        ("GET", "/healthz", 200, "application/json"),
        ("GET", "/api/search?q=a+red+circle&k=3", 200, "application/json"),
        ("GET", "/api/explain?q=a+red+circle&id=0", 200, "application/json"),
        ("GET", "/api/image/0", 200, "image/png"),
        # HEAD answers as GET does, on every route (it was a 405 on all but / and /healthz)
        ("HEAD", "/api/search?q=a+red+circle&k=3", 200, "application/json"),
        ("HEAD", "/api/explain?q=a+red+circle&id=0", 200, "application/json"),
        ("HEAD", "/api/image/0", 200, "image/png"),
        ("HEAD", "/static/app.js", 200, "text/javascript"),
        ("HEAD", "/healthz", 200, "application/json"),
        ("GET", "/api/search?q=dog&top_k=3", 400, "application/json"),  # a misspelt parameter
        # errors the app answers itself...
        ("GET", "/api/search?q=", 400, "application/json"),
        ("GET", "/api/search?q=dog&k=ten", 400, "application/json"),
        ("GET", "/api/image/abc", 400, "application/json"),
        ("GET", "/api/search?q=zzzqqq", 400, "application/json"),  # no known word (QueryError)
        ("GET", "/api/image/99999", 404, "application/json"),
        ("GET", "/static/secret.js", 404, "application/json"),
        # ...and those Starlette raises before a route runs
        ("GET", "/nowhere", 404, "application/json"),
        ("POST", "/api/search?q=dog", 405, "application/json"),
        ("DELETE", "/", 405, "application/json"),
    ],
)
def test_every_response_kind_carries_the_security_headers(client, method, url, status, kind):
    response = client.request(method, url)
    assert response.status_code == status, (method, url, response.text)
    assert response.headers["content-type"].startswith(kind), (url, response.headers["content-type"])
    assert_locked_down(response.headers, f"{method} {url} ({status})")
    if status >= 400:
        assert isinstance(response.json()["error"], str)


def test_api_answers_are_not_cached_and_the_page_is_the_same_policy(client):
    page, api = client.get("/"), client.get("/api/search?q=a+red+circle")
    assert api.headers["cache-control"] == "no-store" and "cache-control" not in page.headers
    # the health check is live state too: a cached "ok" would hide a server that went down
    assert client.get("/healthz").headers["cache-control"] == "no-store"
    assert page.headers["content-security-policy"] == api.headers["content-security-policy"]


def test_an_internal_error_carries_the_security_headers(client, searcher, monkeypatch):
    def broken(query, k):
        raise RuntimeError("boom")

    monkeypatch.setattr(searcher, "search", broken)
    response = client.get("/api/search", params={"q": "a red circle"})
    assert response.status_code == 500 and "internal error" in response.json()["error"]
    assert_locked_down(response.headers, "500 from a request handler")


def test_an_error_outside_the_request_handlers_carries_the_security_headers(env):
    """An exception in a route without the handlers' guard (here the health check) reaches Starlette's
    last-resort 500, which is answered outside the app's middleware."""

    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("the manifest cannot be read")

    searcher = Searcher(SearchIndex.open(env.index_dir), env.run)
    app = create_app(searcher)
    searcher.index.manifest = Broken()
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/healthz")
    assert response.status_code == 500 and response.headers["content-type"] == "application/json"
    assert response.json() == {"error": "internal error (logged on the server)"}  # no detail leaks
    assert_locked_down(response.headers, "500 from an unguarded route")


def test_an_overloaded_server_answers_503_with_the_security_headers(env):
    searcher, entered, release = stalled_searcher(env)
    with live_server(create_app(searcher, ServeLimits(workers=1, max_pending=1))) as url:
        done = {}

        def first():
            with urllib.request.urlopen(
                f"{url}/api/search?q=red+circle&k=2", timeout=HANG_GUARD_S
            ) as response:
                done["status"] = response.status
                done["headers"] = response.headers

        thread = threading.Thread(target=first)
        thread.start()
        try:
            if not entered.wait(timeout=HANG_GUARD_S):
                pytest.fail(f"hang guard: the first search did not start in {HANG_GUARD_S:g} s")
            with pytest.raises(urllib.error.HTTPError) as busy:  # a guard, not a verdict: 503 is at once
                urllib.request.urlopen(f"{url}/api/search?q=blue+square", timeout=HANG_GUARD_S / 3)
        finally:
            release.set()
            thread.join(timeout=HANG_GUARD_S)
        if thread.is_alive():
            pytest.fail(f"hang guard: the first search did not end in {HANG_GUARD_S:g} s after its release")
        assert busy.value.code == 503 and busy.value.headers["Retry-After"] == "1"
        assert_locked_down(busy.value.headers, "503 busy")
        assert done["status"] == 200
        assert_locked_down(done["headers"], "200 over a live socket")


@pytest.mark.parametrize(
    "url, parameter, takes",
    [
        ("/api/search?q=dog&top_k=3", "top_k", "q, k"),
        ("/api/search?query=dog", "query", "q, k"),
        ("/api/explain?q=dog&id=0&k=3", "k", "q, id, version"),
    ],
)
def test_an_unknown_parameter_is_a_400_naming_it(client, url, parameter, takes):
    """Bug: ``top_k=3`` was ignored and ten results came back as if it had been understood."""
    response = client.get(url)
    assert response.status_code == 400
    assert response.json()["error"] == f"unknown parameter {parameter!r} (this endpoint takes {takes})"


def test_head_answers_with_get_headers_and_no_body(client):
    get, head = client.get("/api/search?q=a+red+circle&k=3"), client.head("/api/search?q=a+red+circle&k=3")
    assert head.status_code == get.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["cache-control"] == "no-store"
