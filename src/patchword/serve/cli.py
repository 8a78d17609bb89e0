"""``patchword serve INDEX_DIR [--host 127.0.0.1] [--port 8000]``: the search page and API with uvicorn.

``main_serve(argv)`` takes the arguments after ``serve`` and returns an exit code (2 after ``error: ...``
for a user error, such as a missing index or the ``serve`` extra not installed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from patchword.errors import USER_ERRORS, report_user_error
from patchword.logs import setup_logging

__all__ = ["main_serve"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patchword serve", description="serve a search index: a web page and a JSON API"
    )
    parser.add_argument(
        "index_dir", type=Path, metavar="INDEX_DIR", help="directory written by `index build`"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--run", type=Path, default=None, help="run directory (default: the one that built it)"
    )
    parser.add_argument("--checkpoint", default=None, help="checkpoint inside the run (default: the index's)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and error tracebacks")
    parser.add_argument("--shortlist", type=int, default=None, help="images re-ranked per query")
    parser.add_argument(
        "--qdrant", action="store_true", help="vectors from the Qdrant collection the index was uploaded to"
    )
    parser.add_argument("--workers", type=int, default=2, help="threads doing model work (default 2)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch threads (default: CPUs // workers, so concurrent requests do not oversubscribe the CPU)",
    )
    parser.add_argument("--max-pending", type=int, default=64, help="requests admitted at once; more get 503")
    parser.add_argument(
        "--max-k", type=int, default=100, help="largest k a request may ask for (default 100)"
    )
    parser.add_argument("--max-query-chars", type=int, default=512, help="longest query (default 512)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main_serve(argv: list[str] | None = None) -> int:
    """Load the index and its run, then serve until interrupted."""
    args = _parser().parse_args(argv)
    setup_logging(level=args.log_level.upper())
    try:
        from patchword.serve.app import ServeLimits, create_app, require_serve_extra

        require_serve_extra()
        import torch
        import uvicorn

        from patchword.search.cli import open_searcher

        limits = ServeLimits(args.max_query_chars, args.max_k, args.workers, args.max_pending)
        threads = args.torch_threads or max(1, (os.cpu_count() or 1) // args.workers)
        torch.set_num_threads(threads)  # the application's choice: the library never sets it
        searcher = open_searcher(args)  # (may build the IVF lists first, with every core)
        _faiss_threads(threads)
        app = create_app(searcher, limits)
    except USER_ERRORS as err:
        return report_user_error(err, args.verbose)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: listening on {args.host}: the server has no authentication and serves every indexed "
            "image to whoever can reach it",
            file=sys.stderr,
        )
    print(
        f"serving {len(searcher)} images of {args.index_dir} at http://{args.host}:{args.port}/ "
        f"({args.workers} workers x {threads} torch threads; Ctrl-C stops)",
        flush=True,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # Beyond this many open connections uvicorn answers 503 before the app sees the request.
        limit_concurrency=max(4 * args.max_pending, 256),
        timeout_keep_alive=5,
        server_header=False,
    )
    return 0


def _faiss_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the first stage: as many as torch's, for the same reason."""
    from patchword.eval.two_stage import faiss_available

    if faiss_available():
        import faiss

        faiss.omp_set_num_threads(threads)
