"""Shard housekeeping of a search index: stray files removed, dead rows compacted away, damaged shards
forgotten (their images are encoded again). Used by :func:`patchword.search.index.build_index`."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from patchword.fileio import remove_stale_temps
from patchword.search.manifest import MANIFEST_FILE, PENDING_FILE, Manifest
from patchword.search.shards import SHARDS_DIR, save_npy_atomic, shard_arrays, shard_files
from patchword.search.store import SearchIndex, broken_shards

__all__ = ["COMPACT_DEAD_FRACTION", "compact", "drop_broken_shards", "remove_orphans"]

logger = logging.getLogger(__name__)

#: Compact the shards when more than this fraction of the stored rows belongs to no entry.
COMPACT_DEAD_FRACTION = 0.25


def remove_orphans(index_dir: Path, *manifests: Manifest) -> None:
    """Delete shard files no shard of ``manifests`` names (left by a kill between a shard and the manifest,
    or by a compaction), the arrays a manifest no longer has its shards hold (the dense text of an index that
    stopped keeping it) and temporary files a killed manifest write left behind. An update passes the
    complete manifest searches read besides its own: the shard files that one reads stay until it is
    replaced."""
    remove_stale_temps(index_dir, (MANIFEST_FILE, PENDING_FILE))  # the build's lock is held
    live = set()
    for m in manifests:
        names = shard_arrays(m)
        for s in m.shards:
            files = shard_files(index_dir, s["id"])  # once per shard: it builds every array's path
            live.update(files[name].name for name in names)
    shards_dir = index_dir / SHARDS_DIR
    if not shards_dir.is_dir():
        return
    for path in shards_dir.iterdir():
        if path.name not in live and (path.name.endswith(".npy") or path.name.endswith(".tmp")):
            path.unlink(missing_ok=True)


def compact(index_dir: Path, manifest: Manifest, shard_size: int) -> None:
    """Copy the live rows into new shards (entry order) and point ``manifest`` at them; the caller writes it,
    then deletes the old files (:func:`remove_orphans`)."""
    reader = SearchIndex(index_dir, manifest)
    entries, shards = [], []
    for start in range(0, len(manifest.entries), shard_size):
        ids = np.arange(start, min(start + shard_size, len(manifest.entries)))
        shard_id = manifest.next_shard
        files = shard_files(index_dir, shard_id)
        save_npy_atomic(files["global"], reader.global_embeddings().numpy()[ids])
        for name in shard_arrays(manifest):  # rows copied as stored: nothing is decoded or re-encoded
            if name == "global":
                continue
            width = (
                int(reader.gather("dense_lens", ids).max())
                if name.startswith("dense.") or name == "dense"
                else None
            )
            save_npy_atomic(files[name], reader.gather(name, ids, width=width))
        entries += [
            replace(e, shard=shard_id, row=row)
            for row, e in enumerate(manifest.entries[start : start + len(ids)])
        ]
        shards.append({"id": shard_id, "rows": len(ids)})
        manifest.next_shard += 1
    del reader  # release the memory maps before their files are deleted
    manifest.entries, manifest.shards = entries, shards


def drop_broken_shards(index_dir: Path, manifest: Manifest) -> None:
    """Forget the shards of a resumed or updated index that cannot be read (a file missing, truncated or
    overwritten) and their entries: their images are encoded again, the files deleted as orphans."""
    broken = broken_shards(index_dir, manifest)
    for shard_id, problem in broken.items():
        rows = sum(e.shard == shard_id for e in manifest.entries)
        logger.warning(
            "%s: shard %d is damaged (%s); its %d images are encoded again",
            index_dir,
            shard_id,
            problem,
            rows,
        )
    if broken:
        manifest.shards = [s for s in manifest.shards if s["id"] not in broken]
        manifest.entries = [e for e in manifest.entries if e.shard not in broken]
