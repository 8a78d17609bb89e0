"""The output file: SEPS dense-caption JSONL, appended batch by batch so that no finished work is lost.

One line per image, ``{"text": ..., "model_id": ..., "metadata": {"image_id": ..., ...}}``, the format of
the SEPS release, which ``patchword.data.textfiles.load_dense_jsonl`` (``data.dense_<split>``) reads.

Durability rules:

* a batch's lines are written with one ``write`` and flushed to disk (``fsync``) before the next batch
  starts, so a kill loses at most the batch being generated;
* only newline-terminated lines count; a torn last line (the process died inside a write) is cut off
  when the file is reopened and its image generated again;
* a sidecar ``<out>.densify.json`` (written atomically, once) records what the file holds: model (and
  its files' fingerprint), prompt, decoding, the image list's fingerprint and the shard's range. A rerun
  with other settings is refused instead of mixing two kinds of text into one file;
* the finished file is rewritten (temp file + ``os.replace``) into image order only if it is not in that
  order already (images that failed once and were filled in by a later run).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchword.data.json_keys import unique_keys
from patchword.errors import ConfigError, DataError, RunExistsError, describe_os_error
from patchword.fileio import atomic_write_bytes, probe_writable

__all__ = [
    "SIDECAR_SUFFIX",
    "FORMAT_VERSION",
    "DenseRecord",
    "sidecar_path",
    "read_sidecar",
    "write_sidecar",
    "read_records",
    "repair_tail",
    "append_records",
    "write_records_atomic",
    "check_output_path",
]

logger = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".densify.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class DenseRecord:
    """One output line.

    Attributes:
        text: the generated description.
        model_id: the model that wrote it.
        metadata: ``image_id`` first, then ``file``, ``length`` (characters, as in the SEPS release),
            ``new_tokens`` and ``truncated`` (stopped by ``max_new_tokens`` rather than end of text).
    """

    text: str
    model_id: str
    metadata: dict[str, object]

    @property
    def image_id(self) -> str:
        return str(self.metadata["image_id"])

    def to_line(self) -> bytes:
        record = {"text": self.text, "model_id": self.model_id, "metadata": self.metadata}
        return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def check_output_path(out: str | os.PathLike[str]) -> None:
    """Before any work (the lock included), that ``out`` can be written: not a directory, and files can be
    created in its folder (or, when the folder is still to be made, in its nearest existing parent).

    Raises:
        ConfigError: naming ``--out`` and why (a directory; a read-only, vanished or refusing folder).
    """
    out = Path(out)
    if out.is_dir():
        raise ConfigError("--out", f"{out} is a directory: --out names the JSONL file to write")
    try:
        probe_writable(out.parent)
    except OSError as err:  # a file on the way, a read-only or vanished folder: nothing can be written
        raise ConfigError("--out", f"{out} cannot be written: {describe_os_error(err)}") from err


def sidecar_path(out: str | os.PathLike[str]) -> Path:
    """``dense.jsonl`` -> ``dense.jsonl.densify.json``."""
    out = Path(out)
    return out.with_name(out.name + SIDECAR_SUFFIX)


def read_sidecar(out: str | os.PathLike[str]) -> dict[str, object] | None:
    """The sidecar of ``out``, or None when there is none."""
    path = sidecar_path(out)
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(
            f"{path}: malformed densify sidecar ({err}); delete it only together with {out}"
        ) from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise DataError(f"{path}: not a densify sidecar of format {FORMAT_VERSION}")
    return meta


def write_sidecar(out: str | os.PathLike[str], meta: dict[str, object]) -> None:
    atomic_write_bytes(
        sidecar_path(out), (json.dumps({"format": FORMAT_VERSION, **meta}, indent=2) + "\n").encode()
    )


def _parse_line(line: bytes, path: Path, lineno: int) -> DenseRecord:
    try:
        # a key given twice (two "text" fields) would keep the last without a word: refused, named
        record = json.loads(line, object_pairs_hook=unique_keys(f"{path}:{lineno}"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(
            f"{path}:{lineno}: malformed JSON line ({err}); the file was edited or damaged"
        ) from err
    meta = record.get("metadata") if isinstance(record, dict) else None
    if not isinstance(meta, dict) or "image_id" not in meta or not isinstance(record.get("text"), str):
        raise DataError(f"{path}:{lineno}: expected {{'text', 'model_id', 'metadata': {{'image_id', ...}}}}")
    return DenseRecord(record["text"], str(record.get("model_id", "")), meta)


def read_records(path: str | os.PathLike[str]) -> tuple[list[DenseRecord], int]:
    """The complete (newline-terminated) lines of ``path`` and the byte count of a torn tail after them.

    Raises:
        DataError: a complete line is blank, not a record or gives one key twice (names the line).
    """
    path = Path(path)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # bytes after the last newline are a torn write
    records = []
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            # densify never writes one; the training reader (load_dense_jsonl) and `densify stats` refuse it
            raise DataError(f"{path}:{lineno}: blank line (expected one JSON object per image)")
        records.append(_parse_line(line, path, lineno))
    return records, len(data) - end


def repair_tail(path: str | os.PathLike[str]) -> int:
    """Cut a torn last line (no newline: the writer was killed mid-write); returns the bytes removed."""
    path = Path(path)
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        # Scan back from the end in blocks to the last newline.
        pos, keep = size, 0
        while pos > 0:
            step = min(1 << 16, pos)
            f.seek(pos - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = pos - step + nl + 1
                break
            pos -= step
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
            logger.warning(
                "%s: removed a torn last line (%d bytes) left by an interrupted run", path, size - keep
            )
        return size - keep


def append_records(f, records: Iterable[DenseRecord]) -> None:
    """Append ``records`` to the open binary file ``f`` in one write and force them to disk."""
    f.write(b"".join(r.to_line() for r in records))
    f.flush()
    os.fsync(f.fileno())


def write_records_atomic(
    path: str | os.PathLike[str], records: Sequence[DenseRecord], *, force: bool = True
) -> None:
    """Write a whole file atomically (``force=False``: refuse to replace an existing file)."""
    path = Path(path)
    if not force and path.exists():
        raise RunExistsError(f"{path} exists; pass --force to overwrite it or choose another --out")
    atomic_write_bytes(path, b"".join(r.to_line() for r in records))
