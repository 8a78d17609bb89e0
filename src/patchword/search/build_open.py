"""What a build starts from (:func:`patchword.search.index.plan_build`): ``--out`` checked, and the
manifest it continues (a resumed build or update) or a new one, refusing what would mix two indexes.
Nothing here writes."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError, MissingFileError, RunExistsError
from patchword.fileio import check_output_dir
from patchword.search.build_lock import manifest_stamps
from patchword.search.encode import read_dense_file
from patchword.search.identity import check_index_model
from patchword.search.manifest import LOCK_FILE, MANIFEST_FILE, PENDING_FILE, Manifest
from patchword.search.shards import SHARDS_DIR

__all__ = [
    "check_out",
    "index_dense_texts",
    "new_manifest",
    "open_or_create",
    "out_stamps",
    "stopped_message",
]

logger = logging.getLogger(__name__)


def check_out(index_dir: Path) -> None:
    """``--out``: not a file (nor under one), and a directory (or, when it does not exist yet, the nearest
    existing parent) where files can be created."""
    if index_dir.exists() and not index_dir.is_dir():
        raise RunExistsError(f"--out {index_dir} exists and is not a search index; choose another --out")
    check_output_dir(index_dir, "--out", what="the index directory")


def out_stamps(index_dir: Path) -> tuple:
    """The stamps of ``index_dir``'s manifests (:func:`~patchword.search.build_lock.manifest_stamps`; none
    for an ``--out`` that cannot hold them, a file the build refuses)."""
    try:
        return manifest_stamps(index_dir)
    except OSError:
        return (None, None)


def stopped_message(index_dir: Path, before: tuple, upload: str = "") -> str | None:
    """What a build stopped now (Ctrl-C, SIGTERM) leaves that a rerun of the same command does not resume
    (None: a build or update stopped part-way, which it does), said after the signal's name:

    * ``index_dir``'s manifests as they were (``before``: :func:`out_stamps`), no build stopped part-way:
      ``before anything was written to INDEX_DIR...``;
    * the index complete and written since ``before``: ``after INDEX_DIR was complete...``; the same command
      would be refused ("already holds a complete index"). ``upload``: how to upload it when the stop may
      have come before the Qdrant upload ended (``--qdrant``), else empty.
    """
    now = out_stamps(index_dir)
    if (index_dir / PENDING_FILE).is_file():
        return None
    try:
        state = json.loads((index_dir / MANIFEST_FILE).read_text(encoding="utf-8"))["state"]
    except (OSError, ValueError, TypeError, KeyError):
        state = None  # no index there (or none a build would resume)
    if now != before:
        if state != "complete":
            return None  # a build stopped part-way: a rerun resumes it
        left = f": {upload}" if upload else ": nothing is left to do"
        return f"after {index_dir} was complete{left}"
    if state is not None and state != "complete":
        return None  # a build stopped before this command: a rerun resumes it
    left = ": the index is as it was" if before[0] is not None else ""
    return f"before anything was written to {index_dir}{left}"


def new_manifest(
    identity: dict[str, Any],
    images_root: Path,
    dtype: str | None,
    dense_file: Path | None,
    dense_store: str | None,
) -> Manifest:
    """The manifest of a new index (nothing stored yet) with these settings."""
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


def open_or_create(
    index_dir: Path,
    identity: dict[str, Any],
    images_root: Path,
    dtype: str | None,
    dense_file: Path | None,
    update: bool,
    dense_store: str | None = None,
    reads_dense: bool = True,
) -> tuple[Manifest, bool, Manifest | None]:
    """The manifest to continue (resume / update) or a new one, whether it resumes a stopped build or
    update, and the complete manifest an update starts from (None for a first build: searches read that one
    until the update ends); refuses what would mix two indexes. ``reads_dense``: whether the run's searches
    read an index's dense text (:func:`~patchword.search.fidelity.reads_index_dense`); a continued index
    that keeps dense text they never read stops keeping it (:func:`_drop_unread_dense`). Writes nothing."""
    if not (index_dir / MANIFEST_FILE).is_file():
        if index_dir.exists() and not _empty_or_failed_start(index_dir):
            raise RunExistsError(f"--out {index_dir} exists and is not a search index; choose another --out")
        return new_manifest(identity, images_root, dtype, dense_file, dense_store), False, None
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
        return new_manifest(identity, images_root, dtype, dense_file, dense_store), False, None
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
        kept = f"keeps dense {manifest.dense_store}" if manifest.dense_store else "was built without --dense"
        raise ConfigError("--dense-store", f"{index_dir} {kept}; build a new index to change it")
    resumed = manifest.state == "building"
    if manifest.state == "complete" and not update:
        raise RunExistsError(
            f"{index_dir} already holds a complete index; pass --update to add new and changed images "
            "(and drop deleted ones), or choose another --out"
        )
    if not reads_dense:
        _drop_unread_dense(manifest, index_dir)
    return manifest, resumed, live


def _drop_unread_dense(manifest: Manifest, index_dir: Path) -> None:
    """An index that keeps dense text (tokens or scores) its model's searches never read (a matcher that
    ignores dense text or ties it to captions; built by a patchword that did not refuse ``--dense`` for it)
    stops keeping it: ``manifest.dense`` goes, so new and changed images are encoded without it (and without
    the dense file, no longer skipped when it has no line for them), and the shard files of it are deleted
    once the updated manifest is in place (:func:`~patchword.search.maintenance.remove_orphans`). The stored
    images keep their vectors: no search read the dense text, so no result changes."""
    if manifest.dense is None:
        return
    logger.info(
        "%s keeps the dense %s of %s, which the matcher (%s) never reads at search time: this update stops "
        "keeping it (the search results do not change)",
        index_dir,
        manifest.dense_store,
        manifest.dense.get("file"),
        manifest.model.get("matcher"),
    )
    manifest.dense = None
    manifest.entries = [dataclasses.replace(e, dense_sha=None) for e in manifest.entries]


def index_dense_texts(index_dir: Path, manifest: Manifest) -> dict[str, str]:
    """The dense captions of the file an existing index was built with."""
    file = Path(manifest.dense["file"])
    if not file.is_file():
        raise MissingFileError(
            f"{index_dir} was built with the dense captions of {file}, which is missing: put it back, or "
            "build a new index"
        )
    return read_dense_file(file)
