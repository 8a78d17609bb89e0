"""Which files a build or update encodes (:func:`patchword.search.index.plan_build`): the entries whose
stored vectors are kept (file and dense caption unchanged), those dropped, the files to encode and those
left out; and the entries of an encoded shard."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from patchword.data.images import load_image
from patchword.errors import DataError
from patchword.search.build_report import nothing_indexed_message
from patchword.search.manifest import Entry, Manifest
from patchword.search.scan import ImageFile, ScanResult, SkippedFile

__all__ = ["FileChoice", "against_live", "choose_files", "new_entries"]


@dataclass
class FileChoice:
    """What a build does with each file and entry: ``kept`` entries reuse their vectors, ``dropped`` ones
    are no longer kept (deleted, changed or now skipped), ``todo`` files are encoded, ``skipped`` ones left
    out with the reason."""

    kept: list[Entry]
    dropped: list[Entry]
    todo: list[ImageFile]
    skipped: list[SkippedFile]


def _unchanged(entry: Entry, scanned: dict[str, ImageFile], captions: dict[str, str] | None) -> bool:
    """Whether ``entry`` may keep its vectors: its file is still there with the same size and mtime and,
    in an index with dense captions (``captions``: path ->
    :func:`~patchword.search.manifest.caption_digest`), its caption line is still there and says what it
    said when the image was encoded (an entry that does not record it: no)."""
    file = scanned.get(entry.path)
    if file is None or (file.size, file.mtime_ns) != (entry.size, entry.mtime_ns):
        return False
    return captions is None or (entry.dense_sha is not None and captions.get(entry.path) == entry.dense_sha)


def choose_files(
    manifest: Manifest,
    scan: ScanResult,
    dense_texts: dict[str, str] | None,
    captions: dict[str, str] | None,
    images_root: Path,
) -> FileChoice:
    """Sort ``scan``'s files and ``manifest``'s entries (``dense_texts``: the index's dense captions, their
    :func:`~patchword.search.manifest.caption_digest` by path in ``captions``; None: none).

    Raises:
        DataError: nothing would be indexed (no entry kept, no file to encode).
    """
    scanned = {f.path: f for f in scan.images}
    kept = [e for e in manifest.entries if _unchanged(e, scanned, captions)]
    kept_paths = {e.path for e in kept}
    dropped = [e for e in manifest.entries if e.path not in kept_paths]
    # Files decoded before (size and mtime recorded) are not decoded again until they change: one that
    # failed is not retried (a resumed build then writes exactly the shards an uninterrupted one would have);
    # one that decoded but had no dense caption is still left out while it has none.
    decoded_before = {
        s.path: s
        for s in manifest.skipped
        if s.size is not None
        and s.path in scanned
        and (scanned[s.path].size, scanned[s.path].mtime_ns) == (s.size, s.mtime_ns)
    }
    failed_before = {path: s for path, s in decoded_before.items() if not s.uncaptioned}
    skipped = list(scan.skipped) + list(failed_before.values())
    todo, uncaptioned = [], []
    for file in scan.images:
        if file.path in kept_paths or file.path in failed_before:
            continue
        if dense_texts is not None and file.path not in dense_texts:
            uncaptioned.append(file)
            continue
        todo.append(file)
    if uncaptioned:
        # decoded as a build would: a damaged file is listed as such (listed as uncaptioned, a truncated PNG
        # looked sound), and, like any file that failed to decode, not tried again until it changes
        why = f"no dense caption in {manifest.dense['file']}"
        # (one found sound before and unchanged since keeps that verdict: it is not decoded again)
        fresh = [f for f in uncaptioned if f.path not in decoded_before]
        with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
            failures = pool.map(lambda f: _decode_failure(images_root, f), fresh)
            failed = {s.path: s for s in failures if s is not None}
        uncaptioned = [
            failed.get(f.path) or SkippedFile(f.path, why, f.size, f.mtime_ns, uncaptioned=True)
            for f in uncaptioned
        ]
        skipped += uncaptioned
    if not kept and not todo:  # an index of no image: every later search would refuse it
        flag = "--dense" if any(s.uncaptioned for s in uncaptioned) else "--images"
        raise DataError(nothing_indexed_message(flag, images_root, skipped, "nothing was written"))
    return FileChoice(kept=kept, dropped=dropped, todo=todo, skipped=skipped)


def _decode_failure(root: Path, file: ImageFile) -> SkippedFile | None:
    """``file`` skipped as the encoder skips a file it cannot decode
    (:class:`~patchword.search.encode.ShardEncoder`), or None when it decodes."""
    try:
        load_image(root / file.path, exif_orientation=True)
    except Exception as err:  # noqa: BLE001 - any decoding failure skips the file, as in the encoder
        return SkippedFile(file.path, f"cannot decode: {err}", file.size, file.mtime_ns)
    return None


def against_live(live: Manifest | None, choice: FileChoice) -> tuple[list[Entry], list[Entry]]:
    """(kept, dropped): ``choice``'s entries counted against the complete index an update started from
    (``live``; None: a first build, ``choice``'s own), so that an update stopped and resumed reports what
    an uninterrupted one does. An update writes new shards only: the kept entries of ``live``'s shards kept
    their vectors, the others were encoded before it was stopped; ``dropped``: ``live``'s entries not kept."""
    if live is None:
        return choice.kept, choice.dropped
    shards = {s["id"] for s in live.shards}
    kept = [e for e in choice.kept if e.shard in shards]
    paths = {e.path for e in kept}
    return kept, [e for e in live.entries if e.path not in paths]


def new_entries(files: list[ImageFile], shard_id: int, captions: dict[str, str] | None) -> list[Entry]:
    """The entries of ``files``, encoded into rows 0, 1, ... of shard ``shard_id`` (``captions``: as in
    :func:`choose_files`)."""
    return [
        Entry(
            f.path,
            f.size,
            f.mtime_ns,
            f.format,
            shard_id,
            row,
            None if captions is None else captions[f.path],
        )
        for row, f in enumerate(files)
    ]
