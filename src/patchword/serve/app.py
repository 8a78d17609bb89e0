"""The search server: a FastAPI app over one loaded index (``patchword serve``).

Routes (all JSON errors are ``{"error": message}`` with a 4xx / 5xx status):

- ``GET /api/search?q=...&k=...`` -> ``{"query", "results": [{"id", "path", "score", "global_score"}],
  "ms", "shortlist", "index", "version"}`` (``version``: the index version the ids belong to, as ``/healthz``
  says it; ``index``: how the search departs from the exact one and the index's warnings, as in
  ``/healthz``: :func:`~patchword.search.fidelity.describe_index`, the run and index named by their folder
  names; the page shows its ``summary`` above the results;
  ``shortlist``: the images re-ranked, ``--shortlist`` or ``k`` when that is more), paths relative to the
  indexed folder, plus ``"warning"`` and ``"unknown_words"`` when some query words are unknown to the model;
  a query with no known word is a 400 whose body adds ``"unknown_words"``; ``k`` defaults to 10, or
  ``max_k`` when that is lower;
- ``GET /api/explain?q=...&id=...[&version=...]`` -> the kept patches per selection branch and each word's
  heat over the patch grid (:meth:`patchword.search.explain.Explanation.to_json`) plus ``id``, ``path``,
  ``query``, ``version``;
- ``GET /api/image/{id}[?version=...]``: the image file of index id ``id`` (ids only: a path never reaches the
  file system); formats browsers do not show (TIFF, PPM...) are sent as PNG; ``Cache-Control: no-cache``
  with an ``ETag`` (the file's path, size and mtime), ``If-None-Match`` answered with ``304``
  (:mod:`.images`);
- ``version`` (explain, image): the ``version`` of the search the id came from; an index updated since
  (ids name other images) is a ``409`` saying to search again, whose body gives the current ``version``,
  never another image's answer;
- ``GET /healthz``: liveness, what is served (the index's version, images and kind, its warnings) and the
  page's settings (``max_k``, ``default_k``, ``max_query_chars``); ``GET /`` and
  ``/static/{app.js,style.css}``: the page; ``GET /favicon.ico``: 204 (no icon).

The index is reopened when it changes on disk (an update): :mod:`.reload`. Parameters: :mod:`.params`.

Every route answers ``HEAD`` as it answers ``GET``; JSON answers (``/api/*``, ``/healthz``) are
``Cache-Control: no-store``.

Robustness: parameters are parsed from the raw query string with strict UTF-8 and explicit bounds
(query length, ``k``); a parameter the endpoint does not take, or one given twice, is a 400 naming it,
and a query holding control characters is refused; model work (encoding,
re-ranking, explaining) and file reads run in a bounded thread pool, so the event loop only parses and
answers; requests beyond ``max_pending`` waiting for the pool get ``503`` at once instead of queueing
without limit; any exception in a request is answered with ``500`` and logged, and the server goes on (an
index whose vectors give non-finite scores: a ``500`` saying so, logged in one line; a shard file cut short
in place under the server: a ``503``, and the next request reopens the index, a ``503`` until it opens).

(No ``from __future__ import annotations`` here: FastAPI reads the route signatures' annotations, and the
FastAPI names are imported inside :func:`create_app` so that this module imports without the extra.)
"""

import asyncio
import concurrent.futures
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

from patchword.errors import MissingExtraError
from patchword.search.query import Searcher
from patchword.search.results import QueryError
from patchword.search.store import DamagedIndexError, StaleIndexError
from patchword.serve.images import BROWSER_FORMATS, image_bytes
from patchword.serve.params import ID, BadRequest, QueryParams
from patchword.serve.reload import IndexUnavailable, ServedIndex

__all__ = ["ServeLimits", "create_app", "require_serve_extra", "BROWSER_FORMATS"]

logger = logging.getLogger(__name__)
_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; script-src 'self'; style-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
#: Results of ``/api/search`` without ``k`` (at most ``max_k``).
DEFAULT_K = 10


def require_serve_extra() -> None:
    """Raise :class:`MissingExtraError` naming the pip extra when FastAPI or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise MissingExtraError(
            f"`patchword serve` needs FastAPI and uvicorn ({err.name or err} is missing): "
            "pip install 'patchword[serve]'"
        ) from err


class ServeLimits:
    """Bounds on requests and model work.

    Args:
        max_query_chars: longest query accepted (characters, after stripping).
        max_k: largest ``k``.
        workers: threads doing model work and file reads.
        max_pending: requests admitted to the pool at once (running or waiting); more get 503.
    """

    def __init__(
        self, max_query_chars: int = 512, max_k: int = 100, workers: int = 2, max_pending: int = 64
    ) -> None:
        given = {
            "max_query_chars": max_query_chars,
            "max_k": max_k,
            "workers": workers,
            "max_pending": max_pending,
        }
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServeLimits: {name} must be a positive int, got {value!r}")
        self.max_query_chars, self.max_k = max_query_chars, max_k
        self.workers, self.max_pending = workers, max_pending


def _static_file(name: str) -> bytes:
    return resources.files("patchword.serve").joinpath("static", name).read_bytes()


def create_app(searcher: Searcher, limits: ServeLimits | None = None):
    """The FastAPI app serving ``searcher``'s index.

    Args:
        searcher: an opened :class:`~patchword.search.query.Searcher` (reopened when its index changes on
            disk: :class:`~patchword.serve.reload.ServedIndex`).
        limits: request bounds and pool sizes (default :class:`ServeLimits`).

    Returns:
        a ``fastapi.FastAPI``; its ``state.pool`` is the worker pool (shut down on app shutdown) and
        ``state.served`` the :class:`~patchword.serve.reload.ServedIndex`.

    Raises:
        MissingExtraError: FastAPI or uvicorn is not installed.
    """
    require_serve_extra()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    limits = limits or ServeLimits()
    pool = ThreadPoolExecutor(limits.workers, thread_name_prefix="patchword-serve")
    admitted = 0
    admitted_lock = threading.Lock()
    served = ServedIndex(searcher)
    default_k = min(DEFAULT_K, limits.max_k)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="patchword search", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.pool = pool
    app.state.served = served
    app.state.limits = limits

    def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
        return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)

    async def in_pool(fn, *args) -> Any:
        """Run ``fn(*args)`` in the worker pool; 503 when ``max_pending`` requests are already admitted."""
        nonlocal admitted
        with admitted_lock:
            if admitted >= limits.max_pending:
                raise BadRequest(503, "the server is busy; retry in a moment")
            admitted += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except (RuntimeError, concurrent.futures.CancelledError) as err:
            # the pool was shut down (the server is stopping): refused, or cancelled while waiting
            if isinstance(err, RuntimeError) and "after shutdown" not in str(err):
                raise
            raise BadRequest(503, "the server is shutting down") from None
        finally:
            with admitted_lock:
                admitted -= 1

    async def guarded(handler, request: Request) -> Response:
        """Turn request errors into JSON 4xx and anything unexpected into a logged 500."""
        try:
            return await handler(request)
        except BadRequest as err:
            headers = {"Retry-After": "1"} if err.status == 503 else None
            return error(err.status, err.message, headers, **err.extra)
        except QueryError as err:
            extra = {"unknown_words": err.unknown_words} if err.unknown_words else {}
            return error(400, str(err), **extra)
        except IndexUnavailable:  # logged once by the reopen
            message = "the index changed on disk and cannot be opened as it is now (logged on the server)"
            return error(503, message, {"Retry-After": "5"})
        except StaleIndexError as err:
            # a Qdrant collection uploaded again under the opened index, or a shard file cut short in place
            # (ChangedShardError, a DamagedIndexError too: caught here first, since reopening shows it)
            logger.warning("request %s %s: %s", request.method, request.url.path, err)
            served.invalidate()
            return error(
                503, "the index changed while this request was answered; retry", {"Retry-After": "1"}
            )
        except DamagedIndexError as err:  # the operator's to repair: one line in the log, no traceback
            logger.error("request %s %s failed: %s", request.method, request.url.path, err)
            return error(500, "the search index is damaged (logged on the server)")
        except Exception:  # noqa: BLE001 - one bad request never takes the server down
            logger.exception("request %s %s failed", request.method, request.url.path)
            return error(500, "internal error (logged on the server)")

    def image_id_of(value: str) -> int:
        if not ID.fullmatch(value):
            if not (value.isascii() and value.isdigit()):
                raise BadRequest(400, "an image is addressed by its integer index id")
            if len(value) > 40:  # an id, too long to parse cheaply: past the end of any index
                raise BadRequest(404, f"no image with id {value[:40]}...")
        return int(value)  # past the end of the index: opened() answers 404, naming its size

    def opened(image_id: int | None = None, version: str | None = None) -> tuple[Searcher, str]:
        """(searcher, version) of the index as it is now (worker threads only: it may reopen the index), with
        ``version`` (a search's, where the request gives one) and then ``image_id`` checked against it."""
        current, served_version = served.current_version()  # the pair the answer is computed from
        if version is not None and version != served_version:
            # the current version with it: a client searches again knowing which ids it will get
            raise BadRequest(
                409, "the index was updated since this search: search again", version=served_version
            )
        if image_id is not None and image_id >= len(current):
            raise BadRequest(404, f"no image with id {image_id} (the index holds {len(current)})")
        return current, served_version

    def version_of(params: QueryParams) -> str | None:
        """The optional ``version`` parameter (a search's ``version``), None when absent."""
        if "version" not in params.values:
            return None
        return params.text("version", 64)

    def secured(response: Response, request: Request) -> Response:
        for key, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        if request.url.path.startswith("/api/") or request.url.path == "/healthz":
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.middleware("http")
    async def headers(request: Request, call_next):
        return secured(await call_next(request), request)

    @app.exception_handler(Exception)
    async def last_resort(request: Request, exc: Exception) -> Response:
        # An exception outside the guarded handlers is answered by Starlette's outermost middleware, past
        # the one above: its 500 gets the headers here (Starlette then re-raises it for the server's log).
        return secured(error(500, "internal error (logged on the server)"), request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail) if exc.detail else "error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, "invalid request parameters")

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            QueryParams(request.scope.get("query_string", b""), ())  # takes none: a stray one is a 400
            if served.changed_on_disk():
                # whether the index as it is now opens, as the next request would open it (on a thread of
                # its own, never behind the workers' model work): "error" when it cannot. It still answers
                # from what is loaded (200, status ok: the server is alive; searches answer 503 meanwhile)
                await asyncio.to_thread(served.probe)
            # every figure of one searcher: a reopen finishing on a worker meanwhile never mixes two
            settings = {
                "max_k": limits.max_k,
                "default_k": default_k,
                "max_query_chars": limits.max_query_chars,
            }
            body = {"status": "ok", **served.describe(), **settings}
            return JSONResponse(body)

        return await guarded(handle, request)

    @app.api_route("/api/search", methods=["GET", "HEAD"])
    async def search(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            params = QueryParams(request.scope.get("query_string", b""), ("q", "k"))
            query = params.text("q", limits.max_query_chars)
            k = params.integer("k", 1, limits.max_k, default=default_k)
            t0 = time.perf_counter()

            def searched() -> tuple[Searcher, str, Any]:
                current, version = opened()  # the results, index object and version of one index
                return current, version, current.search(query, k)

            current, version, result = await in_pool(searched)
            body = result.to_json()
            body["ms"] = round(1000.0 * (time.perf_counter() - t0), 3)
            body["index"] = current.index_info  # computed when the index was opened
            body["version"] = version  # which image every id names: explain / image check it
            return JSONResponse(body)

        return await guarded(handle, request)

    @app.api_route("/api/explain", methods=["GET", "HEAD"])
    async def explain(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            params = QueryParams(request.scope.get("query_string", b""), ("q", "id", "version"))
            query = params.text("q", limits.max_query_chars)
            asked_version = version_of(params)
            image_id = image_id_of(params.values.get("id", "").strip()) if "id" in params.values else None
            if image_id is None:
                raise BadRequest(400, "missing parameter 'id'")

            def explained() -> dict[str, Any]:
                # one version of the index for the check, the id, the scores and the path
                current, version = opened(image_id, asked_version)
                body = current.explain(query, image_id).to_json()
                body.update(query=query, id=image_id, path=current.index.path(image_id), version=version)
                return body

            return JSONResponse(await in_pool(explained))

        return await guarded(handle, request)

    @app.api_route("/api/image/{image_id}", methods=["GET", "HEAD"])
    async def image(request: Request, image_id: str) -> Response:
        async def handle(request: Request) -> Response:
            params = QueryParams(request.scope.get("query_string", b""), ("version",))
            asked_version = version_of(params)
            number = image_id_of(image_id)
            if_none_match = request.headers.get("if-none-match")

            def read() -> tuple[bytes | None, str, str]:
                # the version is checked before the ETag: a 304 never confirms a copy of another version.
                # The version is in the URL the page asks, hence in the browser's cache key too
                return image_bytes(opened(number, asked_version)[0], number, if_none_match)

            data, media_type, etag = await in_pool(read)
            headers = {"Cache-Control": "no-cache", "ETag": etag}  # kept, but revalidated: ids move
            if data is None:
                return Response(status_code=304, headers=headers)
            return Response(data, media_type=media_type, headers=headers)

        return await guarded(handle, request)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def page() -> Response:
        return Response(_static_file("index.html"), media_type=_STATIC["index.html"])

    @app.api_route("/favicon.ico", methods=["GET", "HEAD"])
    async def favicon() -> Response:
        return Response(status_code=204)  # no icon: what browsers ask for, answered without a 404

    @app.api_route("/static/{name}", methods=["GET", "HEAD"])
    async def static(name: str) -> Response:
        if name not in _STATIC or name == "index.html":
            return error(404, "not found")
        return Response(_static_file(name), media_type=_STATIC[name])

    return app
