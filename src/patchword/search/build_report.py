"""What :func:`patchword.search.index.build_index` reports: :class:`BuildReport` and its summary lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchword.search.manifest import MANIFEST_FILE, Entry, Manifest
from patchword.search.scan import SkippedFile, printable

__all__ = ["PQ_ADVISED_TOKENS", "BuildReport", "no_images_message", "nothing_indexed_message"]

#: Skipped files listed by :meth:`BuildReport.summary` (the manifest keeps them all).
SHOWN_SKIPPED = 20
#: Tokens FAISS advises a product quantiser's k-means to train on: 39 per centroid, 256 centroids.
PQ_ADVISED_TOKENS = 39 * 256


@dataclass
class BuildReport:
    """What :func:`build_index` did.

    Attributes:
        index_dir: the index.
        num_images: images in the index now.
        added: images encoded by this build or update (new files, and ``changed`` ones encoded again), those
            encoded before it was stopped and resumed included (``encoded_before`` of them).
        kept: images whose stored vectors were reused: for an update, those of the index it started from,
            resumed or not; for a first build resumed, those done before it was stopped.
        changed: entries whose file (or dense caption) changed since they were stored, encoded again (part
            of ``added``).
        removed: entries no longer in the index (files deleted, or changed ones that now fail to decode or
            lost their dense caption).
        skipped: files left out with the reason (unreadable, corrupt, no dense caption...).
        ignored: other files under the folder (not images).
        resumed: an interrupted build was continued.
        compacted: the shards were rewritten without their dead rows.
        seconds: wall time of the call; ``encode_seconds`` of the encoding loop alone.
        pruning: the index's patch pruning (``Manifest.pruning``), or None.
        store: the index's token store (``Manifest.dtype``); ``codec``: what it records of it.
        pq_sample: (tokens, images) the pq quantiser was trained on by this call (the first shard's), or None.
    """

    index_dir: Path
    num_images: int = 0
    added: int = 0
    encoded_before: int = 0
    kept: int = 0
    changed: int = 0
    removed: int = 0
    skipped: list[SkippedFile] = field(default_factory=list)
    ignored: int = 0
    resumed: bool = False
    compacted: bool = False
    seconds: float = 0.0
    encode_seconds: float = 0.0
    pruning: dict[str, Any] | None = None
    store: str = "float32"
    codec: dict[str, Any] = field(default_factory=dict)
    pq_sample: tuple[int, int] | None = None

    def tally(self, manifest: Manifest, dropped: list[Entry]) -> None:
        """Count what the build left in ``manifest`` (written), ``dropped``: the entries it no longer keeps
        (:func:`~patchword.search.build_files.against_live`)."""
        self.num_images = len(manifest.entries)
        # a dropped entry is changed when its file was encoded again, else removed (deleted, or now skipped)
        self.changed = len({e.path for e in dropped} & {e.path for e in manifest.entries})
        self.removed = len(dropped) - self.changed
        self.skipped = manifest.skipped
        self.pruning = manifest.pruning
        self.store, self.codec = manifest.dtype, manifest.codec

    def summary(self) -> str:
        """Human-readable lines for the CLI."""
        encoded = f"{self.added} encoded"
        if self.changed:
            encoded += f" ({self.added - self.changed} new, {self.changed} changed)"
        # a rate of nothing encoded is no rate: the encoder did not run
        now = self.added - self.encoded_before  # the rate of this call's encoding
        rate = (
            f" ({now / self.encode_seconds:.1f} images/s encoding)" if now and self.encode_seconds > 0 else ""
        )
        lines = [
            f"index {self.index_dir}: {self.num_images} images "
            f"({encoded}, {self.kept} kept, {self.removed} removed"
            f"{', resumed' if self.resumed else ''}{', compacted' if self.compacted else ''}) "
            f"in {self.seconds:.1f} s{rate}",
        ]
        if self.store == "pq":
            per_token = self.codec.get("pq_m")
            size = f", {per_token} bytes per token" if per_token else ""
            lines.append(
                f"tokens product-quantised (--store pq{size}): search scores are an approximation of "
                "float32's (docs/search.md)"
            )
        if self.pq_sample is not None and self.pq_sample[0] < PQ_ADVISED_TOKENS:
            lines.append(
                f"the pq codebook was trained on the {self.pq_sample[0]} tokens of the first shard's "
                f"{self.pq_sample[1]} images, fewer than the {PQ_ADVISED_TOKENS} FAISS advises: it is "
                "coarse, and every --update keeps it (build the index anew from more images for a finer one)"
            )
        if self.pruning:
            kept, of, fraction = (self.pruning[key] for key in ("kept", "of", "fraction"))
            lines.append(
                f"patches pruned: {kept} of {of} kept per image (--keep-patches {fraction}, an "
                "approximation: docs/search.md)"
            )
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} files:")
            lines += [f"  {_line(s)}" for s in self.skipped[:SHOWN_SKIPPED]]
            if len(self.skipped) > SHOWN_SKIPPED:
                lines.append(
                    f"  ... and {len(self.skipped) - SHOWN_SKIPPED} more (all are listed in "
                    f"{self.index_dir / MANIFEST_FILE})"
                )
        return "\n".join(lines)


def no_images_message(root: Path, skipped: list[SkippedFile], ignored: int) -> str:
    """One line: ``root`` holds no image Pillow can open, and what it holds instead."""
    held = []
    if skipped:
        shown = "; ".join(_line(s) for s in skipped[:3])
        held.append(f"{len(skipped)} unreadable image files ({shown}{' ...' if len(skipped) > 3 else ''})")
    if ignored:
        held.append(f"{ignored} other files")
    holds = ", ".join(held) if held else "no files (hidden ones are not scanned)"
    return f"--images: no image to index under {root}: it holds {holds}; nothing was written"


def nothing_indexed_message(flag: str, root: Path, skipped: list[SkippedFile], outcome: str) -> str:
    """One line: no image under ``root`` can be indexed, how many files were skipped and why (the first
    three), and ``outcome`` (what became of ``--out``)."""
    skipped = sorted(skipped, key=lambda s: s.path)
    shown = "; ".join(_line(s) for s in skipped[:3])
    return (
        f"{flag}: no image under {root} can be indexed: {len(skipped)} files were skipped "
        f"({shown}{' ...' if len(skipped) > 3 else ''}); {outcome}"
    )


def _line(skipped: SkippedFile) -> str:
    """``path: reason`` on one line: a file name holding a newline or an escape sequence is printed escaped
    (:func:`~patchword.search.scan.printable`); the manifest keeps it exactly."""
    return f"{printable(skipped.path)}: {printable(skipped.reason)}"
