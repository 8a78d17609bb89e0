"""What an index's readers can use: the fields of a manifest and the dtypes, shapes and values of its shard
arrays.

A hand-edited or damaged manifest, or a shard array of the wrong shape or with impossible values, would fail
deep inside a search (an ``IndexError``, a ``ValueError`` naming no file), and one of another dtype would
change every score without a word; :mod:`patchword.search.manifest` and :mod:`patchword.search.store` check
each when they read the manifest or open the shards, with these functions, and name the file. They read no
file themselves.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from patchword.search.codecs import STORES, TokenCodec

if TYPE_CHECKING:
    from patchword.search.manifest import Manifest
    from patchword.search.shards import ShardArray

__all__ = [
    "DENSE_STORES",
    "NDIMS",
    "dtype_problem",
    "is_count",
    "manifest_problem",
    "shape_problem",
    "token_width",
    "values_problem",
]


def is_count(value: Any, low: int = 0) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def manifest_problem(m: Manifest) -> tuple[str, str] | None:
    """The first field of ``m`` the readers cannot use, as (field, what is wrong with it); None when every
    field is one they read (a hand-edited or damaged manifest would otherwise fail deep inside a search).
    Two entries on one (shard, row), or naming one path, are refused as the second of them."""
    if not isinstance(m.model, dict):
        return "model", "is not an object"
    for key in ("embed_dim", "num_patches"):
        if not is_count(m.model.get(key), 1):
            return f"model.{key}", f"is {m.model.get(key)!r}, not a positive integer"
    for key in ("run_dir", "checkpoint"):
        if not isinstance(m.model.get(key), str):
            return f"model.{key}", f"is {m.model.get(key)!r}, not a path"
    if not isinstance(m.images_root, str):
        return "images_root", f"is {m.images_root!r}, not a path"
    if m.dtype not in STORES:
        return "dtype", f"is {m.dtype!r}, not one of {', '.join(STORES)}"
    if m.state not in ("building", "complete"):
        return "state", f"is {m.state!r}, not building or complete"
    if m.dense is not None and not (
        isinstance(m.dense, dict)
        and isinstance(m.dense.get("file"), str)
        and m.dense.get("store", "tokens") in DENSE_STORES
    ):
        return "dense", f"is {m.dense!r}, not null or {{'file': PATH, 'store': {' or '.join(DENSE_STORES)}}}"
    if m.pruning is not None and not (
        isinstance(m.pruning, dict)
        and all(is_count(m.pruning.get(key), 1) for key in ("kept", "of"))
        and isinstance(m.pruning.get("fraction"), (int, float))
    ):
        return "pruning", f"is {m.pruning!r}, not null or {{'kept': M, 'of': N, 'fraction': F, ...}}"
    if not isinstance(m.codec, dict):
        return "codec", f"is {m.codec!r}, not an object"
    if not is_count(m.next_shard):
        return "next_shard", f"is {m.next_shard!r}, not a count"
    rows: dict[int, int] = {}
    for i, shard in enumerate(m.shards):
        if not (isinstance(shard, dict) and is_count(shard.get("id")) and is_count(shard.get("rows"))):
            return f"shards[{i}]", f"is {shard!r}, not {{'id': N, 'rows': N}}"
        if shard["id"] in rows:
            return f"shards[{i}]", f"names shard {shard['id']} a second time"
        rows[shard["id"]] = shard["rows"]
    at_row: dict[tuple[int, int], int] = {}  # (shard, row) -> the first entry there
    at_path: dict[str, int] = {}
    for i, e in enumerate(m.entries):
        if not (
            isinstance(e.path, str) and is_count(e.size) and isinstance(e.format, str) and is_count(e.row)
        ):
            return (
                f"entries[{i}]",
                f"is {list(asdict(e).values())!r}, not [path, size, mtime_ns, format, shard, row]",
            )
        if e.dense_sha is not None and not isinstance(e.dense_sha, str):
            return f"entries[{i}]", f"has dense_sha {e.dense_sha!r}, not a digest"
        if not (isinstance(e.shard, int) and e.row < rows.get(e.shard, 0)):
            return (
                f"entries[{i}]",
                f"points at row {e.row} of shard {e.shard}, which the shards list does not hold",
            )
        # two entries on one row: two images answered with one's vectors (and one id never found); one path
        # twice: an image listed (and found) twice, one of its ids naming stale vectors after an update
        first = at_row.setdefault((e.shard, e.row), i)
        if first != i:
            return f"entries[{i}]", f"points at row {e.row} of shard {e.shard}, as entries[{first}] does"
        first = at_path.setdefault(e.path, i)
        if first != i:
            return f"entries[{i}]", f"names {e.path!r}, as entries[{first}] does"
    return None


#: How an index keeps what its dense captions contribute (``--dense-store``): their tokens, or the per-image
#: score they give (exact for a matcher whose dense part depends on the image alone).
DENSE_STORES = ("tokens", "scores")


#: The number of dimensions of each shard array: rows first, then (tokens) the token axis, then the width.
NDIMS = {
    "global": 2,
    "tokens": 3,
    "tokens.scale": 2,
    "dense": 3,
    "dense.scale": 2,
    "dense_lens": 1,
    "dense_score": 1,
    "patch_ids": 2,
    "patch_prior": 2,
}


#: The dtype each shard array is written with; ``tokens`` and ``dense`` follow the index's store.
_DTYPES = {
    "global": "float32",
    "tokens.scale": "float16",
    "dense.scale": "float16",
    "dense_lens": "int32",
    "dense_score": "float32",
    "patch_ids": "int16",
    "patch_prior": "float32",
}
_STORE_DTYPES = {"float32": "float32", "float16": "float16", "int8": "int8", "pq": "uint8"}


def dtype_problem(name: str, dtype: np.dtype, manifest: Manifest) -> str | None:
    """What is wrong with the dtype of the shard array ``name`` for ``manifest``'s store; None when it is
    the one the index writes (either byte order: numpy reads both). Another dtype of the right shape
    (int32 tokens in a float32 index, float64...) would be read, converted and scored: every score
    silently changed. Reads no file."""
    want = np.dtype(_STORE_DTYPES[manifest.dtype] if name in ("tokens", "dense") else _DTYPES[name])
    if (dtype.kind, dtype.itemsize) != (want.kind, want.itemsize):
        store = f"an index of --store {manifest.dtype}" if name in ("tokens", "dense") else "an index"
        return f"holds {dtype} values, {store} keeps its {name} array as {want}"
    return None


def token_width(manifest: Manifest, codec: TokenCodec | None = None) -> int | None:
    """The last dimension of the stored token arrays: the embedding width, or pq's bytes per token (from
    ``codec``, else the manifest's record of it; None when neither says)."""
    if manifest.dtype != "pq":
        return int(manifest.model["embed_dim"])
    if codec is not None and codec.centroids is not None:
        return int(codec.centroids.shape[0])
    return manifest.codec.get("pq_m")


def shape_problem(
    name: str, shapes: dict[str, tuple[int, ...]], rows: int, manifest: Manifest, width: int | None
) -> str | None:
    """What is wrong with the shape of the shard array ``name`` (``shapes[name]``; the shard's arrays
    checked before it in :func:`shard_arrays` order are in ``shapes`` too) for a shard the manifest says
    holds ``rows`` images; None when nothing is. Reads no file."""
    shape = shapes[name]
    if len(shape) != NDIMS[name]:
        return f"has shape {shape}, an index's {name} array has {NDIMS[name]} dimensions"
    want = [rows, *shape[1:]]
    if name == "global":
        want[1] = int(manifest.model["embed_dim"])
    elif name in ("tokens", "dense") and width is not None:
        want[2] = width
    elif name.endswith(".scale"):
        want[1] = shapes[name.removesuffix(".scale")][1]
    elif name in ("patch_ids", "patch_prior"):
        want[1] = int(manifest.pruning["kept"])
    if name == "tokens" and manifest.pruning is None and is_count(manifest.model.get("image_tokens"), 1):
        want[1] = manifest.model["image_tokens"]
    if (
        name == "tokens"
        and manifest.pruning is not None
        and shape[1] - manifest.pruning["kept"] not in (0, 1)
    ):
        want[1] = manifest.pruning["kept"]  # the kept patches, after the CLS token where the model has one
    if tuple(want) != tuple(shape):
        return f"has shape {tuple(shape)}, its shard of {rows} images in the manifest needs {tuple(want)}"
    return None


def values_problem(name: str, array: ShardArray, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """What is wrong with the values of the shard array ``name`` (its shape checked, and those of the
    arrays before it in ``shapes``), for the arrays whose values index another: ``dense_lens``, each row's
    dense-caption length, must lie in 1..the width of the shard's ``dense`` array. None when nothing is.

    ``array``: the mapped file. Only ``dense_lens`` is read, with
    :meth:`~patchword.search.shards.ShardArray.read_rows`, which checks the file's size first: one cut
    short since it was mapped is a :class:`~patchword.search.shards.CutShortError`, never SIGBUS."""
    if name != "dense_lens" or not array.shape[0]:
        return None
    values = array.read_rows(np.arange(array.shape[0]))
    width = shapes["dense"][1]
    bad = np.flatnonzero((values < 1) | (values > width))
    if bad.size:
        return (
            f"holds the dense caption length {int(values[bad[0]])} at row {int(bad[0])}, outside 1..{width} "
            "(the width of the shard's dense tokens)"
        )
    return None
