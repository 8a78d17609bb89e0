"""What :func:`patchword.search.index.plan_build` checked and :func:`~patchword.search.index.write_build`
writes: :class:`BuildPlan`.

A build is split in two so that a command doing more than the build checks everything first: ``index build
--qdrant`` plans the build (every flag and file checked, the run loaded, the folder scanned: nothing
written), then opens the Qdrant store, then writes the index and uploads it. A refused flag then leaves no
store directory behind and is reported before any connection problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchword.runs import LoadedRun
from patchword.search.build_report import BuildReport
from patchword.search.codecs import TokenCodec
from patchword.search.manifest import Entry, Manifest
from patchword.search.scan import ImageFile, SkippedFile

__all__ = ["BuildPlan"]


@dataclass
class BuildPlan:
    """A checked build, nothing of it written yet; :func:`~patchword.search.index.write_build` writes it
    (once).

    Attributes:
        run: the loaded run whose model encodes the images.
        images_root: the folder indexed (resolved); ``index_dir``: where the index goes.
        manifest: the manifest to continue (resume / update) or a new one; ``live``: the complete manifest an
            update starts from (None for a first build).
        report: the report, filled in by the write (``resumed``, ``ignored`` and ``kept`` known already).
        kept: entries whose stored vectors are reused; ``dropped``: entries no longer kept.
        todo: the files to encode; ``skipped``: files left out, with the reason.
        captions: path -> digest of its dense caption (None: no dense captions); ``dense_texts``: the
            captions.
        codec: the index's token codec (None: trained or made on the first shard).
        engine: the fine matcher's scoring engine; ``keep``: patches kept per image (None: all);
            ``store_scores``: the index keeps dense scores, not tokens.
        pq_bytes, batch_size, shard_size, workers, progress: the build's settings (``workers`` resolved).
        seen: the manifests' stamps when the index was read (a build that writes it meanwhile is refused).
        start: ``time.perf_counter()`` when the checks began (the report's ``seconds`` count from it).
    """

    run: LoadedRun
    images_root: Path
    index_dir: Path
    manifest: Manifest
    live: Manifest | None
    report: BuildReport
    kept: list[Entry]
    dropped: list[Entry]
    todo: list[ImageFile]
    skipped: list[SkippedFile]
    captions: dict[str, str] | None
    dense_texts: dict[str, str] | None
    codec: TokenCodec | None
    engine: Any
    keep: int | None
    store_scores: bool
    pq_bytes: int | None
    batch_size: int
    shard_size: int
    workers: int
    progress: bool | None
    seen: tuple[tuple[int, int, int] | None, ...]
    start: float
