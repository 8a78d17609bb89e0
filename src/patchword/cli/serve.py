"""``patchword serve INDEX_DIR [--host 127.0.0.1] [--port 8000]``: the search page and API with uvicorn.

``main_serve(argv)`` takes the arguments after ``serve`` and returns an exit code (2 after one ``error: ...``
line for a user error, such as a flag out of range, a missing index, the ``serve`` extra not installed or
a port already in use).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from patchword.cli import VERBOSE_HELP
from patchword.cli.search_flags import add_first_stage_argument, check_first_stage, shortlist_help
from patchword.cli.threads import add_threads_argument, check_threads
from patchword.errors import ConfigError, Terminated, describe_os_error, run_command
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
    parser.add_argument("-v", "--verbose", action="store_true", help=f"{VERBOSE_HELP} (as --log-level debug)")
    parser.add_argument("--shortlist", type=int, default=None, help=shortlist_help())
    parser.add_argument(
        "--qdrant", action="store_true", help="vectors from the Qdrant collection the index was uploaded to"
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="with --qdrant: an exact first stage, a Qdrant server scanning every point rather than its HNSW "
        "index (slower on a large collection); an embedded store always searches exactly",
    )
    add_first_stage_argument(parser)
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="threads doing model work, each answering one request at a time (default 2; not index "
        "build's --decode-workers)",
    )
    add_threads_argument(  # --torch-threads: its former spelling, kept working
        parser,
        default=0,
        help="torch intra-op CPU threads (default 0: CPUs // --workers, so that concurrent "
        "requests do not oversubscribe the CPU)",
        alias="--torch-threads",
    )
    parser.add_argument(
        "--max-pending", type=int, default=64, help="requests admitted at once; more get 503 (default 64)"
    )
    parser.add_argument(
        "--max-k", type=int, default=100, help="largest k a request may ask for (default 100)"
    )
    parser.add_argument("--max-query-chars", type=int, default=512, help="longest query (default 512)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines shown, patchword's and the web server's (default %(default)s; "
        "-v: debug)",
    )
    return parser


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse the flag values that cannot work, each error naming its flag, before anything is loaded.

    Raises:
        ConfigError: ``--host`` empty, ``--port`` outside 0..65535, ``--threads`` negative, or
            ``--workers`` / ``--max-pending`` / ``--max-k`` / ``--max-query-chars`` / ``--shortlist`` < 1,
            ``--first-stage`` with ``--qdrant``.
        MissingExtraError: a FAISS ``--first-stage`` without FAISS.
    """
    if not args.host.strip():
        # An empty host would bind every interface: that must be asked for by name (0.0.0.0 or ::).
        raise ConfigError("--host", "is empty; give an address (0.0.0.0 listens on every interface)")
    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", f"must lie in 0..65535 (0: any free port), got {args.port}")
    check_threads(args, 0, "0: CPUs // --workers")  # names --torch-threads where that spelling was given
    for flag in ("--workers", "--max-pending", "--max-k", "--max-query-chars", "--shortlist"):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and value < 1:
            raise ConfigError(flag, f"must be >= 1, got {value}")
    check_first_stage(args)


def _address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets (``[::1]:8000``) as in a URL."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, for uvicorn to serve on.

    Binding here, before the ``serving ...`` line, makes a busy port one error line instead of an announced
    URL followed by uvicorn's exit 3; and since uvicorn serves on this very socket, nothing can take the
    port between the check and the serving.

    Raises:
        ConfigError: ``host`` does not resolve or is not an address of this machine (``--host``), or the
            port is taken or privileged (``--port``); the message names ``host:port`` and the reason.
    """
    where = _address(host, port)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as err:  # socket.gaierror: a name that does not resolve
        raise ConfigError("--host", f"cannot listen on {where}: {describe_os_error(err)}") from err
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn binds: a restarted server gets its port back while old connections are in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        # Listening now, not when uvicorn starts: on Linux two SO_REUSEADDR sockets may both bind a port
        # nobody listens on yet, and only the second listen() fails (uvicorn listens again, harmlessly).
        sock.listen()
    except OSError as err:
        sock.close()
        flag = "--host" if err.errno == errno.EADDRNOTAVAIL else "--port"
        hint = "; another program listens there: stop it or choose another --port"
        hint = hint if err.errno == errno.EADDRINUSE else ""
        raise ConfigError(flag, f"cannot listen on {where}: {describe_os_error(err)}{hint}") from err
    return sock


def main_serve(argv: list[str] | None = None) -> int:
    """Check the flags, load the index and its run, bind the port, then serve until interrupted."""
    args = _parser().parse_args(argv)
    if args.verbose:  # -v is debug logging, whatever --log-level says (uvicorn's too)
        args.log_level = "debug"
    setup_logging(level=args.log_level.upper())
    return run_command(lambda: _serve(args), args.verbose)


def _serve(args: argparse.Namespace) -> int:
    """``serve`` itself; user and operating-system errors propagate to :func:`run_command`."""
    _check_flags(args)
    from patchword.serve.app import ServeLimits, create_app, require_serve_extra

    require_serve_extra()
    import torch
    import uvicorn

    from patchword.cli.search import open_searcher

    limits = ServeLimits(args.max_query_chars, args.max_k, args.workers, args.max_pending)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    torch.set_num_threads(threads)  # the application's choice: the library never sets it
    searcher = open_searcher(args)  # (may build the IVF lists first, with every core)
    _faiss_threads(threads)
    app = create_app(searcher, limits)
    sock = _listen(args.host, args.port)
    try:
        port = sock.getsockname()[1]  # the port the system chose for --port 0
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"warning: listening on {args.host}: the server has no authentication and serves every "
                "indexed image to whoever can reach it",
                file=sys.stderr,
            )
        print(
            f"serving {len(searcher)} images of {args.index_dir} at http://{_address(args.host, port)}/ "
            f"({args.workers} workers x {threads} torch threads; Ctrl-C stops)",
            flush=True,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=port,
            log_level=args.log_level,
            # Beyond this many open connections uvicorn answers 503 before the app sees the request.
            limit_concurrency=max(4 * args.max_pending, 256),
            timeout_keep_alive=5,
            server_header=False,
        )
        # uvicorn shuts down gracefully on a signal, then raises it again. Ctrl-C is how a server is
        # stopped: it exits 0, as uvicorn.run does. SIGTERM (a service manager's stop) meets patchword's
        # handler (errors.Terminated): 143 without an `interrupted:` line, and the process ends by SIGTERM
        # (cli.console_main), as it did by uvicorn's raise before, which systemd takes for a clean stop.
        try:
            uvicorn.Server(config).run(sockets=[sock])
        except Terminated:
            return 128 + Terminated.signum
        except KeyboardInterrupt:
            pass
    finally:
        sock.close()
    return 0


def _faiss_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the first stage: as many as torch's, for the same reason."""
    from patchword.eval.two_stage import faiss_available

    if faiss_available():
        import faiss

        faiss.omp_set_num_threads(threads)
