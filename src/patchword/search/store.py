"""Reading a search index: :class:`SearchIndex` opens a complete index (its manifest, then every shard
array memory-mapped and checked), and :func:`broken_shards` finds, with the same check, the shards an update
must encode again.

Rows are copied out of read-only memory maps (:class:`~patchword.search.shards.ShardArray`) once the file's
size is checked: a shard file cut short in place before a query is :class:`ChangedShardError`, not a SIGBUS;
one cut short during the copy still ends the process (replace shard files by renaming, never in place).

The format is :mod:`patchword.search.manifest` (``manifest.json``, the layout) and
:mod:`patchword.search.shards` (the shard files); what a reader can use of them is checked by
:mod:`patchword.search.checks`. Every image id a reader is given is checked (:meth:`IndexEntries.check_ids`):
numpy indexing would read ``-1`` as the last image (:mod:`patchword.search.entries`).
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.data.npy import npy_problem, read_npy_header
from patchword.errors import DataError, MissingFileError
from patchword.search.checks import dtype_problem, shape_problem, token_width, values_problem
from patchword.search.codecs import load_codec
from patchword.search.entries import IndexEntries
from patchword.search.manifest import MANIFEST_FILE, Manifest, unfinished_build
from patchword.search.scan import printable
from patchword.search.shards import CutShortError, ShardArray, shard_arrays, shard_files, too_many_open_files

__all__ = [
    "REPAIR_HINT",
    "ChangedShardError",
    "DamagedIndexError",
    "MissingShardError",
    "StaleIndexError",
    "SearchIndex",
    "broken_shards",
    "dead_row_bytes",
]

#: How a user repairs an index with a missing or damaged shard file: ``--update`` drops the entries stored
#: in such a shard and encodes their images again (:func:`broken_shards`).
REPAIR_HINT = (
    "repair the index with `patchword index build RUN_DIR --images DIR --out INDEX_DIR --update` (it "
    "encodes the images of damaged shards again), or build a new one"
)


class DamagedIndexError(DataError):
    """An index whose stored vectors give a search non-finite scores (values overwritten on disk)."""


class StaleIndexError(DataError):
    """Vectors that no longer belong to the index opened: a store read by id (Qdrant) was uploaded again, with
    ids renumbered, since its manifest was read, or a shard file was cut short (:class:`ChangedShardError`).
    Opening the index again reads both as they are now."""


class ChangedShardError(StaleIndexError, DamagedIndexError):
    """A shard file cut short in place since the index was opened (``truncate``, a ``cp`` over it): a row a
    search reads is not all there. A server answers 503 and opens the index again, checking every file."""


class MissingShardError(DataError):
    """A shard file the manifest names is not there."""


class _Unreadable(Exception):
    """One array of a shard that cannot be read: its ``file`` and ``problem``; ``missing``: it is gone."""

    def __init__(self, file: Path, problem: str, missing: bool = False) -> None:
        super().__init__(f"{file}: {problem}")
        self.file, self.problem, self.missing = file, problem, missing


def _map_shard(
    index_dir: Path, shard: dict[str, Any], names: tuple[str, ...], manifest: Manifest, width: int | None
) -> dict[str, ShardArray]:
    """Read-only memory maps of the arrays ``names`` of the index's ``shard`` (its manifest entry), each
    checked: its ``.npy`` header and size, its dtype against the store, its shape against the shard's rows
    and the arrays before it, the values that index past another array (:mod:`patchword.search.checks`);
    rows past the end would be an ``IndexError`` in the middle of a search, another dtype a silent change
    of every score.

    Raises:
        _Unreadable: the first array that cannot be read.
        DataError: too many open files (``EMFILE``): :func:`~patchword.search.shards.too_many_open_files`.
        OSError: another failure to open or map a file.
    """
    files, rows, arrays = shard_files(index_dir, shard["id"]), shard["rows"], {}
    for name in names:
        file = files[name]
        if not file.is_file():
            raise _Unreadable(file, "missing", missing=True)
        try:
            try:
                arrays[name], problem = ShardArray(file), None
            except (ValueError, EOFError) as err:  # said as npy_problem says it (a pickle, cut short...)
                problem = npy_problem(file) or f"cannot read the array ({err})"
        except (MissingFileError, FileNotFoundError):  # deleted since is_file()
            raise _Unreadable(file, "missing", missing=True) from None
        except OSError as err:
            if err.errno != errno.EMFILE:
                raise
            raise DataError(too_many_open_files(index_dir, len(manifest.shards) * len(names))) from None
        if problem is None:
            shapes = {n: a.shape for n, a in arrays.items()}
            problem = dtype_problem(name, arrays[name].dtype, manifest)
            problem = problem or shape_problem(name, shapes, rows, manifest, width)
            try:
                problem = problem or values_problem(name, arrays[name], shapes)
            except CutShortError as err:  # cut short in place since it was mapped, a moment ago
                problem = err.problem
        if problem is not None:
            raise _Unreadable(file, problem)
    return arrays


def broken_shards(index_dir: Path, manifest: Manifest) -> dict[int, str]:
    """Shard id -> what is wrong with one of its files (missing, truncated, not a .npy array, a dtype or a
    shape that is not the one the manifest gives the shard, values that index past another array: see
    :mod:`patchword.search.checks`), for every shard of ``manifest`` that cannot be read; reads the files'
    headers and sizes, and the small arrays whose values are checked. Too many open files: a DataError
    (:func:`_map_shard`)."""
    names, width = shard_arrays(manifest), token_width(manifest)
    broken = {}
    for shard in manifest.shards:
        try:
            _map_shard(index_dir, shard, names, manifest, width)
        except _Unreadable as err:
            broken[shard["id"]] = f"{err.file.name}: {err.problem}"
    return broken


def dead_row_bytes(index_dir: Path, manifest: Manifest | None = None) -> int:
    """Bytes of the shard rows no entry of ``manifest`` (default: the index's) reads: the rows of images
    deleted or changed since they were stored, until a compaction drops them (each shard file's data bytes
    per row, headers aside)."""
    index_dir = Path(index_dir)
    manifest = manifest if manifest is not None else Manifest.read(index_dir)
    live = Counter(entry.shard for entry in manifest.entries)
    dead_bytes = 0
    for shard in manifest.shards:
        dead = shard["rows"] - live.get(shard["id"], 0)
        if dead <= 0:
            continue
        for file in shard_files(index_dir, shard["id"]).values():
            if not file.is_file():
                continue
            with open(file, "rb") as fh:
                header = read_npy_header(fh)
            offset = header[3] if header is not None else 0
            dead_bytes += dead * (file.stat().st_size - offset) // shard["rows"]
    return dead_bytes


def _manifest_stamp(index_dir: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of ``manifest.json`` (None: absent, or ``index_dir`` is no directory): what a
    build's atomic replace changes."""
    try:
        st = os.stat(index_dir / MANIFEST_FILE)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _complete_manifest(index_dir: Path) -> Manifest:
    """The manifest of a complete index of at least one image (see :meth:`SearchIndex.open`)."""
    manifest = Manifest.read(index_dir)
    if manifest.state != "complete":
        raise DataError(unfinished_build(index_dir))
    if not manifest.entries:
        raise DataError(f"{index_dir}: the index holds no image (see its manifest's skipped list)")
    return manifest


class SearchIndex(IndexEntries):
    """A complete index opened for reading: memory-mapped shards (:class:`~patchword.search.shards.
    ShardArray`), entries by index id.

    Use :meth:`open`. Token and dense arrays stay on disk (memory maps) and only the rows a query needs are
    read (a file found cut short since it was mapped is :class:`ChangedShardError`); the global embeddings
    of all images are gathered once into one (N, C) float32 tensor, the matrix of the first search stage.
    """

    def __init__(self, index_dir: Path, manifest: Manifest) -> None:
        self.index_dir, self.manifest, self.entries = index_dir, manifest, manifest.entries
        self._arrays: dict[int, dict[str, ShardArray]] = {}
        self.codec = load_codec(index_dir, manifest.dtype)
        names, width = shard_arrays(manifest), token_width(manifest, self.codec)
        for shard in manifest.shards:
            try:
                arrays = _map_shard(index_dir, shard, names, manifest, width)
            except _Unreadable as err:
                if err.missing:
                    raise MissingShardError(
                        f"{index_dir}: shard file {err.file.name} is missing; {REPAIR_HINT}"
                    ) from None
                raise DataError(f"{err.file}: {err.problem}; {REPAIR_HINT}") from None
            self._arrays[shard["id"]] = arrays
        shards = np.array([e.shard for e in self.entries], dtype=np.int64)
        rows = np.array([e.row for e in self.entries], dtype=np.int64)
        self._shard_of, self._row_of = shards, rows
        self._global: torch.Tensor | None = None

    @classmethod
    def open(cls, index_dir: str | os.PathLike[str]) -> SearchIndex:
        """Open a complete index.

        An update replaces ``manifest.json`` and then deletes the shard files only the old manifest named
        (compacted away): an open that read the old manifest just before finds one of them gone. It then
        reads the new manifest and opens that index, once; a shard missing while the manifest is unchanged
        is the damage it is (:class:`MissingShardError`).

        Raises:
            MissingFileError: not an index.
            MissingShardError: a shard file the manifest names is missing.
            DataError: the build was interrupted (``state`` is ``building``), a shard file cannot be read,
                or the index is empty.
        """
        index_dir = Path(index_dir)
        stamp = _manifest_stamp(index_dir)  # taken before the read: a manifest replaced after it is noticed
        try:
            return cls(index_dir, _complete_manifest(index_dir))
        except MissingShardError:
            if _manifest_stamp(index_dir) == stamp:
                raise
        return cls(index_dir, _complete_manifest(index_dir))

    # ------------------------------------------------------------------ entries
    @property
    def has_dense(self) -> bool:
        return self.manifest.dense is not None

    @property
    def dense_store(self) -> str | None:
        """``tokens`` or ``scores`` (:data:`~patchword.search.checks.DENSE_STORES`); None without dense
        captions."""
        return self.manifest.dense_store

    # ------------------------------------------------------------------ vectors
    def global_embeddings(self) -> torch.Tensor:
        """(N, C) float32 global image embeddings in index-id order (gathered once, then cached).

        Raises:
            DamagedIndexError: a row holds non-finite values (naming its shard file).
            ChangedShardError: a shard file was cut short since the index was opened.
        """
        if self._global is None:
            dim = int(self.manifest.model["embed_dim"])
            out = np.empty((len(self.entries), dim), dtype=np.float32)
            for shard_id in self._arrays:
                mine = np.flatnonzero(self._shard_of == shard_id)
                if mine.size:
                    out[mine] = self._read(shard_id, "global", self._row_of[mine])
            bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
            if bad.size:  # a nan row would be left out of every shortlist without a word
                file = shard_files(self.index_dir, int(self._shard_of[bad[0]]))["global"]
                more = f" and {bad.size - 1} more images" if bad.size > 1 else ""
                image = printable(self.entries[bad[0]].path)
                raise DamagedIndexError(
                    f"{file}: holds non-finite values (image {image}{more} cannot be scored): delete it and "
                    f"{REPAIR_HINT}"
                )
            self._global = torch.from_numpy(out)
        return self._global

    def global_rows(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """(k,) ids -> (k, C) float32 global image embeddings, read for those rows only."""
        ids = self.check_ids(ids)
        return torch.from_numpy(self._gather("global", ids).astype(np.float32, copy=False))

    def gather(self, name: str, ids: np.ndarray, width: int | None = None) -> np.ndarray:
        """Rows ``ids`` (index ids) of one stored array (``global``, ``tokens``, ``dense``, ``dense_lens``),
        in the order given, zero-padded (or cut) to ``width`` along axis 1 (:meth:`check_ids`); a shard file
        cut short since the index was opened is :class:`ChangedShardError`."""
        return self._gather(name, self.check_ids(ids), width)

    def _read(self, shard_id: int, name: str, rows: np.ndarray | list[int]) -> np.ndarray:
        """Rows ``rows`` of the array ``name`` of shard ``shard_id``, copied out of its map once its file's
        size is checked (:meth:`~patchword.search.shards.ShardArray.read_rows`), or
        :class:`ChangedShardError`."""
        try:
            return self._arrays[shard_id][name].read_rows(rows)
        except CutShortError as err:
            raise ChangedShardError(
                f"{err.file}: cut short in place since the index was opened ({err.problem}); replace shard "
                f"files by renaming a complete copy over them, or {REPAIR_HINT}"
            ) from None

    def _gather(self, name: str, ids: np.ndarray, width: int | None = None) -> np.ndarray:
        """:meth:`gather` of ids already checked."""
        first = next(iter(self._arrays.values()))[name]
        if width is None:
            width = first.shape[1] if first.ndim > 1 else 0
        shape = (len(ids), width, *first.shape[2:]) if first.ndim > 1 else (len(ids),)
        out = np.zeros(shape, dtype=first.dtype)
        shards, rows = self._shard_of[ids], self._row_of[ids]
        for shard_id in np.unique(shards):
            at = np.flatnonzero(shards == shard_id)
            part = self._read(int(shard_id), name, rows[at])
            if part.ndim > 1:
                part = part[:, :width]  # a shard may be padded wider than the rows asked for
                out[at, : part.shape[1]] = part
            else:
                out[at] = part
        return out

    def prefetch(self, ids: torch.Tensor | np.ndarray) -> None:
        """Ask the kernel to read now the rows ``ids`` of every array a re-ranking reads (``madvise``:
        :meth:`~patchword.search.shards.ShardArray.advise`).

        A row not in the page cache is a disk read; reading the shortlist row by row waits for each in
        turn, while advising all of them first lets the disk serve them together (an order of magnitude
        for cold rows: docs/benchmarks.md, "Numbers behind code choices"). Does nothing where ``madvise``
        is unavailable.
        """
        ids = self.check_ids(ids)
        shards, rows = self._shard_of[ids], self._row_of[ids]
        for shard_id in np.unique(shards).tolist():
            mine = rows[shards == shard_id]
            for name, array in self._arrays[shard_id].items():
                if name not in ("global", "patch_ids"):  # rows a search does not read
                    array.advise(mine)

    def _decoded(self, name: str, ids: np.ndarray, width: int | None = None) -> np.ndarray:
        """Rows ``ids`` of the token array ``name`` (``tokens`` / ``dense``), decoded to float32: only the
        rows asked for are read and decoded."""
        arrays = {suffix: self._gather(f"{name}{suffix}", ids, width) for suffix in self.codec.suffixes()}
        return self.codec.decode(arrays)

    def image_tokens(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        """(k,) index ids -> (k, L_v, C) float32 image tokens."""
        ids = self.check_ids(ids)
        return torch.from_numpy(self._decoded("tokens", ids))

    def dense_scores(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor | None:
        """(k,) index ids -> (k,) float32 precomputed dense scores, or None (not a ``scores`` index)."""
        ids = self.check_ids(ids)
        if self.dense_store != "scores":
            return None
        return torch.from_numpy(self._gather("dense_score", ids).astype(np.float32))

    @property
    def pruning(self) -> dict[str, Any] | None:
        """How the index pruned its patches (``Manifest.pruning``), or None."""
        return self.manifest.pruning

    def patch_priors(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor | None:
        """(k,) index ids -> (k, M) float32 selection priors of the kept patches, or None (not pruned)."""
        ids = self.check_ids(ids)
        if self.pruning is None:
            return None
        return torch.from_numpy(self._gather("patch_prior", ids).astype(np.float32))

    def patch_ids(self, ids: torch.Tensor | np.ndarray) -> torch.Tensor | None:
        """(k,) index ids -> (k, M) int64 grid positions of the kept patches, or None (not pruned)."""
        ids = self.check_ids(ids)
        if self.pruning is None:
            return None
        return torch.from_numpy(self._gather("patch_ids", ids).astype(np.int64))

    def dense_tokens(self, ids: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k,) index ids -> ((k, L_d, C) float32 dense tokens, (k,) int64 lengths), or None (no dense
        captions, or only their scores kept)."""
        ids = self.check_ids(ids)
        if self.dense_store != "tokens":
            return None
        lens = self._gather("dense_lens", ids).astype(np.int64)
        width = int(lens.max()) if lens.size else 1
        return torch.from_numpy(self._decoded("dense", ids, width)), torch.from_numpy(lens)

    def non_finite_files(self, ids: torch.Tensor | np.ndarray) -> dict[int, Path]:
        """Index id -> the first shard file holding a non-finite value in its rows, for each of ``ids``
        whose rows hold one (in the order given); reads those rows only."""
        found = {}
        for image_id in self.check_ids(ids).tolist():
            shard, row = int(self._shard_of[image_id]), int(self._row_of[image_id])
            for name, array in self._arrays[shard].items():
                if array.dtype.kind == "f" and not np.isfinite(self._read(shard, name, [row])).all():
                    found[image_id] = shard_files(self.index_dir, shard)[name]
                    break
        return found

    def bytes_per_image(self) -> float:
        """Bytes the shard files take per indexed image (all arrays), the rows no entry reads left out
        (:func:`dead_row_bytes`: an update not compacted yet keeps them)."""
        total = sum(
            f.stat().st_size
            for shard in self.manifest.shards
            for name, f in shard_files(self.index_dir, shard["id"]).items()
            if f.is_file()
        )
        return (total - dead_row_bytes(self.index_dir, self.manifest)) / max(1, len(self.entries))
