"""Build, update and resume a search index of a folder of images (``patchword index build``).

Each image is decoded once (threads), encoded in batches by the run's image encoder, and stored as its
L2-normalised global embedding (the first search stage) and its projected image tokens (what the fine
matcher re-scores); with a dense-caption file, each image's dense tokens too (SEPS reads them). Images
are processed in shards in path order; after each shard the shard files and then the manifest are
written atomically (:mod:`patchword.search.manifest`), so a build killed at any moment resumes where it
stopped and finishes with the same index an uninterrupted build writes.

``update=True`` rescans the folder: files whose size and mtime are unchanged keep their vectors, new and
changed files are encoded, deleted ones are dropped; when more than a quarter of the stored rows are
dead the shards are compacted (rows copied, nothing re-encoded). An index belongs to one model: opening
or updating it with other weights raises :class:`IndexMismatchError`.

:func:`build_index` is :func:`plan_build` (every check: nothing written) then :func:`write_build`: a command
that does more than the build (``index build --qdrant`` opens its Qdrant store) does its own part between
the two, so a refused flag is reported first and leaves nothing behind.

Its parts: :mod:`~patchword.search.build_open` (``--out`` and the manifest a build continues or starts),
:mod:`~patchword.search.build_checks` (the settings' checks), :mod:`~patchword.search.build_files` (which
files are encoded, which entries kept or dropped), :mod:`~patchword.search.build_lock` (one build of an index
at a time), :mod:`~patchword.search.build_plan` (what a checked build writes).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from patchword.errors import DataError
from patchword.eval.engine.core import engine_for
from patchword.fileio import atomic_write_bytes
from patchword.progress import progress_bar
from patchword.runs import LoadedRun, load_run
from patchword.search.build_checks import (
    check_dense_read,
    check_dense_scores,
    check_pq_bytes,
    check_pq_sample,
    check_settings,
    kept_patches,
)
from patchword.search.build_files import against_live, choose_files, new_entries
from patchword.search.build_lock import build_lock, manifest_stamps
from patchword.search.build_open import check_out, index_dense_texts, open_or_create
from patchword.search.build_plan import BuildPlan
from patchword.search.build_report import BuildReport, no_images_message, nothing_indexed_message
from patchword.search.codecs import check_store, load_codec, make_codec
from patchword.search.encode import (
    ShardEncoder,
    check_dense_words,
    codec_sample,
    dense_scores,
    prune_shard,
    read_dense_file,
    write_shard,
)
from patchword.search.fidelity import reads_index_dense
from patchword.search.identity import IndexMismatchError, check_index_model, model_identity, weights_sha256
from patchword.search.maintenance import COMPACT_DEAD_FRACTION, compact, drop_broken_shards, remove_orphans
from patchword.search.manifest import MANIFEST_FILE, PENDING_FILE, caption_digest
from patchword.search.query import fine_matcher
from patchword.search.scan import check_image_folder, scan_images
from patchword.search.shards import SHARDS_DIR

__all__ = [
    "BuildPlan",
    "BuildReport",
    "IndexMismatchError",
    "build_index",
    "plan_build",
    "write_build",
    "check_index_model",
    "model_identity",
    "weights_sha256",
    "read_dense_file",
]

logger = logging.getLogger(__name__)


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
            index needs ``update``; an interrupted build is resumed (one stopped before it stored any
            image is started again, with this call's settings).
        update: refresh an existing index: encode new and changed files, drop deleted ones.
        dtype: the token store of the shards, one of :data:`~patchword.search.codecs.STORES` (float32,
            float16, int8, pq; None: float32 for a new
            index, the index's own for an existing one).
        dense: dense-caption JSONL (see :func:`read_dense_file`); images without a line are skipped.
            An existing index keeps the file it was built with. Refused for a run whose searches never read
            an index's dense text (a matcher that ignores dense text, or ties it to captions).
        pq_bytes: ``pq`` store: bytes (sub-quantisers) per token, which must divide the token width
            (default: one per 8 dimensions, at most 64). A new index only.
        dense_store: what the index keeps of the dense captions (``DENSE_STORES``): ``tokens``
            (default) or ``scores``, the per-image score they give, computed once here (exact,
            for a matcher whose dense part depends on the image alone: SEPS as released, image-tied;
            refused otherwise).
        keep_patches: SEPS / LAPS: store only this fraction of each image's patches, those with the
            highest image-only selection score (:mod:`patchword.search.pruning`: an approximation, recorded
            in the manifest; None: every patch for a new index, the index's own choice for an existing one).
        batch_size: images per encoder batch.
        shard_size: images per shard (the unit of resumption).
        workers: decoding threads (None or 0: min(4, CPU count)).
        device, checkpoint: used when ``run`` is a directory.
        progress: progress bar (default: only on a terminal).

    Returns:
        :class:`BuildReport`.

    Raises:
        IndexMismatchError: ``index_dir`` was built by another model.
        RunExistsError: ``index_dir`` holds something else, or a complete index without ``update``.
        MissingFileError: no ``images`` folder, ``dense`` file, run or checkpoint.
        DataError: ``images`` holds no image, or none that can be indexed (every one fails to decode or has
            no dense caption: no index is left, an updated one is put back as it was); a ``dense`` file that
            cannot be read, or with a caption to encode that the run's tokenizer finds no word in (its
            ``FILE:LINE``); a manifest in ``index_dir`` that cannot be read.
        ConfigError: a value out of its range (``--batch-size``, ``--shard-size``, ``--decode-workers``,
            ``--pq-bytes``, ``--keep-patches``...), ``--out`` where no index can be written, ``--images`` /
            ``--fp16`` / ``--dense`` disagreeing with the existing index, ``--dense`` / ``--dense-store
            scores`` for a run whose searches never read dense text, or a model that cannot read images.
        MissingExtraError: ``--store pq`` without FAISS.

    Each of these is raised before anything is written, and names the flag or file it is about. An
    ``OSError`` while the index is written (a full disk) names the file; the same call then resumes.
    """
    return write_build(
        plan_build(
            run,
            images,
            index_dir,
            update=update,
            dtype=dtype,
            dense=dense,
            dense_store=dense_store,
            pq_bytes=pq_bytes,
            keep_patches=keep_patches,
            batch_size=batch_size,
            shard_size=shard_size,
            workers=workers,
            device=device,
            checkpoint=checkpoint,
            progress=progress,
        )
    )


def plan_build(
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
) -> BuildPlan:
    """The checking part of :func:`build_index` (same arguments): every flag and file checked, the run loaded
    (when ``run`` is a directory), the index read and the folder scanned; nothing is written. Returns the
    :class:`~patchword.search.build_plan.BuildPlan` :func:`write_build` writes.

    Raises:
        what :func:`build_index` raises before it writes.
    """
    start = time.perf_counter()
    # Every flag and file is checked before anything is written: a refused command leaves --out as it was
    # (absent, or the index it held), so nothing a typo recorded can refuse the corrected command.
    check_settings(dtype, batch_size, shard_size, workers, pq_bytes, dense_store)
    images_root = check_image_folder(images).resolve()
    index_dir = Path(index_dir).expanduser()
    check_out(index_dir)
    dense_file = Path(dense).expanduser() if dense is not None else None
    if not isinstance(run, LoadedRun):
        run = load_run(run, checkpoint, device=device)
    fine = fine_matcher(run.model.matcher)
    # Dense text a search never reads (a matcher that ignores it, or ties it to captions) is refused before
    # its file is read: stored, it would only weigh on the index (and skip images without a line).
    check_dense_read(run, fine, dense_file is not None, dense_store)
    given_dense = read_dense_file(dense_file) if dense_file is not None else None
    identity = model_identity(run)
    seen = manifest_stamps(index_dir)  # before it is read: a build that writes it meanwhile is noticed
    manifest, resumed, live = open_or_create(
        index_dir, identity, images_root, dtype, dense_file, update, dense_store, reads_index_dense(fine)
    )
    check_pq_bytes(pq_bytes, identity, manifest, index_dir)
    engine = engine_for(fine)
    keep = kept_patches(manifest, engine, keep_patches, index_dir)
    store_scores = manifest.dense_store == "scores"
    if store_scores:
        check_dense_scores(engine, identity, run, fine)
    reads_dense = reads_index_dense(fine) and run.config.data.dense
    if dense_file is None and manifest.dense is None and reads_dense:
        logger.warning(
            "%s was trained with dense captions but no --dense file was given: the fine stage will score "
            "without them, which is not how the model was evaluated",
            run.run_dir,
        )
    if manifest.dense is None:
        dense_texts = None
    elif given_dense is not None:
        dense_texts = given_dense  # the index's own file (open_or_create refuses another)
    else:
        dense_texts = index_dense_texts(index_dir, manifest)
    # Scanned before anything is written: a folder without images is an error, not an empty index (nor,
    # for --update, an index emptied of every entry).
    scan = scan_images(images_root, exclude=index_dir)
    if not scan.images:
        raise DataError(no_images_message(images_root, scan.skipped, scan.ignored))
    drop_broken_shards(index_dir, manifest)
    codec = load_codec(index_dir, manifest.dtype) if manifest.shards else None
    if codec is None:
        check_store(manifest.dtype)  # pq: FAISS, which trains the quantiser on the first shard

    captions = None if dense_texts is None else {path: caption_digest(t) for path, t in dense_texts.items()}
    if captions is not None and any(e.dense_sha is None for e in manifest.entries):
        logger.warning(
            "%s does not record the dense captions its images were encoded with (built by an older "
            "patchword): those images are encoded again",
            index_dir,
        )
    files = choose_files(manifest, scan, dense_texts, captions, images_root)
    kept, dropped = against_live(live, files)  # a resumed update counts as the update it continues
    report = BuildReport(index_dir=index_dir, resumed=resumed, ignored=scan.ignored, kept=len(kept))
    report.added = report.encoded_before = len(files.kept) - len(kept)
    if dense_texts is not None:  # a caption without words met in the last shard stopped a build part-way
        check_dense_words(run.tokenizer, dense_texts, [f.path for f in files.todo])
    if codec is None and manifest.dtype == "pq" and files.todo:
        check_pq_sample(
            identity, min(len(files.todo), shard_size), dense_texts is not None and not store_scores
        )

    return BuildPlan(
        run=run,
        images_root=images_root,
        index_dir=index_dir,
        manifest=manifest,
        live=live,
        report=report,
        kept=files.kept,
        dropped=dropped,
        todo=files.todo,
        skipped=files.skipped,
        captions=captions,
        dense_texts=dense_texts,
        codec=codec,
        engine=engine,
        keep=keep,
        store_scores=store_scores,
        pq_bytes=pq_bytes,
        batch_size=batch_size,
        shard_size=shard_size,
        workers=workers or min(4, os.cpu_count() or 1),
        progress=progress,
        seen=seen,
        start=start,
    )


def write_build(plan: BuildPlan) -> BuildReport:
    """The writing part of :func:`build_index`: write the index ``plan`` (:func:`plan_build`) checked, under
    the index's lock (refused when another build wrote the index since it was read). Returns its
    :class:`BuildReport`.

    Raises:
        RunExistsError: another build holds the index, or wrote it since the plan read it.
        DataError: every image to encode failed to decode (the index is left as it was).
    """
    index_dir, manifest, report = plan.index_dir, plan.manifest, plan.report
    # Everything checked: from here on the index is written (the first manifest makes --out an index).
    created = not index_dir.exists()
    index_dir.mkdir(parents=True, exist_ok=True)
    with build_lock(index_dir, plan.seen):
        _write_index(plan, created=created)
    report.tally(manifest, plan.dropped)
    report.seconds = time.perf_counter() - plan.start
    return report


def _write_index(plan: BuildPlan, *, created: bool) -> None:
    """The writing part of :func:`build_index`, everything checked (``plan``) and the index's lock held:
    encode ``plan.todo`` shard by shard after the ``plan.kept`` entries, compact, mark the index complete.
    ``plan.manifest`` ends as the one written; ``plan.live``: the complete manifest an update starts from
    (progress then goes to :data:`PENDING_FILE`, and ``manifest.json`` is replaced last); ``created``: the
    index directory was made by this build (removed when nothing could be written)."""
    run, images_root, index_dir, manifest = plan.run, plan.images_root, plan.index_dir, plan.manifest
    live, report, kept, todo, skipped = plan.live, plan.report, plan.kept, plan.todo, plan.skipped
    captions, dense_texts, codec, engine = plan.captions, plan.dense_texts, plan.codec, plan.engine
    keep, store_scores, pq_bytes, shard_size = plan.keep, plan.store_scores, plan.pq_bytes, plan.shard_size
    save = functools.partial(manifest.write, name=MANIFEST_FILE if live is None else PENDING_FILE)
    manifest.state = "building"
    manifest.entries = kept
    manifest.skipped = sorted(skipped, key=lambda s: s.path)
    manifest_file = index_dir / MANIFEST_FILE
    # a resumed first build: put back if every file fails to decode (only possible when no entry is kept)
    previous = manifest_file.read_bytes() if not kept and live is None and manifest_file.is_file() else None
    (index_dir / SHARDS_DIR).mkdir(exist_ok=True)
    try:
        save(index_dir)
    except BaseException:
        # Nothing to resume yet (the first manifest is what makes the directory an index): leave nothing.
        if created:
            shutil.rmtree(index_dir, ignore_errors=True)
        raise
    kept_shards = (manifest,) if live is None else (manifest, live)  # searches read ``live`` meanwhile
    remove_orphans(index_dir, *kept_shards)
    if report.resumed:
        logger.info("resuming %s: %d images done, %d to encode", index_dir, len(kept), len(todo))

    t_encode = time.perf_counter()
    with (
        ThreadPoolExecutor(plan.workers, thread_name_prefix="patchword-decode") as pool,
        progress_bar(len(todo), "index images", plan.progress, unit="img") as bar,
    ):
        encoder = ShardEncoder(run, images_root, plan.batch_size, pool, dense_texts)
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
                    if sample is not None:  # the report says when FAISS advised more
                        report.pq_sample = (len(sample), len(encoded.files))
                    codec.save(index_dir)
                    manifest.codec = codec.describe()
                shard_id = manifest.next_shard
                rows = write_shard(index_dir, shard_id, encoded, codec, scores, pruned)
                manifest.shards.append({"id": shard_id, "rows": rows})
                manifest.next_shard += 1
                manifest.entries += new_entries(encoded.files, shard_id, captions)
                report.added += rows
            manifest.skipped = sorted(skipped, key=lambda s: s.path)
            save(index_dir)
    report.encode_seconds = time.perf_counter() - t_encode
    if not manifest.entries:  # every file failed to decode: no index rather than an empty one
        if created:
            shutil.rmtree(index_dir, ignore_errors=True)
        elif live is not None:  # manifest.json is the index as it was
            (index_dir / PENDING_FILE).unlink(missing_ok=True)
        elif previous is None:
            manifest_file.unlink(missing_ok=True)
        else:
            atomic_write_bytes(manifest_file, previous)
        left = live is not None or previous is not None
        outcome = f"{index_dir} was left as it was" if left else "nothing was written"
        raise DataError(nothing_indexed_message("--images", images_root, skipped, outcome))

    total_rows = sum(s["rows"] for s in manifest.shards)
    if total_rows and total_rows - len(manifest.entries) > COMPACT_DEAD_FRACTION * total_rows:
        compact(index_dir, manifest, shard_size)
        report.compacted = True
    manifest.state = "complete"
    manifest.write(index_dir)  # searches opened from here on read the new index
    if live is not None:
        (index_dir / PENDING_FILE).unlink(missing_ok=True)
    remove_orphans(index_dir, manifest)
