"""Build, update and resume a search index of a folder of images (``patchword index build``).

Each image is decoded once (threads), encoded in batches by the run's image encoder, and stored as its
L2-normalised global embedding (the first search stage) and its projected image tokens (what the fine
matcher re-scores); with a dense-caption file, each image's dense tokens too (SEPS reads them). Images
are processed in shards in path order; after each shard the shard files and then the manifest are
written atomically (:mod:`patchword.search.store`), so a build killed at any moment resumes where it
stopped and finishes with the same index an uninterrupted build writes.

``update=True`` rescans the folder: files whose size and mtime are unchanged keep their vectors, new and
changed files are encoded, deleted ones are dropped; when more than a quarter of the stored rows are
dead the shards are compacted (rows copied, nothing re-encoded). An index belongs to one model: opening
or updating it with other weights raises :class:`IndexMismatchError`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError, DataError, RunExistsError
from patchword.eval.engine.core import engine_for
from patchword.progress import progress_bar
from patchword.runs import LoadedRun, load_run
from patchword.search.build_report import BuildReport, no_images_message
from patchword.search.codecs import load_codec, make_codec
from patchword.search.encode import (
    ShardEncoder,
    codec_sample,
    dense_scores,
    prune_shard,
    read_dense_file,
    write_shard,
)
from patchword.search.identity import IndexMismatchError, check_index_model, model_identity, weights_sha256
from patchword.search.maintenance import COMPACT_DEAD_FRACTION, compact, drop_broken_shards, remove_orphans
from patchword.search.pruning import pruning_record
from patchword.search.query import fine_matcher
from patchword.search.scan import SkippedFile, scan_images
from patchword.search.store import (
    DENSE_STORES,
    DTYPES,
    MANIFEST_FILE,
    SHARDS_DIR,
    Entry,
    Manifest,
)

__all__ = [
    "BuildReport",
    "IndexMismatchError",
    "build_index",
    "check_index_model",
    "model_identity",
    "weights_sha256",
    "read_dense_file",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------
# Build / update / resume
# ---------------------------------------------------------------------------------------------------------


def _open_or_create(
    index_dir: Path,
    identity: dict[str, Any],
    images_root: Path,
    dtype: str | None,
    dense_file: Path | None,
    update: bool,
    dense_store: str | None = None,
) -> tuple[Manifest, bool]:
    """The manifest to continue (resume / update) or a new one; refuses what would mix two indexes."""
    if not (index_dir / MANIFEST_FILE).is_file():
        if index_dir.exists() and (not index_dir.is_dir() or any(index_dir.iterdir())):
            raise RunExistsError(f"--out {index_dir} exists and is not a search index; choose another --out")
        dense = None
        if dense_file is not None:
            dense = {"file": str(dense_file.resolve()), "max_len": identity["max_dense_len"]}
            dense["store"] = dense_store or "tokens"
        return Manifest(
            model=identity, images_root=str(images_root), dtype=dtype or "float32", dense=dense
        ), False
    manifest = Manifest.read(index_dir)
    check_index_model(manifest.model, identity, index_dir)
    if Path(manifest.images_root) != images_root:
        raise ConfigError(
            "--images", f"{index_dir} indexes {manifest.images_root}, not {images_root}; choose another --out"
        )
    if dtype is not None and dtype != manifest.dtype:
        raise ConfigError(
            "--store", f"{index_dir} stores {manifest.dtype} tokens; build a new index to change it"
        )
    if dense_file is not None and (
        manifest.dense is None or Path(manifest.dense["file"]) != dense_file.resolve()
    ):
        had = manifest.dense["file"] if manifest.dense else "no dense captions"
        raise ConfigError("--dense", f"{index_dir} was built with {had}; build a new index to change it")
    if dense_store is not None and dense_store != manifest.dense_store:
        raise ConfigError(
            "--dense-store",
            f"{index_dir} keeps dense {manifest.dense_store or 'nothing'}; build a new index to change it",
        )
    resumed = manifest.state == "building"
    if manifest.state == "complete" and not update:
        raise RunExistsError(
            f"{index_dir} already holds a complete index; pass --update to add new and changed images "
            "(and drop deleted ones), or choose another --out"
        )
    return manifest, resumed


def _has_dense_scores(engine, identity: dict[str, Any]) -> bool:
    """Whether the fine matcher's dense part is one number per image (probed on one zero image)."""
    image = torch.zeros(1, identity["image_tokens"], identity["embed_dim"])
    dense = torch.zeros(1, 2, identity["embed_dim"])
    return engine.image_constants(image, dense, torch.tensor([2]), device="cpu") is not None


def _pruning(manifest: Manifest, engine, keep_patches: float | None, index_dir: Path) -> int | None:
    """Patches kept per image (None: all), recording a new index's choice in ``manifest``; refuses a
    choice that differs from an existing index's."""
    if manifest.shards or manifest.entries:  # an existing index keeps what it was built with
        had = manifest.pruning
        if keep_patches is not None and (had is None or had["fraction"] != keep_patches):
            kept = f"keeps {had['fraction']} of its patches" if had else "keeps every patch"
            raise ConfigError("--keep-patches", f"{index_dir} {kept}; build a new index to change it")
        return None if had is None else int(had["kept"])
    manifest.pruning = None
    if keep_patches is None:
        return None
    record = pruning_record(engine, keep_patches)  # validates the fraction and that the matcher can prune
    if record["kept"] == record["of"]:
        return None  # every patch kept: an index like any other
    manifest.pruning = record
    return int(record["kept"])


def build_index(
    run: LoadedRun | str | os.PathLike[str],
    images: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    *,
    update: bool = False,
    dtype: str | None = None,
    dense: str | os.PathLike[str] | None = None,
    dense_store: str | None = None,
    pq_bytes: int | None = None,
    keep_patches: float | None = None,
    batch_size: int = 64,
    shard_size: int = 2048,
    workers: int | None = None,
    device: str | torch.device = "cpu",
    checkpoint: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> BuildReport:
    """Index the images under ``images`` with ``run``'s model into ``index_dir``.

    Args:
        run: a loaded run, or a run directory (loaded with ``checkpoint`` on ``device``).
        images: the folder to index (recursively; images found by content).
        index_dir: where the index goes. A new build needs it absent or empty; an existing complete
            index needs ``update``; an interrupted build is resumed.
        update: refresh an existing index: encode new and changed files, drop deleted ones.
        dtype: the token store of the shards, one of :data:`~patchword.search.codecs.STORES` (float32,
            float16, int8, pq; None: float32 for a new
            index, the index's own for an existing one).
        dense: dense-caption JSONL (see :func:`read_dense_file`); images without a line are skipped.
            An existing index keeps the file it was built with.
        pq_bytes: ``pq`` store: bytes (sub-quantisers) per token, which must divide the token width
            (default: one per 8 dimensions, at most 64). A new index only.
        dense_store: what the index keeps of the dense captions (``DENSE_STORES``): ``tokens``
            (default) or ``scores``, the per-image score they give, computed once here (exact,
            for a matcher whose dense part depends on the image alone: SEPS as released; refused otherwise).
        keep_patches: SEPS / LAPS: store only this fraction of each image's patches, those with the
            highest image-only selection score (:mod:`patchword.search.pruning`: an approximation, recorded
            in the manifest; None: every patch for a new index, the index's own choice for an existing one).
        batch_size: images per encoder batch.
        shard_size: images per shard (the unit of resumption).
        workers: decoding threads (default: min(4, CPU count)).
        device, checkpoint: used when ``run`` is a directory.
        progress: progress bar (default: only on a terminal).

    Returns:
        :class:`BuildReport`.

    Raises:
        IndexMismatchError: ``index_dir`` was built by another model.
        RunExistsError: ``index_dir`` holds something else, or a complete index without ``update``.
        DataError: ``images`` holds no image (nothing is written).
        ConfigError: ``--images`` / ``--fp16`` / ``--dense`` disagree with the existing index, or the model
            cannot read images.
    """
    start = time.perf_counter()
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError("--store", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if batch_size < 1 or shard_size < 1:
        raise ConfigError("--batch-size", "batch and shard sizes must be positive")
    if pq_bytes is not None and (dtype != "pq" or pq_bytes < 1):
        raise ConfigError(
            "--pq-bytes", "sets the pq store's bytes per token: give --store pq and a positive count"
        )
    if dense_store is not None and dense_store not in DENSE_STORES:
        raise ConfigError("--dense-store", f"must be one of {', '.join(DENSE_STORES)}, got {dense_store!r}")
    if not isinstance(run, LoadedRun):
        run = load_run(run, checkpoint, device=device)
    identity = model_identity(run)
    images_root = Path(images).expanduser().resolve()
    index_dir = Path(index_dir).expanduser()
    dense_file = Path(dense).expanduser() if dense is not None else None
    if dense_store == "scores" and dense_file is None and not (index_dir / MANIFEST_FILE).is_file():
        raise ConfigError("--dense-store", "scores are computed from dense captions: give --dense FILE")
    manifest, resumed = _open_or_create(
        index_dir, identity, images_root, dtype, dense_file, update, dense_store
    )
    if pq_bytes is not None and identity["embed_dim"] % pq_bytes:
        raise ConfigError(
            "--pq-bytes",
            f"{pq_bytes} sub-quantisers do not divide the model's {identity['embed_dim']}-d tokens",
        )
    kept_m = (manifest.codec or {}).get("pq_m")
    if pq_bytes is not None and kept_m is not None and kept_m != pq_bytes:
        raise ConfigError(
            "--pq-bytes", f"{index_dir} stores {kept_m} bytes per token; build a new index to change it"
        )
    engine = engine_for(fine_matcher(run.model.matcher))
    keep = _pruning(manifest, engine, keep_patches, index_dir)
    store_scores = manifest.dense_store == "scores"
    if store_scores and not _has_dense_scores(engine, identity):
        raise ConfigError(
            "--dense-store",
            f"scores: {run.run_dir}'s matcher ({run.config.model.matcher}) has no per-image dense score "
            "(its dense text enters every pair's selection, as in SEPS's paper variant): use --dense-store "
            "tokens",
        )
    # Scanned before anything is written: a folder without images is an error, not an empty index (nor,
    # for --update, an index emptied of every entry).
    scan = scan_images(images_root, exclude=index_dir)
    if not scan.images:
        raise DataError(no_images_message(images_root, scan.skipped, scan.ignored))
    drop_broken_shards(index_dir, manifest)
    manifest.state = "building"
    created = not index_dir.exists()
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / SHARDS_DIR).mkdir(exist_ok=True)
    try:
        manifest.write(index_dir)
    except BaseException:
        # Nothing to resume yet (the first manifest is what makes the directory an index): leave nothing.
        if created:
            shutil.rmtree(index_dir, ignore_errors=True)
        raise
    remove_orphans(index_dir, manifest)
    reads_dense = run.model.matcher.consumes_dense and run.config.data.dense
    if dense_file is None and manifest.dense is None and reads_dense:
        logger.warning(
            "%s was trained with dense captions but no --dense file was given: the fine stage will score "
            "without them, which is not how the model was evaluated",
            run.run_dir,
        )
    dense_texts = read_dense_file(manifest.dense["file"]) if manifest.dense else None

    report = BuildReport(index_dir=index_dir, resumed=resumed, ignored=scan.ignored)
    scanned = {f.path: f for f in scan.images}
    kept = [
        e
        for e in manifest.entries
        if e.path in scanned and (scanned[e.path].size, scanned[e.path].mtime_ns) == (e.size, e.mtime_ns)
    ]
    report.removed = len(manifest.entries) - len(kept)
    report.kept = len(kept)
    kept_paths = {e.path for e in kept}
    # Files that failed to decode before are not retried until they change (a resumed build then
    # writes exactly the shards an uninterrupted one would have).
    failed_before = {
        s.path: s
        for s in manifest.skipped
        if s.size is not None
        and s.path in scanned
        and (scanned[s.path].size, scanned[s.path].mtime_ns) == (s.size, s.mtime_ns)
    }
    skipped = list(scan.skipped) + list(failed_before.values())
    todo = []
    for file in scan.images:
        if file.path in kept_paths or file.path in failed_before:
            continue
        if dense_texts is not None and file.path not in dense_texts:
            skipped.append(SkippedFile(file.path, f"no dense caption in {manifest.dense['file']}"))
            continue
        todo.append(file)
    manifest.entries = kept
    manifest.skipped = sorted(skipped, key=lambda s: s.path)
    manifest.write(index_dir)
    if resumed:
        logger.info("resuming %s: %d images done, %d to encode", index_dir, len(kept), len(todo))

    t_encode = time.perf_counter()
    workers = workers or min(4, os.cpu_count() or 1)
    with (
        ThreadPoolExecutor(workers, thread_name_prefix="patchword-decode") as pool,
        progress_bar(len(todo), "index images", progress, unit="img") as bar,
    ):
        encoder = ShardEncoder(run, images_root, batch_size, pool, dense_texts)
        codec = load_codec(index_dir, manifest.dtype) if manifest.shards else None
        for first in range(0, len(todo), shard_size):
            encoded = encoder.encode(todo[first : first + shard_size], bar.update)
            skipped += encoded.failed
            if encoded.files:
                # the dense scores read every patch: computed before pruning (exact either way)
                scores = dense_scores(engine, encoded, run.device) if store_scores else None
                pruned = prune_shard(engine, encoded, keep, run.device) if keep else None
                if codec is None:  # the first shard: a quantiser trains on its tokens, once per index
                    sample = codec_sample(encoded, dense=not store_scores) if manifest.dtype == "pq" else None
                    codec = make_codec(manifest.dtype, sample, pq_m=pq_bytes)
                    codec.save(index_dir)
                    manifest.codec = codec.describe()
                shard_id = manifest.next_shard
                rows = write_shard(index_dir, shard_id, encoded, codec, scores, pruned)
                manifest.shards.append({"id": shard_id, "rows": rows})
                manifest.next_shard += 1
                manifest.entries += [
                    Entry(f.path, f.size, f.mtime_ns, f.format, shard_id, row)
                    for row, f in enumerate(encoded.files)
                ]
                report.added += rows
            manifest.skipped = sorted(skipped, key=lambda s: s.path)
            manifest.write(index_dir)
    report.encode_seconds = time.perf_counter() - t_encode

    total_rows = sum(s["rows"] for s in manifest.shards)
    if total_rows and total_rows - len(manifest.entries) > COMPACT_DEAD_FRACTION * total_rows:
        compact(index_dir, manifest, shard_size)
        report.compacted = True
    manifest.state = "complete"
    manifest.write(index_dir)
    remove_orphans(index_dir, manifest)
    report.num_images = len(manifest.entries)
    report.skipped = manifest.skipped
    report.pruning = manifest.pruning
    report.seconds = time.perf_counter() - start
    return report
