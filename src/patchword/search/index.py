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

Over 400 lines: building, updating and resuming an index, every check before the first write.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError, DataError, MissingFileError, RunExistsError, describe_os_error
from patchword.eval.engine.core import engine_for
from patchword.fileio import atomic_write_bytes, probe_writable
from patchword.locks import removable_lock
from patchword.progress import progress_bar
from patchword.runs import LoadedRun, load_run
from patchword.search.build_plan import BuildPlan
from patchword.search.build_report import BuildReport, no_images_message, nothing_indexed_message
from patchword.search.checks import DENSE_STORES
from patchword.search.codecs import PQ_MIN_TOKENS, check_store, load_codec, make_codec
from patchword.search.encode import (
    ShardEncoder,
    check_dense_words,
    codec_sample,
    dense_scores,
    prune_shard,
    read_dense_file,
    write_shard,
)
from patchword.search.identity import IndexMismatchError, check_index_model, model_identity, weights_sha256
from patchword.search.maintenance import COMPACT_DEAD_FRACTION, compact, drop_broken_shards, remove_orphans
from patchword.search.manifest import (
    DTYPES,
    LOCK_FILE,
    MANIFEST_FILE,
    PENDING_FILE,
    Entry,
    Manifest,
    caption_digest,
)
from patchword.search.pruning import pruning_record
from patchword.search.query import fine_matcher
from patchword.search.scan import ImageFile, SkippedFile, check_image_folder, scan_images
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


# ---------------------------------------------------------------------------------------------------------
# Build / update / resume
# ---------------------------------------------------------------------------------------------------------


def _new_manifest(
    identity: dict[str, Any],
    images_root: Path,
    dtype: str | None,
    dense_file: Path | None,
    dense_store: str | None,
) -> Manifest:
    if dense_store == "scores" and dense_file is None:
        raise ConfigError("--dense-store", "scores are computed from dense captions: give --dense FILE")
    dense = None
    if dense_file is not None:
        dense = {"file": str(dense_file.resolve()), "max_len": identity["max_dense_len"]}
        dense["store"] = dense_store or "tokens"
    return Manifest(model=identity, images_root=str(images_root), dtype=dtype or "float32", dense=dense)


def _empty_or_failed_start(index_dir: Path) -> bool:
    """Whether ``index_dir`` is a directory a new index may go in: empty, or holding only what a build
    killed before its first manifest leaves (an empty ``shards/``, the manifest's ``atomic_write``
    temporary files ``.manifest.json.*.tmp``, the build's lock file). Without the second case a build
    killed in its first moment would make every rerun refuse its own --out; the first manifest removes the
    temporary files (``remove_orphans``)."""
    if not index_dir.is_dir():
        return False
    for path in index_dir.iterdir():
        if path.is_symlink():
            return False
        name = path.name
        empty_shards = name == SHARDS_DIR and path.is_dir() and not any(path.iterdir())
        manifest_temp = name.startswith(f".{MANIFEST_FILE}.") and name.endswith(".tmp") and path.is_file()
        lock = name == LOCK_FILE and path.is_file()
        if not (empty_shards or manifest_temp or lock):
            return False
    return True


def _open_or_create(
    index_dir: Path,
    identity: dict[str, Any],
    images_root: Path,
    dtype: str | None,
    dense_file: Path | None,
    update: bool,
    dense_store: str | None = None,
) -> tuple[Manifest, bool, Manifest | None]:
    """The manifest to continue (resume / update) or a new one, whether it resumes a stopped build or
    update, and the complete manifest an update starts from (None for a first build: searches read that one
    until the update ends); refuses what would mix two indexes. Writes nothing."""
    if not (index_dir / MANIFEST_FILE).is_file():
        if index_dir.exists() and not _empty_or_failed_start(index_dir):
            raise RunExistsError(f"--out {index_dir} exists and is not a search index; choose another --out")
        return _new_manifest(identity, images_root, dtype, dense_file, dense_store), False, None
    manifest = live = Manifest.read(index_dir)
    if live.state != "complete":
        live = None  # a first build, stopped: it goes on in manifest.json
    elif (index_dir / PENDING_FILE).is_file():  # an update stopped part-way: resumed
        manifest = Manifest.read(index_dir, PENDING_FILE)
        manifest.state = "building"
    if live is None and not manifest.shards and not manifest.entries:
        # A first build stopped before it stored any image (killed, a full disk, a model that failed on
        # the first shard): there is nothing to keep, so nothing it recorded binds this command.
        logger.info("%s holds no image yet: starting it again with this command's settings", index_dir)
        return _new_manifest(identity, images_root, dtype, dense_file, dense_store), False, None
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
    return manifest, resumed, live


def _manifest_stamps(index_dir: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """(inode, size, mtime) of the manifest and the pending manifest (None: absent): what changes when a
    build writes either (atomically: a new inode)."""
    stamps = []
    for name in (MANIFEST_FILE, PENDING_FILE):
        try:
            st = os.stat(index_dir / name)
        except FileNotFoundError:
            stamps.append(None)
        else:
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


@contextlib.contextmanager
def _build_lock(index_dir: Path, seen: tuple[tuple[int, int, int] | None, ...]) -> Iterator[None]:
    """Hold the index's lock (:data:`LOCK_FILE`) for the block: one build or update of an index at a time.
    ``seen`` is :func:`_manifest_stamps` when this command read the index: a build that wrote it since then
    (and ended) refuses this one, whose checks read what is no longer there. The lock file is removed at the
    end (:func:`~patchword.locks.removable_lock`), so an index holds no file of it between builds.

    Raises:
        RunExistsError: another build or update holds the lock, or wrote the index since ``seen``.
    """
    path = index_dir / LOCK_FILE
    busy = (
        f"{index_dir} is being built or updated by another `patchword index build` (lock {path} is held): "
        "wait for it to end, or stop it first (searching the index meanwhile is fine)"
    )
    with removable_lock(path, busy):
        if _manifest_stamps(index_dir) != seen:
            raise RunExistsError(
                f"{index_dir} was written by another `patchword index build` while this command checked it: "
                "run this command again"
            )
        yield


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


def _check_out(index_dir: Path) -> None:
    """``--out``: not a file, and a directory (or, when it does not exist yet, the nearest existing parent)
    where files can be created."""
    if index_dir.exists() and not index_dir.is_dir():
        raise RunExistsError(f"--out {index_dir} exists and is not a search index; choose another --out")
    try:
        probe_writable(index_dir)
    except OSError as err:  # a file on the way, a read-only or vanished directory
        raise ConfigError("--out", describe_os_error(err)) from err


def _index_dense_texts(index_dir: Path, manifest: Manifest) -> dict[str, str]:
    """The dense captions of the file an existing index was built with."""
    file = Path(manifest.dense["file"])
    if not file.is_file():
        raise MissingFileError(
            f"{index_dir} was built with the dense captions of {file}, which is missing: put it back, or "
            "build a new index"
        )
    return read_dense_file(file)


def _unchanged(entry: Entry, scanned: dict[str, ImageFile], captions: dict[str, str] | None) -> bool:
    """Whether ``entry`` may keep its vectors: its file is still there with the same size and mtime and,
    in an index with dense captions (``captions``: path -> :func:`caption_digest`), its caption line is still
    there and says what it said when the image was encoded (an entry that does not record it: no)."""
    file = scanned.get(entry.path)
    if file is None or (file.size, file.mtime_ns) != (entry.size, entry.mtime_ns):
        return False
    return captions is None or (entry.dense_sha is not None and captions.get(entry.path) == entry.dense_sha)


def _check_pq_sample(identity: dict[str, Any], first_shard: int, with_dense: bool) -> None:
    """Refuse a pq store whose first shard (``first_shard`` images) cannot hold the tokens its quantiser
    needs (checked again, exactly, on the encoded shard: an image may still fail to decode)."""
    per_image = identity["image_tokens"] + (identity["max_dense_len"] if with_dense else 0)
    if first_shard * per_image < PQ_MIN_TOKENS:
        raise ConfigError(
            "--store",
            f"pq trains its quantiser on the first shard's tokens and needs at least {PQ_MIN_TOKENS}; the "
            f"first shard's {first_shard} images give at most {first_shard * per_image}: index more images "
            "or choose another --store",
        )


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
        ConfigError: a value out of its range (``--batch-size``, ``--shard-size``, ``--workers``,
            ``--pq-bytes``, ``--keep-patches``...), ``--out`` where no index can be written, ``--images`` /
            ``--fp16`` / ``--dense`` disagreeing with the existing index, or a model that cannot read images.
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
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError("--store", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if batch_size < 1:
        raise ConfigError("--batch-size", f"must be at least 1, got {batch_size}")
    if shard_size < 1:
        raise ConfigError("--shard-size", f"must be at least 1, got {shard_size}")
    if workers is not None and workers < 0:
        raise ConfigError("--workers", f"must be 0 (the default: min(4, CPUs)) or more, got {workers}")
    if pq_bytes is not None and (dtype != "pq" or pq_bytes < 1):
        raise ConfigError(
            "--pq-bytes", "sets the pq store's bytes per token: give --store pq and a positive count"
        )
    if dense_store is not None and dense_store not in DENSE_STORES:
        raise ConfigError("--dense-store", f"must be one of {', '.join(DENSE_STORES)}, got {dense_store!r}")
    images_root = check_image_folder(images).resolve()
    index_dir = Path(index_dir).expanduser()
    _check_out(index_dir)
    dense_file = Path(dense).expanduser() if dense is not None else None
    given_dense = read_dense_file(dense_file) if dense_file is not None else None
    if not isinstance(run, LoadedRun):
        run = load_run(run, checkpoint, device=device)
    identity = model_identity(run)
    seen = _manifest_stamps(index_dir)  # before it is read: a build that writes it meanwhile is noticed
    manifest, resumed, live = _open_or_create(
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
    reads_dense = run.model.matcher.consumes_dense and run.config.data.dense
    if dense_file is None and manifest.dense is None and reads_dense:
        logger.warning(
            "%s was trained with dense captions but no --dense file was given: the fine stage will score "
            "without them, which is not how the model was evaluated",
            run.run_dir,
        )
    if manifest.dense is None:
        dense_texts = None
    elif given_dense is not None:
        dense_texts = given_dense  # the index's own file (_open_or_create refuses another)
    else:
        dense_texts = _index_dense_texts(index_dir, manifest)
    # Scanned before anything is written: a folder without images is an error, not an empty index (nor,
    # for --update, an index emptied of every entry).
    scan = scan_images(images_root, exclude=index_dir)
    if not scan.images:
        raise DataError(no_images_message(images_root, scan.skipped, scan.ignored))
    drop_broken_shards(index_dir, manifest)
    codec = load_codec(index_dir, manifest.dtype) if manifest.shards else None
    if codec is None:
        check_store(manifest.dtype)  # pq: FAISS, which trains the quantiser on the first shard

    report = BuildReport(index_dir=index_dir, resumed=resumed, ignored=scan.ignored)
    scanned = {f.path: f for f in scan.images}
    captions = None if dense_texts is None else {path: caption_digest(t) for path, t in dense_texts.items()}
    kept = [e for e in manifest.entries if _unchanged(e, scanned, captions)]
    if captions is not None and any(e.dense_sha is None for e in manifest.entries):
        logger.warning(
            "%s does not record the dense captions its images were encoded with (built by an older "
            "patchword): those images are encoded again",
            index_dir,
        )
    report.kept = len(kept)
    kept_paths = {e.path for e in kept}
    dropped = [e for e in manifest.entries if e.path not in kept_paths]
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
    todo, uncaptioned = [], 0
    for file in scan.images:
        if file.path in kept_paths or file.path in failed_before:
            continue
        if dense_texts is not None and file.path not in dense_texts:
            skipped.append(SkippedFile(file.path, f"no dense caption in {manifest.dense['file']}"))
            uncaptioned += 1
            continue
        todo.append(file)
    if not kept and not todo:  # an index of no image: every later search would refuse it
        flag = "--dense" if uncaptioned else "--images"
        raise DataError(nothing_indexed_message(flag, images_root, skipped, "nothing was written"))
    if dense_texts is not None:  # a caption without words met in the last shard stopped a build part-way
        check_dense_words(run.tokenizer, dense_texts, [f.path for f in todo])
    if codec is None and manifest.dtype == "pq" and todo:
        _check_pq_sample(identity, min(len(todo), shard_size), dense_texts is not None and not store_scores)

    return BuildPlan(
        run=run,
        images_root=images_root,
        index_dir=index_dir,
        manifest=manifest,
        live=live,
        report=report,
        kept=kept,
        dropped=dropped,
        todo=todo,
        skipped=skipped,
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
    with _build_lock(index_dir, plan.seen):
        _write_index(plan, created=created)
    report.num_images = len(manifest.entries)
    # a dropped entry is changed when its file was encoded again, else removed (deleted, or now skipped)
    encoded_again = {e.path for e in plan.dropped} & {e.path for e in manifest.entries}
    report.changed = len(encoded_again)
    report.removed = len(plan.dropped) - report.changed
    report.skipped = manifest.skipped
    report.pruning = manifest.pruning
    report.store, report.codec = manifest.dtype, manifest.codec
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
                    codec.save(index_dir)
                    manifest.codec = codec.describe()
                shard_id = manifest.next_shard
                rows = write_shard(index_dir, shard_id, encoded, codec, scores, pruned)
                manifest.shards.append({"id": shard_id, "rows": rows})
                manifest.next_shard += 1
                manifest.entries += [
                    Entry(
                        f.path,
                        f.size,
                        f.mtime_ns,
                        f.format,
                        shard_id,
                        row,
                        None if captions is None else captions[f.path],
                    )
                    for row, f in enumerate(encoded.files)
                ]
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
