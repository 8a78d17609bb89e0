"""``patchword hash search``: its arguments, the query features, the cached database index and the results.

The ``search`` sub-command of :mod:`patchword.cli.hash` (which builds the parser and dispatches to
:func:`run_search`): a Hamming search of a trained run's retrieval set with query features, the database
codes cached in the run directory as ``index_{modality}.npz`` with a fingerprint of what they were built from.
``data.*`` overrides say where the run's data lie now (``data.image=NEW.npy``), with the checks ``hash eval``
makes of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from patchword.cli.threads import add_threads_argument
from patchword.errors import ConfigError, DataError, PatchwordError
from patchword.fileio import atomic_write_text, check_output_file

__all__ = ["add_search_parser", "run_search"]

_logger = logging.getLogger(__name__)


def add_search_parser(sub, common: argparse.ArgumentParser) -> None:
    """The ``search`` sub-command's parser, added to ``sub`` (``hash``'s sub-parsers) with ``common``'s
    arguments (``-v``)."""
    se = sub.add_parser(
        "search", help="Hamming search of the run's retrieval set with query features", parents=[common]
    )
    se.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="directory written by `patchword hash train`"
    )
    se.add_argument(
        "--modality",
        choices=["image", "text"],
        required=True,
        help="modality of the queries; the database is the other modality",
    )
    src = se.add_mutually_exclusive_group(required=True)
    src.add_argument("--query", type=Path, help="(N, d) query features .npy")
    src.add_argument(
        "--query-index",
        dest="query_index",
        type=_row,
        nargs="+",
        help="rows of the run's query split to use as queries",
    )
    se.add_argument("-k", "--k", type=int, default=10, help="neighbours per query (default 10)")
    se.add_argument(
        "--backend",
        choices=["numpy", "faiss"],
        default="numpy",
        help="Hamming search implementation (default numpy; faiss: pip install 'patchword[ann]')",
    )
    se.add_argument(
        "--rebuild", action="store_true", help="re-encode the database even if its index is cached"
    )
    se.add_argument(
        "--out",
        type=Path,
        help="also write the results JSON here (stdout gets it either way, as in `hash eval`; `written: "
        "FILE` goes to stderr; '-': stdout only)",
    )
    se.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    add_threads_argument(se)  # applied by patchword.cli.hash, around run_search
    se.add_argument(
        "overrides",
        nargs="*",
        help="data.* overrides, where the run's data lie now, e.g. data.image=NEW.npy (as hash eval takes)",
    )


def _row(text: str) -> int:
    """A ``--query-index`` row; an override there was taken for one (argparse's nargs='+' is greedy)."""
    try:
        return int(text)
    except ValueError:
        hint = ": give key=value overrides before --query-index" if "=" in text else ""
        raise argparse.ArgumentTypeError(f"invalid row number: {text!r}{hint}") from None


def _refuse_overrides(overrides: list[str]) -> None:
    """Before anything is read: hash search takes the ``data.*`` overrides alone (an unknown key is named as
    ``hash eval`` names it; one no trained run may change, with what hash search takes).

    Raises:
        ConfigError: naming the key.
    """
    from patchword.hashing.config import override_keys
    from patchword.hashing.rundir import refuse_trained_run_overrides

    where = "(where the run's data lie now)"
    refuse_trained_run_overrides(overrides, takes=f"data.* {where}")
    for key in sorted(override_keys(overrides)):
        if not key.startswith("data."):
            raise ConfigError(key, f"hash search takes data.* overrides only {where}")


def _run_check(backend: str, overrides: list[str]):
    """The check of the run's config (with ``overrides``), made once config.yaml is read (before the data):
    a data source key the overrides set is one the run's format reads (as ``hash eval`` checks), and the
    faiss index of ``--backend`` holds whole bytes."""
    from patchword.hashing.config import check_data_source

    def check(cfg) -> None:
        check_data_source(cfg.data, overrides)
        if backend == "faiss" and cfg.model.bits % 8:
            raise ConfigError(
                "--backend",
                f"faiss needs a multiple of 8 bits, the run's codes have model.bits={cfg.model.bits}: use "
                "--backend numpy",
            )

    return check


def run_search(args: argparse.Namespace) -> None:
    """Every input is checked (flags, --out, the query file, then the run) before the database index is
    built and cached in the run directory."""
    import torch

    from patchword.cli import file_or_stdout
    from patchword.hashing.model import UCMFH
    from patchword.hashing.runner import open_hashing_run, refuse_run_outputs

    if args.k < 1:
        raise ConfigError("--k", f"must be >= 1 (neighbours per query), got {args.k}")
    _refuse_overrides(args.overrides)
    out = file_or_stdout(args.out, args.force)  # '-': stdout, which gets it anyway
    refuse_run_outputs(args.run_dir, {"--out": out}, reads=[args.query] if args.query else [])
    if out is not None:
        check_output_file(out, args.force)
    _check_cache_path(args)
    file_queries = _read_query_file(args.query) if args.query is not None else None
    # said before the data are read (an imported official checkpoint is fused and has none of its own)
    why = "search needs a unimodal model: official_fused codes need the paired other modality"
    check = _run_check(args.backend, args.overrides)
    run = open_hashing_run(args.run_dir, args.overrides, unimodal=why, check=check, command="hash search")
    cfg, model, data = run.cfg, run.model, run.data
    refuse_run_outputs(args.run_dir, {"--out": out}, cfg=cfg)
    queries = _queries(args, model, data, file_queries)
    index, db_modality = _database_index(args, cfg.device, model, data)
    if args.k > len(data.retrieval):  # each query gets the whole database: said (stdout stays the JSON)
        print(
            f"note: --k {args.k} is more than the {len(data.retrieval)} items of the database "
            f"(retrieval.{db_modality}): {len(data.retrieval)} results per query",
            file=sys.stderr,
        )
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(cfg.device)
    encode = model.encode_image if args.modality == "image" else model.encode_text
    dist, idx = index.search(UCMFH.codes(encode(q)).cpu().numpy().astype(np.int8), args.k)
    ids = data.retrieval.ids
    # each result names its query: the query split's row --query-index asked for (with its pair id, what
    # the result ids match for pair data), or the row of the --query file (the list position was printed)
    rows = args.query_index if args.query_index is not None else range(len(idx))
    results = [
        {
            "query": int(row),
            **({"query_id": int(data.query.ids[row])} if args.query_index is not None else {}),
            "indices": idx[qi].tolist(),
            "ids": ids[idx[qi]].tolist(),
            "distances": dist[qi].tolist(),
        }
        for qi, row in enumerate(rows)
    ]
    queries = f"query.{args.modality} rows" if args.query_index is not None else f"{args.query} rows"
    text = json.dumps(
        {"database": f"retrieval.{db_modality}", "queries": queries, "bits": model.bits, "results": results},
        indent=1,
    )
    if out is not None:
        atomic_write_text(out, text)
    print(text)  # stdout: the JSON alone (| jq), with --out as without it, as `hash eval` and `eval` do
    if out is not None:
        print(f"written: {out}", file=sys.stderr)


def _read_query_file(path: Path) -> np.ndarray:
    """``--query``: a readable .npy of finite numbers, one row per query (a single vector is one query)."""
    from patchword.hashing.features import float32_problem
    from patchword.hashing.readers import read_npy

    queries = read_npy(path)
    if queries.ndim == 1:
        queries = queries[None, :]
    if queries.ndim != 2 or queries.dtype.kind not in "biuf":
        raise DataError(
            f"{path}: expected (N, d) numeric query features, got {queries.dtype} {queries.shape}"
        )
    if queries.shape[0] == 0:  # was torch.cat()'s "expected a non-empty list of Tensors", naming no file
        raise DataError(f"{path}: holds no query (shape {queries.shape}); give at least one row")
    # checked before the float32 cast, which would turn a float64 beyond float32's range into inf
    problem = float32_problem(queries)
    if problem:
        raise DataError(f"--query {path}: {problem}")
    return queries


def _queries(args: argparse.Namespace, model, data, file_queries: np.ndarray | None) -> np.ndarray:
    """The query features: the --query file's rows (checked against the model's input size) or the rows
    --query-index names of the run's query split."""
    if file_queries is not None:
        dim = model.image_dim if args.modality == "image" else model.text_dim
        if file_queries.shape[1] != dim:
            raise DataError(
                f"{args.query}: expected (N, {dim}) {args.modality} features, got shape {file_queries.shape}"
            )
        return file_queries
    split = getattr(data.query, args.modality)
    bad = [i for i in args.query_index if not 0 <= i < len(split)]
    if bad:
        raise ConfigError("--query-index", f"{bad} out of range for the {len(split)} query pairs")
    return split[args.query_index]


def _database_index(args: argparse.Namespace, device: str, model, data):
    """The Hamming index of the retrieval split's other modality: cached in the run directory as
    ``index_{modality}.npz`` with the fingerprint of what it was built from (:func:`_index_fingerprint`),
    built (and cached) when missing, when built from other weights or features, or with --rebuild.
    Returns (index, modality)."""
    import torch

    from patchword.hashing.codes import HammingIndex
    from patchword.hashing.model import UCMFH

    db_modality = _database_modality(args)
    index_path = _cache_path(args)
    feats = getattr(data.retrieval, db_modality)
    fingerprint = _index_fingerprint(model, feats, db_modality)
    if index_path.is_file() and not args.rebuild:
        try:
            index = HammingIndex.load(index_path, backend=args.backend)
        except (PatchwordError, MemoryError):
            raise
        except Exception as err:  # numpy's readers raise EOFError, BadZipFile... on a damaged file
            raise DataError(f"{index_path}: cached index unreadable ({err}); pass --rebuild") from None
        if index.metadata == fingerprint:
            return index, db_modality
        # the run was trained on since, or its data (files or data.* keys) changed: stale codes
        _logger.info("%s: built from other weights or retrieval features; rebuilding it", index_path)
    encode = model.encode_text if db_modality == "text" else model.encode_image
    index = HammingIndex(model.bits, backend=args.backend)
    index.add(UCMFH.codes(encode(torch.from_numpy(feats).to(device))).cpu().numpy().astype(np.int8))
    index.metadata = fingerprint
    try:
        index.save(index_path)
    except OSError as err:  # a read-only run (shared, another user's): search it, without the cache
        _logger.warning(
            "%s: cannot cache the database index (%s); searching with the index built now, which the next "
            "search builds again",
            index_path,
            err.strerror or err,
        )
    return index, db_modality


def _database_modality(args: argparse.Namespace) -> str:
    return "text" if args.modality == "image" else "image"


def _cache_path(args: argparse.Namespace) -> Path:
    """Where the run's database index is cached: ``RUN/index_{modality}.npz``."""
    return args.run_dir / f"index_{_database_modality(args)}.npz"


def _check_cache_path(args: argparse.Namespace) -> None:
    """Something else than a file at the cache's path (a directory) is refused before anything is read:
    it could be neither read nor replaced, and was an ``[Errno 21]`` once the database was encoded.
    A cache that cannot be written (a read-only run) is no error: :func:`_database_index` warns and
    searches with the index it built.

    Raises:
        DataError: naming the path.
    """
    path = _cache_path(args)
    if path.exists() and not path.is_file():
        raise DataError(
            f"{path}: the run's cached database index is not a file (a directory?): remove or rename it "
            "so that the index can be cached there"
        )


def _index_fingerprint(model, feats: np.ndarray, modality: str) -> dict:
    """What a cached index's codes are a function of: the database features (rows and a digest) and the
    model's weights (a digest of its state). The index of an unchanged run is reused; one of replaced data
    files, other data.* settings or weights trained on since is rebuilt (the file dates said nothing of
    the data, and a copied run keeps no dates)."""
    import hashlib

    import torch

    weights = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        weights.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)};".encode())
        weights.update(flat.view(torch.uint8).numpy().data)
    feats = np.ascontiguousarray(feats)
    return {
        "database": modality,
        "rows": int(feats.shape[0]),
        "features_sha256": hashlib.sha256(feats.data).hexdigest(),
        "features": f"{feats.dtype}{list(feats.shape)}",
        "weights_sha256": weights.hexdigest(),
        "bits": int(model.bits),
    }
