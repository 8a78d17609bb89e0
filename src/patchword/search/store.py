"""The on-disk format of a search index: a JSON manifest and memory-mappable ``.npy`` shards.

``INDEX_DIR/``
    ``manifest.json``  format version, the model that wrote it (run, checkpoint, weights hash, config),
    the image folder, the storage dtype, the shards, one entry per indexed image (relative path, size,
    mtime, format, shard and row) and the files skipped with their reason;
    ``shards/NNNNN.global.npy``      (rows, C) float32 L2-normalised global image embeddings;
    ``shards/NNNNN.tokens.npy``      (rows, L_v, C) projected image tokens, what the fine matcher reads, in
    the index's token store (:mod:`patchword.search.codecs`: float32, float16, int8 with
    ``NNNNN.tokens.scale.npy``, or product-quantised codes with the index's ``codec.npz``);
    ``shards/NNNNN.dense.npy`` and ``NNNNN.dense_lens.npy``  (rows, L_d, C) dense-caption tokens (same store)
    and their (rows,) lengths, only for an index built with dense captions; or, with ``--dense-store
    scores``, ``NNNNN.dense_score.npy`` (rows,) float32: the part of every score the image's dense caption
    decides alone (SEPS as released: the dense branch), computed at build time in place of the tokens;
    ``shards/NNNNN.patch_ids.npy`` (rows, M) int16 and ``NNNNN.patch_prior.npy`` (rows, M) float32, only for
    an index pruned to M patches per image (``--keep-patches``, :mod:`patchword.search.pruning`): the grid
    positions of the patches kept in ``tokens`` and the image part of their selection scores.

Every file is written to a temporary name and renamed into place (``os.replace``), shards first and the
manifest last, so the manifest only ever names complete shards: a build killed at any moment leaves a
consistent index to resume from. An update of a complete index writes its progress to
``manifest.pending.json`` and replaces ``manifest.json`` last: until then searches open the index as it was
(shard files are never rewritten in place; the ones the new manifest drops are deleted after it). A build or
update holds ``.build.lock`` (:mod:`patchword.locks`) while it writes. Rows of a shard whose image was
deleted or changed are dead (no entry points at them) until the index is compacted.

An index id is the position of an entry in the manifest: ids are dense (0..N-1) and stable for one
version of the index.

What a reader can use of a manifest and of the shard arrays is checked by :mod:`patchword.search.checks`.

Over 400 lines: the on-disk index format: manifest, shards, the reader and atomic writes, one format in one
place.
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from patchword.data.npy import load_npy, npy_problem
from patchword.errors import DataError, MissingFileError
from patchword.fileio import atomic_write, atomic_write_bytes, write_all
from patchword.search.checks import (
    DENSE_STORES,
    manifest_problem,
    shape_problem,
    token_width,
    values_problem,
)
from patchword.search.codecs import STORES, TokenCodec, load_codec
from patchword.search.scan import SkippedFile

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "PENDING_FILE",
    "LOCK_FILE",
    "SHARDS_DIR",
    "Entry",
    "IndexEntries",
    "caption_digest",
    "Manifest",
    "SearchIndex",
    "DamagedIndexError",
    "atomic_write",
    "save_npy_atomic",
    "write_npy",
    "shard_files",
    "broken_shards",
    "rows_digest",
    "DENSE_STORES",
    "REPAIR_HINT",
    "unfinished_build",
]

FORMAT = "patchword-search-index"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
#: The manifest of an update under way (or stopped part-way): ``manifest.json`` keeps the complete index it
#: started from, what searches open, until the update's last write replaces it.
PENDING_FILE = "manifest.pending.json"
#: The lock a build or update holds on its index (one at a time); removed when it ends.
LOCK_FILE = ".build.lock"
SHARDS_DIR = "shards"
DTYPES = STORES  # the token stores an index may use (the manifest's ``dtype`` field names one)
#: How a user repairs an index with a missing or damaged shard file: ``--update`` drops the entries stored
#: in such a shard and encodes their images again (:func:`broken_shards`).
REPAIR_HINT = (
    "repair the index with `patchword index build RUN_DIR --images DIR --out INDEX_DIR --update` (it "
    "encodes the images of damaged shards again), or build a new one"
)


@dataclass(frozen=True)
class Entry:
    """One indexed image: its file (relative path, size, mtime, format), where its vectors are and, in an
    index with dense captions, ``dense_sha``: the digest of the caption it was encoded with
    (:func:`caption_digest`; None in an index written before it was recorded), so an update re-encodes an
    image whose caption changed."""

    path: str
    size: int
    mtime_ns: int
    format: str
    shard: int
    row: int
    dense_sha: str | None = None


def caption_digest(text: str) -> str:
    """The digest of a dense caption an entry records (``Entry.dense_sha``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class Manifest:
    """Everything ``manifest.json`` holds (see the module docstring).

    Attributes:
        model: identity of the model that encoded the images (``weights_sha256`` decides compatibility)
            and the shapes it produces.
        images_root: absolute path of the indexed folder.
        dtype: the token store of the shards (:data:`~patchword.search.codecs.STORES`).
        codec: what the store needs recorded (pq: the quantiser's shape), for people reading the manifest.
        dense: None, or the dense-caption file the index was built with (``file``, ``max_len``) and what
            the index keeps of it (``store``: :data:`DENSE_STORES`; absent in older indexes: tokens).
        pruning: None (every patch stored), or how the patches were pruned at build time (``kept`` M of
            ``of`` N per image, ``fraction``, ``by``: the rule, ``exact``: false), see
            :func:`patchword.search.pruning.pruning_record`.
        state: ``building`` (a build or update is running or was interrupted) or ``complete``.
        shards: ``{"id", "rows"}`` of every shard file set, in creation order.
        next_shard: id of the next shard to write.
        entries: the indexed images; an entry's position is its index id.
        skipped: files left out, with the reason.
    """

    model: dict[str, Any]
    images_root: str
    dtype: str
    dense: dict[str, Any] | None = None
    codec: dict[str, Any] = field(default_factory=dict)
    pruning: dict[str, Any] | None = None
    state: str = "building"
    shards: list[dict[str, int]] = field(default_factory=list)
    next_shard: int = 0
    entries: list[Entry] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)

    @property
    def dense_store(self) -> str | None:
        """``tokens`` or ``scores`` (see :data:`DENSE_STORES`); None without dense captions."""
        return None if self.dense is None else self.dense.get("store", "tokens")

    def to_json(self) -> str:
        payload = {"format": FORMAT, "version": FORMAT_VERSION, **asdict(self)}
        fields = ["path", "size", "mtime_ns", "format", "shard", "row"]
        if self.dense is not None:  # the caption each image was encoded with (an index without: as before)
            fields.append("dense_sha")
        payload["entries"] = [
            [e.path, e.size, e.mtime_ns, e.format, e.shard, e.row, e.dense_sha][: len(fields)]
            for e in self.entries
        ]
        payload["entry_fields"] = fields
        return json.dumps(payload, indent=1, ensure_ascii=False)

    @classmethod
    def read(cls, index_dir: str | os.PathLike[str], name: str = MANIFEST_FILE) -> Manifest:
        """Read ``index_dir/manifest.json`` (or ``name``: :data:`PENDING_FILE`).

        Raises:
            MissingFileError: no manifest.
            DataError: not a patchword index, another format version, or a malformed file.
        """
        path = Path(index_dir) / name
        if not path.is_file():
            raise MissingFileError(f"{index_dir} is not a search index: it has no {MANIFEST_FILE}")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: malformed index manifest ({err})") from err
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise DataError(f"{path} is not a patchword search index manifest")
        if payload.get("version") != FORMAT_VERSION:
            raise DataError(
                f"{path}: index format version {payload.get('version')} (this patchword reads "
                f"{FORMAT_VERSION}); rebuild it with `patchword index build`"
            )
        try:
            manifest = cls(
                model=payload["model"],
                images_root=payload["images_root"],
                dtype=payload["dtype"],
                dense=payload.get("dense"),
                codec=payload.get("codec") or {},
                pruning=payload.get("pruning"),
                state=payload["state"],
                shards=list(payload["shards"]),
                next_shard=int(payload["next_shard"]),
                entries=[Entry(*row) for row in payload["entries"]],
                skipped=[SkippedFile(**s) for s in payload.get("skipped", [])],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"{path}: malformed index manifest (field {err})") from err
        problem = manifest_problem(manifest)
        if problem is not None:
            raise DataError(
                f"{path}: malformed index manifest: field {problem[0]!r} {problem[1]}; build a new index "
                "with `patchword index build`"
            )
        return manifest

    def write(self, index_dir: str | os.PathLike[str], name: str = MANIFEST_FILE) -> None:
        """Replace ``index_dir/manifest.json`` (or ``name``: :data:`PENDING_FILE`, an update's progress)
        atomically."""
        atomic_write_bytes(Path(index_dir) / name, self.to_json().encode("utf-8"))


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    """``np.save`` to ``path`` atomically (temporary file, fsync, rename).

    The bytes are those ``np.save`` writes, written with :func:`write_npy`: a full disk is
    ``OSError(ENOSPC)`` naming ``path``, not numpy's "266240 requested and 244704 written"."""
    atomic_write(path, lambda fh: write_npy(fh, array, path))


def write_npy(fh: IO[bytes], array: np.ndarray, path: str | os.PathLike[str]) -> None:
    """Write ``array`` in ``.npy`` format (``np.save``'s bytes, no pickles) to the open file ``fh``.

    ``np.save`` writes a real file with ``ndarray.tofile`` (C ``fwrite``), which reports a write cut
    short by a full disk as "N requested and M written", without the errno or the file. Here every byte
    goes through ``os.write`` until all are written: the operating system's error comes out as an
    ``OSError`` naming ``path`` (``path: No space left on device (ENOSPC)``), and a write that takes
    nothing without an error is a full disk too."""
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise ValueError(f"{path}: object arrays are not stored in an index")
    header = io.BytesIO()
    fields = np.lib.format.header_data_from_array_1_0(array)
    try:
        np.lib.format.write_array_header_1_0(header, fields)
    except ValueError:  # a header over 64 KiB: np.save writes format 2.0 then
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(header, fields)
    fh.flush()  # nothing may be buffered ahead of the bytes written to the descriptor
    fd = fh.fileno()
    for data in (header.getbuffer(), memoryview(array.reshape(-1).view(np.uint8))):
        write_all(fd, data, path)


#: Every array a shard may hold (``.scale``: the int8 store's per-token scales).
ARRAYS = (
    "global",
    "tokens",
    "tokens.scale",
    "dense",
    "dense.scale",
    "dense_lens",
    "dense_score",
    "patch_ids",
    "patch_prior",
)


def rows_digest(manifest: Manifest) -> str:
    """A digest of which stored row each index id reads: the shard list and every entry's (shard, row), in
    id order, and the model's weights. Shard files are never rewritten under the same id (a new shard takes
    ``next_shard``), so equal digests mean equal vectors behind every id: what anything derived from the
    rows (a kept approximate first stage, a Qdrant upload whose point ids are index ids) must match."""
    digest = hashlib.sha256()
    digest.update(json.dumps([manifest.model.get("weights_sha256"), manifest.shards]).encode())
    rows = np.array([(e.shard, e.row) for e in manifest.entries], dtype=np.int64).reshape(-1, 2)
    digest.update(rows.tobytes())
    return digest.hexdigest()[:16]


def shard_files(index_dir: Path, shard_id: int) -> dict[str, Path]:
    """Paths of one shard's arrays by name (:data:`ARRAYS`)."""
    base = Path(index_dir) / SHARDS_DIR
    return {name: base / f"{shard_id:05d}.{name}.npy" for name in ARRAYS}


def shard_arrays(manifest: Manifest) -> tuple[str, ...]:
    """The arrays each shard of ``manifest`` holds."""
    codec = TokenCodec(manifest.dtype)
    names = ["global", *(f"tokens{s}" for s in codec.suffixes())]
    if manifest.dense_store == "scores":
        names.append("dense_score")
    elif manifest.dense_store == "tokens":
        names += [*(f"dense{s}" for s in codec.suffixes()), "dense_lens"]
    if manifest.pruning is not None:
        names += ["patch_ids", "patch_prior"]
    return tuple(names)


def broken_shards(index_dir: Path, manifest: Manifest) -> dict[int, str]:
    """Shard id -> what is wrong with one of its files (missing, truncated, not a .npy array, a shape that
    is not the one the manifest gives the shard, values that index past another array: see
    :mod:`patchword.search.checks`), for every shard of ``manifest`` that cannot be read; reads the files'
    headers and sizes, and the small arrays whose values are checked."""
    names = shard_arrays(manifest)
    width = token_width(manifest)
    broken = {}
    for shard in manifest.shards:
        files = shard_files(index_dir, shard["id"])
        shapes: dict[str, tuple[int, ...]] = {}
        for name in names:
            problem = npy_problem(files[name]) if files[name].is_file() else "missing"
            if problem is None:
                try:
                    array = np.load(files[name], mmap_mode="r", allow_pickle=False)
                except (ValueError, EOFError) as err:
                    problem = f"cannot read the array ({err})"
                else:
                    shapes[name] = array.shape
                    problem = shape_problem(name, shapes, shard["rows"], manifest, width)
                    problem = problem or values_problem(name, array, shapes)
            if problem is not None:
                broken[shard["id"]] = f"{files[name].name}: {problem}"
                break
    return broken


def unfinished_build(index_dir: Path) -> str:
    """Why an index whose first build has not finished cannot be opened, and what to do."""
    return (
        f"{index_dir}: the index build did not finish: it is still running (search the index when it ends), "
        "or it was stopped (then rerun the same `patchword index build` command: it resumes the build)"
    )


class DamagedIndexError(DataError):
    """An index whose stored vectors give a search non-finite scores (values overwritten on disk)."""


class IndexEntries:
    """The image entries of an index's manifest, by index id: what every index backend shares."""

    manifest: Manifest

    def __len__(self) -> int:
        return len(self.manifest.entries)

    @property
    def images_root(self) -> Path:
        return Path(self.manifest.images_root)

    def path(self, image_id: int) -> str:
        """Relative path (POSIX) of image ``image_id``."""
        return self.manifest.entries[image_id].path


class SearchIndex(IndexEntries):
    """A complete index opened for reading: memory-mapped shards, entries by index id.

    Use :meth:`open`. Token and dense arrays stay on disk (memory maps) and only the rows a query
    needs are read; the global embeddings of all images are gathered once into one (N, C) float32
    tensor, the matrix of the first search stage.
    """

    def __init__(self, index_dir: Path, manifest: Manifest) -> None:
        self.index_dir = index_dir
        self.manifest = manifest
        self.entries = manifest.entries
        self._arrays: dict[int, dict[str, np.ndarray]] = {}
        self.codec = load_codec(index_dir, manifest.dtype)
        names = shard_arrays(manifest)
        width = token_width(manifest, self.codec)
        for shard in manifest.shards:
            files = shard_files(index_dir, shard["id"])
            arrays = {}
            for name in names:
                if not files[name].is_file():
                    raise DataError(f"{index_dir}: shard file {files[name].name} is missing; {REPAIR_HINT}")
                arrays[name] = load_npy(files[name], mmap=True, fix=REPAIR_HINT)
                # rows past the end would be an IndexError in the middle of a search
                shapes = {n: a.shape for n, a in arrays.items()}
                problem = shape_problem(name, shapes, shard["rows"], manifest, width)
                problem = problem or values_problem(name, arrays[name], shapes)
                if problem is not None:
                    raise DataError(f"{files[name]}: {problem}; {REPAIR_HINT}")
            self._arrays[shard["id"]] = arrays
        shards = np.array([e.shard for e in self.entries], dtype=np.int64)
        rows = np.array([e.row for e in self.entries], dtype=np.int64)
        self._shard_of, self._row_of = shards, rows
        self._global: torch.Tensor | None = None

    @classmethod
    def open(cls, index_dir: str | os.PathLike[str]) -> SearchIndex:
        """Open a complete index.

        Raises:
            MissingFileError: not an index.
            DataError: the build was interrupted (``state`` is ``building``), a shard is missing, or the
                index is empty.
        """
        index_dir = Path(index_dir)
        manifest = Manifest.read(index_dir)
        if manifest.state != "complete":
            raise DataError(unfinished_build(index_dir))
        if not manifest.entries:
            raise DataError(f"{index_dir}: the index holds no image (see its manifest's skipped list)")
        return cls(index_dir, manifest)

    # ------------------------------------------------------------------ entries
    @property
    def has_dense(self) -> bool:
        return self.manifest.dense is not None

    @property
    def dense_store(self) -> str | None:
        """``tokens`` or ``scores`` (see :data:`DENSE_STORES`); None without dense captions."""
        return self.manifest.dense_store

    # ------------------------------------------------------------------ vectors
    def global_embeddings(self) -> torch.Tensor:
        """(N, C) float32 global image embeddings in index-id order (gathered once, then cached).

        Raises:
            DamagedIndexError: a row holds non-finite values (naming its shard file).
        """
        if self._global is None:
            dim = int(self.manifest.model["embed_dim"])
            out = np.empty((len(self.entries), dim), dtype=np.float32)
            for shard_id, arrays in self._arrays.items():
                mine = np.flatnonzero(self._shard_of == shard_id)
                if mine.size:
                    out[mine] = arrays["global"][self._row_of[mine]]
            bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
            if bad.size:  # a nan row would be left out of every shortlist without a word
                file = shard_files(self.index_dir, int(self._shard_of[bad[0]]))["global"]
                more = f" and {bad.size - 1} more images" if bad.size > 1 else ""
                raise DamagedIndexError(
                    f"{file}: holds non-finite values (image {self.entries[bad[0]].path}{more} cannot be "
                    f"scored): delete it and {REPAIR_HINT}"
                )
            self._global = torch.from_numpy(out)
        return self._global

    def global_rows(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """(k,) ids -> (k, C) float32 global image embeddings, read for those rows only."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return torch.from_numpy(self.gather("global", ids).astype(np.float32, copy=False))

    def gather(self, name: str, ids: np.ndarray, width: int | None = None) -> np.ndarray:
        """Rows ``ids`` (index ids) of one stored array (``global``, ``tokens``, ``dense``, ``dense_lens``),
        in the order given, zero-padded (or cut) to ``width`` along axis 1."""
        first = next(iter(self._arrays.values()))[name]
        if width is None:
            width = first.shape[1] if first.ndim > 1 else 0
        shape = (len(ids), width, *first.shape[2:]) if first.ndim > 1 else (len(ids),)
        out = np.zeros(shape, dtype=first.dtype)
        shards, rows = self._shard_of[ids], self._row_of[ids]
        for shard_id in np.unique(shards):
            at = np.flatnonzero(shards == shard_id)
            part = self._arrays[int(shard_id)][name][rows[at]]
            if part.ndim > 1:
                part = part[:, :width]  # a shard may be padded wider than the rows asked for
                out[at, : part.shape[1]] = part
            else:
                out[at] = part
        return out

    def prefetch(self, ids: torch.Tensor | np.ndarray) -> None:
        """Ask the kernel to read now the rows ``ids`` of every array a re-ranking reads (``madvise``).

        A row not in the page cache is a disk read; reading the shortlist row by row waits for each in
        turn, while advising all of them first lets the disk serve them together (an order of magnitude
        for cold rows: docs/benchmarks.md, "Numbers behind code choices"). Does nothing where
        ``madvise`` is unavailable.
        """
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if advice is None:
            return
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        shards, rows = self._shard_of[ids], self._row_of[ids]
        page = mmap.PAGESIZE
        for shard_id, row in zip(shards.tolist(), rows.tolist(), strict=True):
            for name, array in self._arrays[shard_id].items():
                region = getattr(array, "_mmap", None)
                if name in ("global", "patch_ids") or region is None:  # rows a search does not read
                    continue
                start = int(array.offset) + row * array.strides[0]
                aligned = start - start % page
                try:
                    region.madvise(advice, aligned, start + array.strides[0] - aligned)
                except (OSError, ValueError):  # advice only: reading still works without it
                    return

    def _decoded(self, name: str, ids: np.ndarray, width: int | None = None) -> np.ndarray:
        """Rows ``ids`` of the token array ``name`` (``tokens`` / ``dense``), decoded to float32: only the
        rows asked for are read and decoded."""
        arrays = {suffix: self.gather(f"{name}{suffix}", ids, width) for suffix in self.codec.suffixes()}
        return self.codec.decode(arrays)

    def image_tokens(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """(k,) index ids -> (k, L_v, C) float32 image tokens."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return torch.from_numpy(self._decoded("tokens", ids))

    def dense_scores(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor | None:
        """(k,) index ids -> (k,) float32 precomputed dense scores, or None (not a ``scores`` index)."""
        if self.dense_store != "scores":
            return None
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return torch.from_numpy(self.gather("dense_score", ids).astype(np.float32))

    @property
    def pruning(self) -> dict[str, Any] | None:
        """How the index pruned its patches (``Manifest.pruning``), or None."""
        return self.manifest.pruning

    def patch_priors(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor | None:
        """(k,) index ids -> (k, M) float32 selection priors of the kept patches, or None (not pruned)."""
        if self.pruning is None:
            return None
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return torch.from_numpy(self.gather("patch_prior", ids).astype(np.float32))

    def patch_ids(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor | None:
        """(k,) index ids -> (k, M) int64 grid positions of the kept patches, or None (not pruned)."""
        if self.pruning is None:
            return None
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return torch.from_numpy(self.gather("patch_ids", ids).astype(np.int64))

    def dense_tokens(self, ids: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k,) index ids -> ((k, L_d, C) float32 dense tokens, (k,) int64 lengths), or None (no dense
        captions, or only their scores kept)."""
        if self.dense_store != "tokens":
            return None
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        lens = self.gather("dense_lens", ids).astype(np.int64)
        width = int(lens.max()) if lens.size else 1
        return torch.from_numpy(self._decoded("dense", ids, width)), torch.from_numpy(lens)

    def non_finite_files(self, ids: torch.Tensor | np.ndarray) -> dict[int, Path]:
        """Index id -> the first shard file holding a non-finite value in its rows, for each of ``ids``
        whose rows hold one (in the order given); reads those rows only."""
        found = {}
        for image_id in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            shard, row = int(self._shard_of[image_id]), int(self._row_of[image_id])
            for name, array in self._arrays[shard].items():
                if array.dtype.kind == "f" and not np.isfinite(array[row]).all():
                    found[image_id] = shard_files(self.index_dir, shard)[name]
                    break
        return found

    def bytes_per_image(self) -> float:
        """Bytes the shard files take per indexed image (all arrays)."""
        total = sum(
            f.stat().st_size
            for shard in self.manifest.shards
            for name, f in shard_files(self.index_dir, shard["id"]).items()
            if f.is_file()
        )
        return total / max(1, len(self.entries))
