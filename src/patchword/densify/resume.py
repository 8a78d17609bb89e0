"""What a rerun finds: the sidecar check that refuses to mix two runs in one file, and the finished lines.

A densify output is continued only by the run that started it: same model id, decoding settings,
precision, image list (by fingerprint) and shard range. Batch size and device may change (with a
warning). A file densify did not write (no sidecar) is never touched.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from patchword.densify.config import GenerationSettings
from patchword.densify.shards import Shard
from patchword.densify.sources import ImageList, fingerprint
from patchword.densify.store import DenseRecord, read_records, read_sidecar, repair_tail, write_sidecar
from patchword.errors import DataError, RunExistsError

__all__ = ["run_meta", "open_output", "finished_before", "is_complete", "check_records"]

logger = logging.getLogger(__name__)

# Sidecar fields a rerun must match (the text they produce would differ otherwise).
_RESUME_FIELDS = (
    "model_id",
    "generation",
    "precision",
    "num_images",
    "images_sha256",
    "shard",
    "start",
    "stop",
)


def run_meta(
    images: ImageList,
    model_name: str,
    model_id: str,
    precision: str,
    settings: GenerationSettings,
    shard: Shard,
    start: int,
    stop: int,
    batch_size: int,
    device: str,
) -> dict[str, object]:
    """The sidecar content of a run (see :mod:`patchword.densify.store`)."""
    return {
        "model": model_name,
        "model_id": model_id,
        "generation": settings.as_dict(),
        "precision": precision,
        "num_images": len(images),
        "images_sha256": fingerprint(images.image_ids),
        "source": images.source,
        "shard": str(shard),
        "start": start,
        "stop": stop,
        "batch_size": batch_size,
        "device": device,
    }


def _mismatch(out: Path, key: str, old: object, new: object) -> RunExistsError:
    if key in ("start", "stop"):
        what = f"the shard's image range differs ({key} {old} vs {new}): use the first run's --batch-size"
    elif key == "images_sha256":
        what = "the image list differs (other images, or another order)"
    elif isinstance(old, dict) and isinstance(new, dict):
        what = ", ".join(
            f"{k} differs ({old.get(k)!r} before, {new.get(k)!r} now)"
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)
        )
    else:
        what = f"{key} differs ({old!r} before, {new!r} now)"
    return RunExistsError(
        f"{out} was started with other settings: {what}; rerun with the first run's settings, or choose "
        "another --out"
    )


def open_output(out: Path, meta: dict[str, object]) -> list[DenseRecord]:
    """Validate or create ``out`` and its sidecar; returns the records already in it (torn tail removed)."""
    old = read_sidecar(out)
    if out.exists():
        if old is None:
            raise RunExistsError(
                f"{out} exists but was not written by patchword densify (no {out.name}.densify.json); "
                "choose another --out"
            )
        for key in _RESUME_FIELDS:
            if old.get(key) != meta[key]:
                raise _mismatch(out, key, old.get(key), meta[key])
        if old.get("batch_size") != meta["batch_size"] or old.get("device") != meta["device"]:
            logger.warning(
                "resuming %s with batch size %s on %s (first run: %s on %s): the remaining images may differ "
                "in the last bits from what the first settings would have produced",
                out,
                meta["batch_size"],
                meta["device"],
                old.get("batch_size"),
                old.get("device"),
            )
        repair_tail(out)
        return read_records(out)[0]
    write_sidecar(out, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    return []


def finished_before(
    out: Path,
    images: ImageList,
    model_name: str | None,
    settings: GenerationSettings,
    shard: Shard,
    start: int,
    stop: int,
    ids: list[str],
) -> bool:
    """Whether ``out`` already holds this exact run, complete; raises if it holds another run."""
    old = read_sidecar(out)
    if old is None or not out.exists():
        return False
    now = {
        "generation": settings.as_dict(),
        "num_images": len(images),
        "images_sha256": fingerprint(images.image_ids),
        "shard": str(shard),
        "start": start,
        "stop": stop,
    }
    for key, value in now.items():
        if old.get(key) != value:
            raise _mismatch(out, key, old.get(key), value)
    if model_name is not None and old.get("model") != model_name:
        return False  # the model id decides, once loaded
    records = read_records(out)[0]
    return [r.image_id for r in records] == ids


def is_complete(
    out: str | os.PathLike[str],
    images: ImageList,
    settings: GenerationSettings,
    *,
    model_name: str | None = None,
) -> bool:
    """Whether ``out`` holds every image of ``images``, in order, generated with these settings.

    Raises:
        RunExistsError: ``out`` was written by densify with other settings or for other images.
    """
    ids = images.image_ids
    return finished_before(Path(out), images, model_name, settings, Shard(), 0, len(ids), ids)


def check_records(records: list[DenseRecord], wanted: dict[str, int], out: Path) -> set[str]:
    """The ids of ``records``; raises on an id that is not one of ``wanted`` or that appears twice."""
    done: set[str] = set()
    for lineno, record in enumerate(records, start=1):
        if record.image_id not in wanted:
            raise DataError(f"{out}:{lineno}: image {record.image_id!r} is not one of this run's images")
        if record.image_id in done:
            raise DataError(f"{out}:{lineno}: image {record.image_id!r} appears twice")
        done.add(record.image_id)
    return done
