"""``patchword index build ...`` and ``patchword search ...``.

``main_index(argv)`` takes the arguments after ``index`` (``["build", RUN_DIR, "--images", DIR, "--out",
INDEX]``) and ``main_search(argv)`` those after ``search`` (``[INDEX, "a red circle", "-k", "5"]``); both
return an exit code (0, or 2 after printing ``error: ...`` for a user error), so tests and the top-level
``patchword`` command run them in-process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from patchword.cli import VERBOSE_HELP
from patchword.cli.argtypes import Spelled, spelling
from patchword.cli.search_flags import add_first_stage_argument, check_first_stage, shortlist_help
from patchword.cli.threads import add_threads_argument, check_threads, threads_of
from patchword.device import resolve_device
from patchword.errors import (
    USER_ERRORS,
    ConfigError,
    Interrupted,
    MissingExtraError,
    interrupt_signal,
    report_user_error,
    run_command,
)
from patchword.logs import setup_logging

__all__ = ["main_index", "main_search"]


def _logging(verbose: bool) -> None:
    setup_logging(verbose)


def _index_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="patchword index", description="build or update a search index")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser(
        "build",
        help="index the images under a folder with a trained run",
        description="Encode every image under --images (found by content, recursively) with RUN_DIR's model "
        "into INDEX_DIR. Rerunning an interrupted build resumes it; --update refreshes a complete index.",
    )
    build.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    build.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="directory written by `patchword train`")
    build.add_argument("--images", type=Path, required=True, help="folder of images to index (recursive)")
    build.add_argument("--out", type=Path, required=True, help="index directory to create or update")
    build.add_argument(
        "--update", action="store_true", help="encode new and changed files, drop deleted ones"
    )
    # one way to name the storage: --fp16 with --store X would silently override X
    storage = build.add_mutually_exclusive_group()
    storage.add_argument(
        "--store",
        choices=("float32", "float16", "int8", "pq"),
        help="how token vectors are stored: float32 (default), float16 (1/2 the size), int8 with a per-token "
        "scale (~1/4), pq: product-quantised, C/8 bytes per token up to 64 (~1/32 of float32; --pq-bytes; "
        "trains on the first shard)",
    )
    storage.add_argument("--fp16", action="store_true", help="the same as --store float16")
    build.add_argument(
        "--pq-bytes",
        type=int,
        help="--store pq: bytes per token (sub-quantisers of 256 centroids; must divide the token width; "
        "default one per 8 dimensions, at most 64): more bytes, less error",
    )
    build.add_argument(
        "--dense",
        type=Path,
        help="dense captions (SEPS JSONL, metadata.file = image path relative to --images) for matchers "
        "that read them",
    )
    build.add_argument(
        "--dense-store",
        choices=("tokens", "scores"),
        help="what the index keeps of the dense captions: tokens (default), or scores: the per-image score "
        "they give, computed once here (exact for SEPS as released, whose dense branch depends on the image "
        "alone; smaller and faster to search; no dense branch in explanations)",
    )
    build.add_argument(
        "--keep-patches",
        type=float,
        metavar="FRACTION",
        help="SEPS / LAPS: store only this fraction of each image's patches, those with the highest "
        "image-only selection score (an approximation with a measured recall cost: docs/search.md; "
        "smaller and faster to search; default: every patch)",
    )
    build.add_argument("--batch-size", type=int, default=64, help="images per encoder batch (default 64)")
    build.add_argument("--shard-size", type=int, default=2048, help="images per shard (default 2048)")
    build.add_argument(
        "--decode-workers",
        dest="workers",
        type=int,
        default=None,
        metavar="N",
        action=Spelled,
        help="threads decoding image files (default min(4, CPUs)); formerly --workers, which still works: "
        "`serve --workers` is its model threads",
    )
    build.add_argument(
        "--workers", dest="workers", type=int, default=None, action=Spelled, help=argparse.SUPPRESS
    )
    add_threads_argument(build)
    build.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    build.add_argument("--checkpoint", default=None, help="checkpoint inside RUN_DIR (default best.pt)")
    build.add_argument(
        "--qdrant",
        metavar="PATH_OR_URL",
        help="also upload the index to Qdrant: a server / cluster URL, or a local directory (embedded mode)",
    )
    build.add_argument("--collection", default=None, help="the Qdrant collection (default: the --out name)")
    build.add_argument(
        "--replace-collection",
        action="store_true",
        help="with --qdrant: replace the collection even when another index holds it (that index's "
        "searches are then refused until it is uploaded again)",
    )
    return parser


def main_index(argv: list[str] | None = None) -> int:
    """``patchword index build RUN_DIR --images DIR --out INDEX_DIR [--update] [--fp16] ...``."""
    args = _index_parser().parse_args(argv)
    _logging(args.verbose)

    ended = False  # the build and its upload (if any)

    def build() -> None:
        nonlocal ended
        _check_qdrant_flags(args)
        plan = _plan(args)  # every flag and file checked, the run loaded: nothing written yet
        client = None
        if args.qdrant:
            from patchword.search.qdrant import open_for_upload

            # Opened after the checks (a refused flag leaves no embedded store directory, and is what the
            # command reports rather than a connection problem) and before the index is touched, held
            # until the upload: a store another process holds (a `serve --qdrant`) or a server out of reach
            # refuses the command with the index as it was, never after an update whose manifest the
            # collection no longer matches (its servers would answer 503 until the upload is rerun).
            collection = args.collection or args.out.name
            client = open_for_upload(
                args.out, args.qdrant, collection, manifest=plan.manifest, replace=args.replace_collection
            )
        try:
            _build_and_upload(args, plan, client)
            ended = True
        finally:
            if client is not None:
                client.close()  # an embedded store admits one client: let the next command open it

    def build_with_threads() -> None:
        _check_counts(args)  # before the count is set, as before anything is read
        from patchword.search.build_open import out_stamps, stopped_message

        before = out_stamps(args.out)
        try:
            with threads_of(args):  # the run's loading too
                build()
        except KeyboardInterrupt as err:  # a Ctrl-C, or SIGTERM (errors.Terminated)
            # nothing a rerun would resume (none written, or the index complete): not "rerun to resume"
            upload = "" if ended or not args.qdrant else "the same command with --update uploads it to Qdrant"
            message = stopped_message(args.out, before, upload)
            if message is not None:
                signum, name = interrupt_signal(err)
                raise Interrupted(signum, f"{name} {message}") from None
            raise

    # finished shards are kept (each written atomically, then the manifest): the same command resumes
    return run_command(build_with_threads, args.verbose, f"rerun the same command to resume {args.out}")


def _check_counts(args: argparse.Namespace) -> None:
    """``--threads`` and ``--decode-workers`` (or its old spelling ``--workers``), each error naming the
    spelling given, before anything is read.

    Raises:
        ConfigError: ``--threads`` < 1 or ``--decode-workers`` < 0.
    """
    from patchword.search.build_checks import check_workers

    check_threads(args)
    check_workers(args.workers, spelling(args, "workers", "--decode-workers"))


def _check_qdrant_flags(args: argparse.Namespace) -> None:
    """The upload's flags before the run loads: ``--collection`` / ``--replace-collection`` need
    ``--qdrant``, which holds dense tokens and every patch; the extra installed; ``--qdrant DIR`` (an
    embedded store, created when missing) not a file in its place or in one of its parents', nor a
    read-only or vanished location (a raw ``[Errno 20] Not a directory`` naming no flag after the model
    had loaded)."""
    from patchword.fileio import check_output_dir

    for flag, given in (
        ("--collection", args.collection is not None),
        ("--replace-collection", args.replace_collection),
    ):
        if given and not args.qdrant:
            raise ConfigError(flag, "applies to the Qdrant upload: give --qdrant too")
    if not args.qdrant:
        return
    if args.dense_store == "scores":
        raise ConfigError("--dense-store", "the Qdrant backend holds dense tokens: use --dense-store tokens")
    if args.keep_patches is not None:
        raise ConfigError("--keep-patches", "the Qdrant backend holds every patch: leave it out")
    from patchword.search.qdrant import _client_module
    from patchword.search.qdrant_connect import is_local

    try:
        _client_module()
    except MissingExtraError as err:
        raise MissingExtraError(f"--qdrant: {err}") from None
    if is_local(args.qdrant):
        check_output_dir(
            Path(args.qdrant).expanduser(), "--qdrant", what="the embedded Qdrant store's directory"
        )


def _plan(args: argparse.Namespace):
    """The :class:`~patchword.search.build_plan.BuildPlan` of the build ``args`` ask for: every check of
    :func:`~patchword.search.index.build_index` done, nothing written."""
    from patchword.search.index import plan_build

    return plan_build(
        args.run_dir,
        args.images,
        args.out,
        update=args.update,
        dtype="float16" if args.fp16 else args.store,
        dense=args.dense,
        dense_store=args.dense_store,
        pq_bytes=args.pq_bytes,
        keep_patches=args.keep_patches,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        workers=args.workers,
        device=resolve_device(args.device, key="--device"),
        checkpoint=args.checkpoint,
    )


def _build_and_upload(args: argparse.Namespace, plan, client) -> None:
    """Write the build ``plan`` (:func:`_plan`), then upload it with ``client`` (``--qdrant``: opened by
    :func:`~patchword.search.qdrant.open_for_upload`; None: no upload)."""
    from patchword.search.index import write_build

    report = write_build(plan)
    print(report.summary())
    if client is not None:
        from patchword.search.qdrant import upload_index

        collection = args.collection or args.out.name
        record = upload_index(
            args.out, args.qdrant, collection, client=client, replace=args.replace_collection
        )
        print(
            f"uploaded {record['points']} images to Qdrant collection {record['collection']!r} "
            f"({record['written']} points written)"
        )


def _search_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patchword search", description="search an index: global shortlist, then fine re-ranking"
    )
    parser.add_argument(
        "index_dir", type=Path, metavar="INDEX_DIR", help="directory written by `index build`"
    )
    parser.add_argument("query", help="the text to search for")
    parser.add_argument("-k", "--k", type=int, default=10, help="results to print (default 10)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (the /api/search body)")
    parser.add_argument("--shortlist", type=int, default=None, help=shortlist_help())
    parser.add_argument(
        "--run", type=Path, default=None, help="run directory (default: the one that built it)"
    )
    parser.add_argument("--checkpoint", default=None, help="checkpoint inside the run (default: the index's)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
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
    add_threads_argument(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


def open_searcher(args: argparse.Namespace):
    """The :class:`~patchword.search.query.Searcher` of ``search`` / ``serve`` arguments (``index_dir``,
    ``run``, ``checkpoint``, ``device``, ``shortlist``, ``first_stage``, and when given ``qdrant``,
    ``exact``)."""
    from patchword.search.query import Searcher

    return Searcher.open(
        args.index_dir,
        run_dir=args.run,
        checkpoint=args.checkpoint,
        device=resolve_device(args.device, key="--device"),
        shortlist=args.shortlist,
        qdrant=bool(getattr(args, "qdrant", False)),
        exact=bool(getattr(args, "exact", False)),
        backend=args.first_stage,
    )


def main_search(argv: list[str] | None = None) -> int:
    """``patchword search INDEX_DIR "query" [-k 10] [--json]``: prints rank, score, path and latency, and a
    ``warning:`` line on stderr naming the query words the model does not know (a query with no known word
    or with control characters is an error, exit code 2). A ``note:`` line under the results says how the
    search departs from the exact float32 one (token store, pruning, approximate first stage: ``--qdrant
    --exact`` makes a Qdrant server's exact); ``--json`` has it as ``"index"``
    (:func:`patchword.search.fidelity.describe_index`: the search's kind, the index's ``warnings`` and a
    one-line ``summary``)."""
    args = _search_parser().parse_args(argv)
    _logging(args.verbose)
    from patchword.search.results import check_query_text

    try:
        if args.k < 1:
            raise ValueError(f"-k must be positive, got {args.k}")
        if args.shortlist is not None and args.shortlist < 1:
            raise ConfigError("--shortlist", f"must be >= 1, got {args.shortlist}")
        check_threads(args)
        check_first_stage(args)
        check_query_text(args.query)  # before the model loads (the search checks it again)
        with threads_of(args):
            searcher = open_searcher(args)
            result = searcher.search(args.query, k=args.k)
    except USER_ERRORS as err:
        return report_user_error(err, args.verbose)
    if result.warning:
        print(f"warning: {result.warning}", file=sys.stderr)
    from patchword.search.fidelity import approximation_note

    if args.json:  # the /api/search body (version: which image every id names), the index's size, timings
        from patchword.search.manifest import rows_digest

        body = result.to_json()
        body["index"] = searcher.index_info
        body["version"] = rows_digest(searcher.index.manifest)
        body["images"] = len(searcher)
        body["timings_ms"] = {key: round(1000 * value, 3) for key, value in result.timings.items()}
        print(json.dumps(body, indent=2, ensure_ascii=False, allow_nan=False))  # NaN is not JSON
        return 0
    width = max((len(str(h.rank)) for h in result.hits), default=1)
    print(f"{'#':>{width}}  {'score':>8}  {'global':>8}  path")
    from patchword.search.scan import printable

    for hit in result.hits:  # a path with a newline or escape sequence printed escaped (--json: exactly)
        print(f"{hit.rank:>{width}}  {hit.score:8.4f}  {hit.global_score:8.4f}  {printable(hit.path)}")
    t = result.timings
    print(
        f"{len(result.hits)} results in {1000 * t['total']:.1f} ms (encode {1000 * t['encode']:.1f} ms, "
        f"shortlist {1000 * t['shortlist']:.1f} ms, re-rank of {result.shortlist} of {len(searcher)} images "
        f"{1000 * t['rerank']:.1f} ms)"
    )
    note = approximation_note(searcher.kind)
    if note:
        print(f"note: {note}")
    return 0
