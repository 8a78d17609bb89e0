"""The on-disk format of a search index, and its manifest.

``INDEX_DIR/``
    ``manifest.json``  format version, the model that wrote it (run, checkpoint, weights hash, config),
    the image folder, the storage dtype, the shards, one entry per indexed image (relative path, size,
    mtime, format, shard and row), the files skipped with their reason and the build id (:class:`Manifest`);
    ``shards/NNNNN.*.npy``  the shard files, memory-mappable arrays of the images' vectors
    (:mod:`patchword.search.shards` names them and says what each holds).

Every file is written to a temporary name and renamed into place (``os.replace``), shards first and the
manifest last, so the manifest only ever names complete shards: a build killed at any moment leaves a
consistent index to resume from. An update of a complete index writes its progress to
``manifest.pending.json`` and replaces ``manifest.json`` last: until then searches open the index as it was
(shard files are never rewritten in place; the ones the new manifest drops are deleted after it). A build or
update holds ``.build.lock`` (:mod:`patchword.locks`) while it writes. Rows of a shard whose image was
deleted or changed are dead (no entry points at them) until the index is compacted.

An index id is the position of an entry in the manifest: ids are dense (0..N-1) and stable for one
version of the index.

What a reader can use of a manifest is checked by :mod:`patchword.search.checks`; the reader itself is
:class:`patchword.search.store.SearchIndex`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import DataError, MissingFileError
from patchword.fileio import atomic_write_bytes
from patchword.search.checks import manifest_problem
from patchword.search.codecs import STORES
from patchword.search.scan import SkippedFile

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "PENDING_FILE",
    "LOCK_FILE",
    "DTYPES",
    "Entry",
    "caption_digest",
    "Manifest",
    "rows_digest",
    "unfinished_build",
]

FORMAT = "patchword-search-index"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
#: The manifest of an update under way (or stopped part-way): ``manifest.json`` keeps the complete index it
#: started from, what searches open, until the update's last write replaces it.
PENDING_FILE = "manifest.pending.json"
#: The lock a build or update holds on its index (one at a time); removed when it ends.
LOCK_FILE = ".build.lock"
DTYPES = STORES  # the token stores an index may use (the manifest's ``dtype`` field names one)


@dataclass(frozen=True)
class Entry:
    """One indexed image: its file (relative path, size, mtime, format), where its vectors are and, in an
    index with dense captions, ``dense_sha``: the digest of the caption it was encoded with
    (:func:`caption_digest`; None in an index written before it was recorded), so an update re-encodes an
    image whose caption changed."""

    path: str
    size: int
    mtime_ns: int
    format: str
    shard: int
    row: int
    dense_sha: str | None = None


def caption_digest(text: str) -> str:
    """The digest of a dense caption an entry records (``Entry.dense_sha``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class Manifest:
    """Everything ``manifest.json`` holds (see the module docstring).

    Attributes:
        model: identity of the model that encoded the images (``weights_sha256`` decides compatibility)
            and the shapes it produces.
        images_root: absolute path of the indexed folder.
        dtype: the token store of the shards (:data:`~patchword.search.codecs.STORES`).
        codec: what the store needs recorded (pq: the quantiser's shape), for people reading the manifest.
        dense: None, or the dense-caption file the index was built with (``file``, ``max_len``) and what
            the index keeps of it (``store``: :data:`~patchword.search.checks.DENSE_STORES`; absent in older
            indexes: tokens).
        pruning: None (every patch stored), or how the patches were pruned at build time (``kept`` M of
            ``of`` N per image, ``fraction``, ``by``: the rule, ``exact``: false), see
            :func:`patchword.search.pruning.pruning_record`.
        state: ``building`` (a build or update is running or was interrupted) or ``complete``.
        shards: ``{"id", "rows"}`` of every shard file set, in creation order.
        next_shard: id of the next shard to write.
        entries: the indexed images; an entry's position is its index id.
        skipped: files left out, with the reason.
        build_id: random, drawn when a new index is made and kept by its resumes and updates (None in an
            index written before it was recorded): an index built again in the same folder from other
            files holds the same shards and rows, and only this tells the two apart (:func:`rows_digest`).
            Not compared: two builds of the same files are equal manifests.
    """

    model: dict[str, Any]
    images_root: str
    dtype: str
    dense: dict[str, Any] | None = None
    codec: dict[str, Any] = field(default_factory=dict)
    pruning: dict[str, Any] | None = None
    state: str = "building"
    shards: list[dict[str, int]] = field(default_factory=list)
    next_shard: int = 0
    entries: list[Entry] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    build_id: str | None = field(default_factory=lambda: secrets.token_hex(8), compare=False)

    @property
    def dense_store(self) -> str | None:
        """``tokens`` or ``scores`` (:data:`~patchword.search.checks.DENSE_STORES`); None without dense
        captions."""
        return None if self.dense is None else self.dense.get("store", "tokens")

    def to_json(self) -> str:
        payload = {"format": FORMAT, "version": FORMAT_VERSION, **asdict(self)}
        fields = ["path", "size", "mtime_ns", "format", "shard", "row"]
        if self.dense is not None:  # the caption each image was encoded with (an index without: as before)
            fields.append("dense_sha")
        payload["entries"] = [
            [e.path, e.size, e.mtime_ns, e.format, e.shard, e.row, e.dense_sha][: len(fields)]
            for e in self.entries
        ]
        payload["entry_fields"] = fields
        return json.dumps(payload, indent=1, ensure_ascii=False)

    @classmethod
    def read(cls, index_dir: str | os.PathLike[str], name: str = MANIFEST_FILE) -> Manifest:
        """Read ``index_dir/manifest.json`` (or ``name``: :data:`PENDING_FILE`).

        Raises:
            MissingFileError: no manifest.
            DataError: not a patchword index, another format version, or a malformed file.
        """
        path = Path(index_dir) / name
        if Path(index_dir).exists() and not Path(index_dir).is_dir():
            raise MissingFileError(f"{index_dir} is not a search index: it is a file, not an index directory")
        if not Path(index_dir).exists():
            raise MissingFileError(f"search index not found: {index_dir} does not exist")
        if not path.is_file():
            raise MissingFileError(f"{index_dir} is not a search index: it has no {MANIFEST_FILE}")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: malformed index manifest ({err})") from err
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise DataError(f"{path} is not a patchword search index manifest")
        if payload.get("version") != FORMAT_VERSION:
            raise DataError(
                f"{path}: index format version {payload.get('version')} (this patchword reads "
                f"{FORMAT_VERSION}); rebuild it with `patchword index build`"
            )
        try:
            manifest = cls(
                model=payload["model"],
                images_root=payload["images_root"],
                dtype=payload["dtype"],
                dense=payload.get("dense"),
                codec=payload.get("codec") or {},
                pruning=payload.get("pruning"),
                state=payload["state"],
                shards=list(payload["shards"]),
                next_shard=int(payload["next_shard"]),
                entries=[Entry(*row) for row in payload["entries"]],
                skipped=[SkippedFile(**s) for s in payload.get("skipped", [])],
                build_id=payload.get("build_id"),  # None: written before it was recorded
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"{path}: malformed index manifest (field {err})") from err
        if manifest.build_id is not None and not isinstance(manifest.build_id, str):
            raise DataError(f"{path}: malformed index manifest: field 'build_id' is not a string")
        problem = manifest_problem(manifest)
        if problem is not None:
            raise DataError(
                f"{path}: malformed index manifest: field {problem[0]!r} {problem[1]}; build a new index "
                "with `patchword index build`"
            )
        return manifest

    def write(self, index_dir: str | os.PathLike[str], name: str = MANIFEST_FILE) -> None:
        """Replace ``index_dir/manifest.json`` (or ``name``: :data:`PENDING_FILE`, an update's progress)
        atomically."""
        atomic_write_bytes(Path(index_dir) / name, self.to_json().encode("utf-8"))


def rows_digest(manifest: Manifest) -> str:
    """A digest of which stored row each index id reads: the index's ``build_id``, the shard list and every
    entry's (shard, row), in id order, and the model's weights. Within one build shard files are never
    rewritten under the same id (a new shard takes ``next_shard``), and an index built again in the same
    folder (deleted first) has another ``build_id``, so equal digests mean equal vectors and files behind
    every id: what anything derived from the rows (a kept approximate first stage, a Qdrant upload whose
    point ids are index ids, a server's ``version``) must match. An index without a ``build_id`` (written
    before it was recorded) digests as it did then, so what was derived from it still matches."""
    digest = hashlib.sha256()
    identity = [manifest.model.get("weights_sha256"), manifest.shards]
    if manifest.build_id is not None:
        identity.append(manifest.build_id)
    digest.update(json.dumps(identity).encode())
    rows = np.array([(e.shard, e.row) for e in manifest.entries], dtype=np.int64).reshape(-1, 2)
    digest.update(rows.tobytes())
    return digest.hexdigest()[:16]


def unfinished_build(index_dir: Path) -> str:
    """Why an index whose first build has not finished cannot be opened, and what to do."""
    return (
        f"{index_dir}: the index build did not finish: it is still running (search the index when it ends), "
        "or it was stopped (then rerun the same `patchword index build` command: it resumes the build)"
    )
