"""The search server: a FastAPI app over one loaded index (``patchword serve``).

Routes (all JSON errors are ``{"error": message}`` with a 4xx / 5xx status):

- ``GET /api/search?q=...&k=...`` -> ``{"query", "results": [{"id", "path", "score", "global_score"}],
  "ms", "shortlist"}``, paths relative to the indexed folder, plus ``"warning"`` and ``"unknown_words"``
  when some query words are unknown to the model; a query with no known word is a 400 whose body adds
  ``"unknown_words"``; ``k`` defaults to 10, or ``max_k`` when that is lower;
- ``GET /api/explain?q=...&id=...`` -> the kept patches per selection branch and each word's heat over
  the patch grid (:meth:`patchword.search.explain.Explanation.to_json`) plus ``id``, ``path``, ``query``;
- ``GET /api/image/{id}``: the image file of index id ``id`` (ids only: a path never reaches the file
  system); formats browsers do not show (TIFF, PPM...) are sent as PNG; ``Cache-Control: no-cache`` with an
  ``ETag`` (the file's path, size and mtime), ``If-None-Match`` answered with ``304``;
- ``GET /healthz``: liveness and what is served; ``GET /`` and ``/static/{app.js,style.css}``: the page.

Every route answers ``HEAD`` as it answers ``GET``; JSON answers (``/api/*``, ``/healthz``) are
``Cache-Control: no-store``.

Robustness: parameters are parsed from the raw query string with strict UTF-8 and explicit bounds
(query length, ``k``); a parameter the endpoint does not take, or one given twice, is a 400 naming it,
and a query holding control characters is refused; model work (encoding,
re-ranking, explaining) and file reads run in a bounded thread pool, so the event loop only parses and
answers; requests beyond ``max_pending`` waiting for the pool get ``503`` at once instead of queueing
without limit; any exception in a request is answered with ``500`` and logged, and the server goes on (an
index whose vectors give non-finite scores: a ``500`` saying so, logged in one line).

(No ``from __future__ import annotations`` here: FastAPI reads the route signatures' annotations, and the
FastAPI names are imported inside :func:`create_app` so that this module imports without the extra.)
"""

import asyncio
import concurrent.futures
import hashlib
import io
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from patchword.errors import MissingExtraError
from patchword.search.query import Searcher
from patchword.search.results import QueryError, check_query_text
from patchword.search.store import DamagedIndexError

__all__ = ["ServeLimits", "create_app", "require_serve_extra", "BROWSER_FORMATS"]

logger = logging.getLogger(__name__)

#: Pillow formats sent as stored; anything else is converted to PNG on the way out.
BROWSER_FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",  # a JPEG with extra frames (phone cameras): browsers show its first, as Pillow reads
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "BMP": "image/bmp",
}
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
_ID = re.compile(r"[0-9]{1,12}")
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


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Params:
    """Query-string parameters decoded strictly (malformed UTF-8 and repeated keys are errors)."""

    def __init__(self, raw: bytes, allowed: tuple[str, ...]) -> None:
        try:
            text = raw.decode("utf-8", errors="strict")
            pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict")
        except UnicodeDecodeError as err:
            raise _BadRequest(400, "the query string is not valid UTF-8") from err
        except ValueError as err:
            raise _BadRequest(400, f"malformed query string: {err}") from err
        self.values: dict[str, str] = {}
        for key, value in pairs:
            # A misspelt parameter (``top_k=5``) must not answer as if it were not there (k=10).
            if key not in allowed:
                raise _BadRequest(
                    400, f"unknown parameter {key[:40]!r} (this endpoint takes {', '.join(allowed)})"
                )
            if key in self.values:
                raise _BadRequest(400, f"parameter {key!r} is given more than once")
            self.values[key] = value

    def text(self, key: str, max_chars: int) -> str:
        value = self.values.get(key)
        if value is None:
            raise _BadRequest(400, f"missing parameter {key!r}")
        # Before stripping: strip() would silently drop a trailing newline (and \x1c-\x1f, \x85).
        try:
            check_query_text(value, f"parameter {key!r}")
        except QueryError as err:
            raise _BadRequest(400, str(err)) from err
        value = value.strip()
        if not value:
            raise _BadRequest(400, f"parameter {key!r} is empty")
        if len(value) > max_chars:
            raise _BadRequest(400, f"parameter {key!r} is longer than {max_chars} characters")
        return value

    def integer(self, key: str, low: int, high: int, default: int | None = None) -> int:
        value = self.values.get(key)
        if value is None:
            if default is None:
                raise _BadRequest(400, f"missing parameter {key!r}")
            return default
        if not _ID.fullmatch(value.strip()) and not re.fullmatch(r"-[0-9]{1,12}", value.strip()):
            raise _BadRequest(400, f"parameter {key!r} must be an integer, got {value[:40]!r}")
        number = int(value)
        if not low <= number <= high:
            raise _BadRequest(400, f"parameter {key!r} must lie in [{low}, {high}], got {number}")
        return number


def _etag_matches(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (weak comparison, as RFC 9110 asks of it)."""
    if header is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags


def _image_bytes(
    searcher: Searcher, image_id: int, if_none_match: str | None = None
) -> tuple[bytes | None, str, str]:
    """The file of ``image_id`` as (bytes, media type, ETag), bytes None when ``if_none_match`` names the
    ETag (the client's copy is current: nothing is read). Only paths recorded in the index are read, and
    only inside the indexed folder (a symbolic link swapped in later cannot lead outside).

    The ETag is the image's path, size and mtime: an index id names another image after an update (and the
    server's restart), so a browser revalidates what it cached under an id rather than keep it for a time."""
    index = searcher.index
    entry = index.entries[image_id]
    root = index.images_root.resolve()
    path = (root / entry.path).resolve()
    try:
        path.relative_to(root)
    except ValueError as err:
        raise _BadRequest(404, f"image {image_id} is no longer inside the indexed folder") from err
    if not path.is_file():
        raise _BadRequest(404, f"the file of image {image_id} no longer exists")
    stat = path.stat()
    version = f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode("utf-8", "surrogateescape")
    etag = f'"{hashlib.sha256(version).hexdigest()[:32]}"'
    media_type = BROWSER_FORMATS.get(entry.format, "image/png")
    if _etag_matches(if_none_match, etag):
        return None, media_type, etag
    data = path.read_bytes()
    if entry.format in BROWSER_FORMATS:
        return data, media_type, etag
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        out = io.BytesIO()
        image.convert("RGB").save(out, format="PNG")
    return out.getvalue(), media_type, etag


def _static_file(name: str) -> bytes:
    return resources.files("patchword.serve").joinpath("static", name).read_bytes()


def create_app(searcher: Searcher, limits: ServeLimits | None = None):
    """The FastAPI app serving ``searcher``'s index.

    Args:
        searcher: an opened :class:`~patchword.search.query.Searcher`.
        limits: request bounds and pool sizes (default :class:`ServeLimits`).

    Returns:
        a ``fastapi.FastAPI``; its ``state.pool`` is the worker pool (shut down on app shutdown).

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
    num_images = len(searcher)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="patchword search", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.pool = pool
    app.state.searcher = searcher
    app.state.limits = limits

    def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
        return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)

    async def in_pool(fn, *args) -> Any:
        """Run ``fn(*args)`` in the worker pool; 503 when ``max_pending`` requests are already admitted."""
        nonlocal admitted
        with admitted_lock:
            if admitted >= limits.max_pending:
                raise _BadRequest(503, "the server is busy; retry in a moment")
            admitted += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except (RuntimeError, concurrent.futures.CancelledError) as err:
            # the pool was shut down (the server is stopping): refused, or cancelled while waiting
            if isinstance(err, RuntimeError) and "after shutdown" not in str(err):
                raise
            raise _BadRequest(503, "the server is shutting down") from None
        finally:
            with admitted_lock:
                admitted -= 1

    async def guarded(handler, request: Request) -> Response:
        """Turn request errors into JSON 4xx and anything unexpected into a logged 500."""
        try:
            return await handler(request)
        except _BadRequest as err:
            headers = {"Retry-After": "1"} if err.status == 503 else None
            return error(err.status, err.message, headers)
        except QueryError as err:
            extra = {"unknown_words": err.unknown_words} if err.unknown_words else {}
            return error(400, str(err), **extra)
        except DamagedIndexError as err:  # the operator's to repair: one line in the log, no traceback
            logger.error("request %s %s failed: %s", request.method, request.url.path, err)
            return error(500, "the search index is damaged (logged on the server)")
        except Exception:  # noqa: BLE001 - one bad request never takes the server down
            logger.exception("request %s %s failed", request.method, request.url.path)
            return error(500, "internal error (logged on the server)")

    def image_id_of(value: str) -> int:
        if not _ID.fullmatch(value):
            raise _BadRequest(400, "an image is addressed by its integer index id")
        number = int(value)
        if number >= num_images:
            raise _BadRequest(404, f"no image with id {number} (the index holds {num_images})")
        return number

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
    async def healthz() -> dict[str, Any]:
        manifest = searcher.index.manifest
        return {
            "status": "ok",
            "images": num_images,
            "matcher": manifest.model.get("matcher"),
            "run": Path(manifest.model.get("run_dir", "")).name,
            "shortlist": searcher.shortlist,
            "dense": searcher.use_dense,
        }

    @app.api_route("/api/search", methods=["GET", "HEAD"])
    async def search(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            params = _Params(request.scope.get("query_string", b""), ("q", "k"))
            query = params.text("q", limits.max_query_chars)
            k = params.integer("k", 1, limits.max_k, default=min(DEFAULT_K, limits.max_k))
            t0 = time.perf_counter()
            result = await in_pool(searcher.search, query, k)
            body = result.to_json()
            body["ms"] = round(1000.0 * (time.perf_counter() - t0), 3)
            return JSONResponse(body)

        return await guarded(handle, request)

    @app.api_route("/api/explain", methods=["GET", "HEAD"])
    async def explain(request: Request) -> Response:
        async def handle(request: Request) -> Response:
            params = _Params(request.scope.get("query_string", b""), ("q", "id"))
            query = params.text("q", limits.max_query_chars)
            image_id = image_id_of(params.values.get("id", "").strip()) if "id" in params.values else None
            if image_id is None:
                raise _BadRequest(400, "missing parameter 'id'")
            explanation = await in_pool(searcher.explain, query, image_id)
            body = explanation.to_json()
            body.update(query=query, id=image_id, path=searcher.index.path(image_id))
            return JSONResponse(body)

        return await guarded(handle, request)

    @app.api_route("/api/image/{image_id}", methods=["GET", "HEAD"])
    async def image(request: Request, image_id: str) -> Response:
        async def handle(request: Request) -> Response:
            number = image_id_of(image_id)
            if_none_match = request.headers.get("if-none-match")
            data, media_type, etag = await in_pool(_image_bytes, searcher, number, if_none_match)
            headers = {"Cache-Control": "no-cache", "ETag": etag}  # kept, but revalidated: ids move
            if data is None:
                return Response(status_code=304, headers=headers)
            return Response(data, media_type=media_type, headers=headers)

        return await guarded(handle, request)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def page() -> Response:
        return Response(_static_file("index.html"), media_type=_STATIC["index.html"])

    @app.api_route("/static/{name}", methods=["GET", "HEAD"])
    async def static(name: str) -> Response:
        if name not in _STATIC or name == "index.html":
            return error(404, "not found")
        return Response(_static_file(name), media_type=_STATIC[name])

    return app
