"""Splitting an image list over processes, and joining their output files back together.

A shard is a contiguous range of the image list cut at batch boundaries: shard ``I`` of ``N`` gets batches
``[I*B/N, (I+1)*B/N)`` of the ``B`` batches. Every shard therefore forms exactly the batches a single run
with the same batch size forms, and the merged shards equal that run's file.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchword.densify.fingerprint import FIELD as FINGERPRINT
from patchword.densify.fingerprint import model_mismatch, unverified
from patchword.densify.lock import lock_path, output_lock
from patchword.densify.sources import fingerprint
from patchword.densify.store import (
    DenseRecord,
    check_output_path,
    read_records,
    read_sidecar,
    sidecar_path,
    write_records_atomic,
    write_sidecar,
)
from patchword.errors import ConfigError, DataError, RunExistsError
from patchword.fileio import fsync_directory, staging_dir, staging_dirs
from patchword.readers import require_file

__all__ = [
    "Shard",
    "parse_shard",
    "shard_from_env",
    "shard_output_path",
    "merge_shards",
    "check_merge_ready",
    "check_shard_sidecar",
    "read_checked_sidecar",
]

logger = logging.getLogger(__name__)

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (0-based) of ``count``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError("--shard", f"need 0 <= I < N in I/N, got {self.index}/{self.count}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def image_range(self, num_images: int, batch_size: int) -> tuple[int, int]:
        """``(start, stop)``: this shard's images, whole batches of ``batch_size`` counted from image 0."""
        num_batches = math.ceil(num_images / batch_size)
        first = self.index * num_batches // self.count
        last = (self.index + 1) * num_batches // self.count
        return min(first * batch_size, num_images), min(last * batch_size, num_images)


def parse_shard(text: str) -> Shard:
    """``"I/N"`` -> :class:`Shard` (``I`` counts from 0: ``0/2`` and ``1/2`` are the two halves).

    Raises:
        ConfigError: anything else, e.g. ``"1-2"``, ``"2/2"`` or ``"0/0"``.
    """
    match = _SHARD_RE.match(text)
    if not match:
        raise ConfigError("--shard", f"expected I/N with 0 <= I < N (e.g. 0/4), got {text!r}")
    return Shard(int(match.group(1)), int(match.group(2)))


def shard_from_env(environ: Mapping[str, str] | None = None) -> Shard | None:
    """The shard of this process under ``torchrun`` (``RANK`` of ``WORLD_SIZE``), or None outside it."""
    environ = os.environ if environ is None else environ
    world = environ.get("WORLD_SIZE")
    if world is None or int(world) <= 1:
        return None
    return Shard(int(environ.get("RANK", "0")), int(world))


def shard_output_path(out: str | os.PathLike[str], shard: Shard) -> Path:
    """``dense.jsonl`` -> ``dense.shard-1-of-4.jsonl`` (the per-rank files of a torchrun job)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.shard-{shard.index}-of-{shard.count}{out.suffix}")


# --------------------------------------------------------------------------------------------------------
# Merge
# --------------------------------------------------------------------------------------------------------

# Sidecar fields every shard of one job shares (what was generated, from which list); the model's files too,
# by fingerprint, through model_mismatch (a shard of an older patchword records none: --model decides then).
# (Paths, "model" and "source", may differ: shards of one job can run on machines with other mounts.)
_SHARED_FIELDS = ("model_id", "generation", "precision", "num_images", "images_sha256")


@dataclass
class _ShardFile:
    path: Path
    meta: dict
    records: list[DenseRecord]
    torn: int

    @property
    def expected(self) -> int:
        return int(self.meta["stop"]) - int(self.meta["start"])


def _read_shard(path: Path) -> _ShardFile:
    require_file(path, "shard file", hint="merge joins densify output files")
    meta = read_checked_sidecar(path)
    if meta is None:
        raise DataError(
            f"{path} has no {path.name}.densify.json next to it: merge joins only files written by "
            "`patchword densify` (the sidecar says which images each shard holds)"
        )
    records, torn = read_records(path)
    return _ShardFile(path, meta, records, torn)


def read_checked_sidecar(path: str | os.PathLike[str]) -> dict | None:
    """The sidecar of the densify output ``path`` with the fields merge relies on checked
    (:func:`check_shard_sidecar`: a damaged image range is named, never used), or None when it has none.

    Raises:
        DataError: the sidecar is malformed or a field is missing or invalid.
    """
    meta = read_sidecar(path)
    if meta is not None:
        check_shard_sidecar(Path(path), meta)
    return meta


def check_shard_sidecar(path: Path, meta: dict) -> None:
    """The sidecar fields merge relies on must be there and make sense (a hand-edited sidecar is named).

    Raises:
        DataError: a field is missing or of the wrong kind, or the range is not ``0 <= start <= stop <= n``.
    """
    where = sidecar_path(path)
    for key in ("num_images", "start", "stop"):
        value = meta.get(key)
        if key not in meta:
            raise DataError(f"{where}: missing key {key!r} (the sidecar was edited or damaged)")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"{where}: {key!r} must be a non-negative integer, got {value!r}")
    for key in ("shard", "images_sha256"):
        if key not in meta:
            raise DataError(f"{where}: missing key {key!r} (the sidecar was edited or damaged)")
        if not isinstance(meta[key], str):
            raise DataError(f"{where}: {key!r} must be a string, got {meta[key]!r}")
    if not meta["start"] <= meta["stop"] <= meta["num_images"]:
        raise DataError(
            f"{where}: invalid image range: start {meta['start']}, stop {meta['stop']}, "
            f"num_images {meta['num_images']} (expected start <= stop <= num_images)"
        )


def _check_compatible(shards: Sequence[_ShardFile]) -> None:
    first = shards[0]
    for other in shards[1:]:
        for key in _SHARED_FIELDS:
            if other.meta.get(key) != first.meta.get(key):
                raise DataError(
                    f"{other.path} and {first.path} come from different jobs: their {key!r} differ "
                    f"({other.meta.get(key)!r} vs {first.meta.get(key)!r})"
                )
        other_model = model_mismatch(first.meta, other.meta)
        if other_model is not None:
            raise DataError(f"{other.path} and {first.path} come from different models: {other_model}")
        configs = [synthetic_config(shard.meta.get("source")) for shard in (other, first)]
        if configs[0] != configs[1]:  # synthetic scenes: the generator config draws them, not their ids
            raise DataError(
                f"{other.path} and {first.path} come from different jobs: their synthetic scenes' configs "
                f"differ ({configs[0]!r} vs {configs[1]!r})"
            )
    if unverified(*(shard.meta for shard in shards)):
        logger.warning(
            "some shards record no model fingerprint (files of an older patchword): merged as one model "
            "because their --model values are equal (%r), without checking its files",
            first.meta.get("model"),
        )


def synthetic_config(source: object) -> dict | None:
    """The generator config a sidecar's ``source`` records for synthetic scenes (``None`` for files of
    images, or a damaged entry)."""
    if not isinstance(source, dict) or source.get("kind") != "synthetic":
        return None
    config = source.get("config")
    return config if isinstance(config, dict) else None


def _batch_sizes(shards: Sequence[_ShardFile]) -> str:
    """Why ranges may not meet: the shards' first runs used different batch sizes ("" when they agree)."""
    sizes = {shard.path: shard.meta.get("batch_size") for shard in shards}
    if len(set(sizes.values())) < 2:
        return ""
    each = ", ".join(f"{size} in {path}" for path, size in sizes.items())
    return (
        f" (the shards were made with different --batch-size: {each}; a shard's image range is cut at "
        "batch boundaries, so every shard of a job needs the same --batch-size)"
    )


def _check_tiling(shards: Sequence[_ShardFile]) -> None:
    """The shards' ranges must cover [0, num_images) exactly once, and each shard must be complete."""
    num_images = int(shards[0].meta["num_images"])
    position = 0
    for shard in shards:
        start, stop = int(shard.meta["start"]), int(shard.meta["stop"])
        name = f"{shard.path} (shard {shard.meta['shard']}, images {start}..{stop - 1})"
        if start > position:
            raise DataError(
                f"gap: images {position}..{start - 1} of {num_images} are in none of the shards given"
                + _batch_sizes(shards)
            )
        if start < position:
            raise DataError(
                f"duplicate: {name} overlaps the shard before it (which ends at image {position - 1})"
                + _batch_sizes(shards)
            )
        done = len(shard.records)
        if done > shard.expected:  # rerunning its command adds nothing: the advice below would fail
            raise DataError(
                f"{name} holds {done} lines but its range has {shard.expected} images: extra or foreign "
                "lines (another shard's, a repeated or hand-added one); remove them, or rerun its densify "
                "command into a new file"
            )
        if done != shard.expected:
            raise DataError(
                f"{name} is incomplete: {done} of {shard.expected} images done; rerun its densify command to "
                "finish it (finished images are kept)"
            )
        position = stop
    if position < num_images:
        raise DataError(
            f"gap: images {position}..{num_images - 1} of {num_images} are in none of the shards given"
            + _batch_sizes(shards)
        )


def check_merge_ready(paths: Sequence[str | os.PathLike[str]]) -> list[DenseRecord]:
    """Validate shard files and return their records in image order (see :func:`merge_shards`)."""
    if not paths:
        raise ConfigError("merge", "no shard files given")
    shards = [_read_shard(Path(p)) for p in paths]
    _check_compatible(shards)
    shards.sort(key=lambda s: (int(s.meta["start"]), int(s.meta["stop"])))
    _check_tiling(shards)
    records = [r for s in shards for r in s.records]
    seen: dict[str, Path] = {}
    for shard in shards:
        for record in shard.records:
            if record.image_id in seen:
                raise DataError(
                    f"duplicate: image {record.image_id!r} is in {seen[record.image_id]} and {shard.path}"
                )
            seen[record.image_id] = shard.path
    if fingerprint([r.image_id for r in records]) != shards[0].meta["images_sha256"]:
        raise DataError(
            "the shards' image ids are not the image list they were made from (a shard file was edited, or "
            "holds images out of order)"
        )
    return records


def merge_shards(
    paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, force: bool = False
) -> int:
    """Join the shard files of one job into ``out``, in image order; returns the number of lines.

    The shards may be given in any order: their sidecars say which range of the image list each holds.
    ``out`` gets a sidecar too, so it is itself a finished densify output (a rerun of the single-process
    command on it has nothing to do).

    Raises:
        DataError: shards of different jobs or settings, a gap or an overlap between ranges, an incomplete
            shard, an image id in two shards, or ids that differ from the job's image list.
        RunExistsError: ``out`` exists and ``force`` is False, or another process writes it now (its lock
            ``<out>.lock`` is held).
        ConfigError: ``out`` is a shard, a directory, or in a folder that takes no files (before any work).
    """
    out = Path(out)
    _refuse_shard_files(paths, out)
    check_output_path(out)  # before the lock and before the shards are read and staged
    # The lock every densify command holds on its output: a merge (rank 0's under torchrun included) must
    # not write --out while another command runs or merges into it. A refused merge takes back the lock
    # file and the folders it made (see patchword.densify.lock).
    with output_lock(out):
        if out.exists() and not force:
            raise RunExistsError(f"{out} exists; pass --force to overwrite it or choose another --out")
        _remove_stale_stages(out)
        records = check_merge_ready(paths)
        meta = read_sidecar(paths[0])
        assert meta is not None
        num_images = int(meta["num_images"])
        kept = ("model", FINGERPRINT, *_SHARED_FIELDS, "source", "batch_size", "device")
        merged = {key: meta.get(key) for key in kept}
        _replace_output(out, records, {**merged, "shard": "0/1", "start": 0, "stop": num_images})
    logger.info("merged %d shards into %s (%d lines)", len(paths), out, len(records))
    return len(records)


def _refuse_shard_files(paths: Sequence[str | os.PathLike[str]], out: Path) -> None:
    """What the merge writes (``out``, its sidecar, its lock) is none of the files of a shard it reads (the
    shard, its sidecar, its lock): ``--out a.jsonl.densify.json --force`` replaced shard ``a.jsonl``'s
    sidecar, so the shard no longer said what it holds.

    Raises:
        ConfigError: naming ``--out``, the shard and which of its files.
    """

    def files(path: Path) -> dict[Path, str]:
        return {path: "", sidecar_path(path): "sidecar", lock_path(path): "lock"}

    writes = {path.expanduser().resolve(): (path, kind) for path, kind in files(out).items()}
    for shard in map(Path, paths):
        for path, kind in files(shard).items():
            hit = writes.get(path.expanduser().resolve())
            if hit is None:
                continue
            written, written_kind = hit
            what = f"{out}'s {written_kind} {written}" if written_kind else str(out)
            read = (
                f"the {kind} of shard {shard}, which the merge reads"
                if kind
                else "one of the shards being merged"
            )
            raise ConfigError("--out", f"{what} is {read}: choose another --out")


_STAGE_LABEL = "merge"


def _replace_output(out: Path, records: Sequence[DenseRecord], meta: dict) -> None:
    """Put ``records`` and their sidecar ``meta`` at ``out`` so that no moment pairs a sidecar with lines
    it does not describe, a kill included.

    Both files are written in full (and flushed to disk) in a staging folder beside ``out`` first, so a
    full disk or any error leaves the old output and its sidecar as they were. Then the old output goes,
    the new sidecar comes, and the new output last: a kill in between leaves a sidecar without an output,
    which a rerun of densify treats as a fresh start (its own sidecar replaces it) and a rerun of the merge
    overwrites without ``--force``. Replacing the sidecar while the old lines were still there is what
    made a rerun with the new settings find "nothing left to generate" in the old text.
    """
    stage = Path(staging_dir(out, _STAGE_LABEL))
    try:
        write_records_atomic(stage / out.name, records)
        write_sidecar(stage / out.name, meta)
        out.unlink(missing_ok=True)
        os.replace(sidecar_path(stage / out.name), sidecar_path(out))
        os.replace(stage / out.name, out)
        fsync_directory(out.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _remove_stale_stages(out: Path) -> None:
    """Remove the staging folders of merges into ``out`` that were killed (only merges make them, and
    only under ``out``'s lock, which the caller holds: none of them belongs to a live merge)."""
    for path in staging_dirs(out, _STAGE_LABEL):
        shutil.rmtree(path, ignore_errors=True)
