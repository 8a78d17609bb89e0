"""What a rerun finds: the sidecar check that refuses to mix two runs in one file, and the finished lines.

A densify output is continued only by the run that started it: same model (its files, by fingerprint: see
:mod:`patchword.densify.fingerprint`), model id, decoding settings, precision, image list (by fingerprint),
the images themselves (the same image folder; for synthetic scenes, the same generator config: see
:func:`check_continuation`) and shard range. Batch size and device may change (with a warning; a shard keeps
the image range its first run recorded), except the batch size of a sampled run: its batches are seeded by
position, so the rest would be drawn otherwise. A file densify did not write (no sidecar) is never touched.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from patchword.densify.config import GenerationSettings
from patchword.densify.fingerprint import FIELD as FINGERPRINT
from patchword.densify.fingerprint import model_mismatch, unverified
from patchword.densify.shards import Shard, check_shard_sidecar, synthetic_config
from patchword.densify.sources import ImageList, fingerprint
from patchword.densify.store import DenseRecord, read_records, read_sidecar, repair_tail, write_sidecar
from patchword.errors import ConfigError, DataError, RunExistsError

__all__ = [
    "shard_range",
    "run_meta",
    "check_existing",
    "check_continuation",
    "open_output",
    "finished_before",
    "is_complete",
    "check_records",
]

logger = logging.getLogger(__name__)

# Sidecar fields a rerun must match (the text they produce would differ otherwise); the model's fingerprint
# too, through model_mismatch (a sidecar of an older patchword has none: the --model values decide then), and
# the image folder (or synthetic config) of "source" and a sampled run's batch size, through
# check_continuation ("source" as a whole differs harmlessly: another path to the dataset json, say).
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


def shard_range(out: Path, shard: Shard, num_images: int, batch_size: int) -> tuple[int, int]:
    """``(start, stop)`` of this run: the range the first run of ``out`` recorded when this run continues
    it (same shard of as many images), so that a rerun may change ``--batch-size``; else the shard's range
    cut with ``batch_size``. Any other difference from the first run is refused later, naming it."""
    start, stop = shard.image_range(num_images, batch_size)
    old = read_sidecar(out) if out.exists() else None
    if old is None or old.get("shard") != str(shard) or old.get("num_images") != num_images:
        return start, stop
    check_shard_sidecar(out, old)  # a damaged range is named, not used
    if (old["start"], old["stop"]) != (start, stop):
        logger.info(
            "%s: shard %s keeps the images %d..%d its first run (batch size %s) took; batch size %d would "
            "cut %d..%d",
            out,
            shard,
            old["start"],
            old["stop"] - 1,
            old.get("batch_size"),
            batch_size,
            start,
            stop - 1,
        )
    return int(old["start"]), int(old["stop"])


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
    model_fingerprint: str | None = None,
) -> dict[str, object]:
    """The sidecar content of a run (see :mod:`patchword.densify.store`)."""
    return {
        "model": model_name,
        FINGERPRINT: model_fingerprint,
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
    # start / stop follow from the shard and the first run's batch size (a resume keeps its range), so
    # "shard" differs before they can
    if key == "images_sha256":
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


def _refuse_foreign(out: Path, old: dict[str, object] | None) -> None:
    if old is None:
        raise RunExistsError(
            f"{out} exists but was not written by patchword densify (no {out.name}.densify.json); "
            "choose another --out"
        )


def _image_root(source: object) -> tuple[str, str] | None:
    """``(flag, folder)`` the images of a sidecar's ``source`` are read from (None: no folder recorded)."""
    if not isinstance(source, dict):
        return None
    key, flag = ("root", "--images") if source.get("kind") == "folder" else ("image_root", "--image-root")
    folder = source.get(key)  # laps and karpathy: the --image-root; synthetic scenes have none
    return (flag, folder) if isinstance(folder, str) else None


def _same_folder(old: str, new: str) -> bool:
    """Whether the recorded folder ``old`` is ``new`` (both absolute): the same path, or a path that leads
    to the same folder now (a symlink left where a moved folder was, another mount of it)."""
    if old == new:
        return True
    try:
        return os.path.samefile(old, new)
    except OSError:  # the recorded folder is gone (or unreadable): another place
        return False


def check_continuation(out: Path, old: dict, source: dict, do_sample: bool, batch_size: int) -> None:
    """What a run that continues ``out`` (its sidecar ``old``) must share with the first run beyond the
    fields compared by name: the images themselves, and, when sampling, the batches.

    The image list is compared by its ids (``images_sha256``): another folder holding files of the same
    relative names (``--images photos_other`` for ``photos``, another ``--image-root``), or synthetic scenes
    of another generator config, have the same ids, and the file would describe two image sets. The
    folder is compared here, on resume only: ``densify merge`` joins shards made on machines whose mounts
    differ, so it compares no paths. Sampled text depends on the batching (batch ``k`` is seeded with
    ``seed + k``): another batch size draws completely different text for the rest.

    Raises:
        RunExistsError: another image folder or synthetic config than the first run's.
        ConfigError: ``--batch-size`` differs from the first run's, with sampling.
    """
    old_source = old.get("source")
    before, now = _image_root(old_source), _image_root(source)
    if before is not None and now is not None and not _same_folder(before[1], now[1]):
        raise RunExistsError(
            f"{out} was started on the images in {before[1]} and this run reads {now[1]}: the file would "
            f"describe two image sets; rerun with {now[0]} {before[1]} (if the images moved, link that path "
            f"to them first: ln -s {now[1]} {before[1]}), else choose another --out"
        )
    # synthetic scenes: the config draws them, their ids say nothing; compared as the sidecar holds it (JSON:
    # the config's tuples are lists there)
    before_config, now_config = synthetic_config(old_source), synthetic_config(source)
    now_config = None if now_config is None else json.loads(json.dumps(now_config))
    if before_config is not None and now_config is not None and before_config != now_config:
        named = [{f"synthetic {k}": v for k, v in c.items()} for c in (before_config, now_config)]
        raise _mismatch(out, "source", *named)
    if do_sample and old.get("batch_size") not in (None, batch_size):
        raise ConfigError(
            "--batch-size",
            f"{out} was started with --batch-size {old.get('batch_size')} and --sample; this run has "
            f"{batch_size}: sampled text depends on the batching (batch k is seeded with seed + k), so the "
            f"rest would not be what the first run draws; rerun with --batch-size {old.get('batch_size')}, "
            "or choose another --out",
        )


def check_existing(
    out: Path,
    wanted: dict[str, int],
    source: dict[str, object],
    do_sample: bool,
    batch_size: int,
) -> set[str]:
    """The ids ``out`` holds, every line checked, the file left as it is (a run looks before it loads), and
    what :func:`check_continuation` checks.

    Raises:
        RunExistsError: ``out`` exists without a sidecar (not densify's), or another image folder.
        ConfigError: another ``--batch-size`` with sampling.
        DataError: a line is blank or malformed, or names an image twice or one not of this run.
    """
    if not out.exists():
        return set()
    old = read_sidecar(out)
    _refuse_foreign(out, old)
    check_continuation(out, old, source, do_sample, batch_size)
    return check_records(read_records(out)[0], wanted, out)


def open_output(out: Path, meta: dict[str, object], wanted: dict[str, int]) -> set[str]:
    """Validate or create ``out`` and its sidecar; returns the ids already in it.

    Everything is checked before anything changes: the torn last line of a killed run is cut off only
    once the sidecar and every complete line passed (a file that is refused stays byte for byte as it was).
    """
    old = read_sidecar(out)
    if out.exists():
        _refuse_foreign(out, old)
        for key in _RESUME_FIELDS:
            if old.get(key) != meta[key]:
                raise _mismatch(out, key, old.get(key), meta[key])
        other_model = model_mismatch(old, meta)
        if other_model is not None:
            raise RunExistsError(
                f"{out} was started with another model: {other_model}; rerun with the first run's model, "
                "or choose another --out"
            )
        if unverified(old, meta):
            logger.warning(
                "%s: its sidecar (or this model) records no model fingerprint (a file of an older "
                "patchword): resuming with --model %s, the first run's, without checking that its files are "
                "the same",
                out,
                meta["model"],
            )
        sampled = bool(meta["generation"]["do_sample"])  # run_meta's: the settings as a dict
        check_continuation(out, old, meta["source"], sampled, meta["batch_size"])
        done = check_records(read_records(out)[0], wanted, out)
        if old.get("batch_size") != meta["batch_size"] or old.get("device") != meta["device"]:
            # greedy text may change in the rounding only; a sampled run keeps its batch size (refused
            # above), but another device draws from another random number generator
            differ = (
                "with --sample, another device draws other random numbers: their text differs from what "
                "the first device would have sampled"
                if sampled
                else "the remaining images may differ in the last bits from what the first settings would "
                "have produced"
            )
            logger.warning(
                "resuming %s with batch size %s on %s (first run: %s on %s): %s",
                out,
                meta["batch_size"],
                meta["device"],
                old.get("batch_size"),
                old.get("device"),
                differ,
            )
        repair_tail(out)  # only bytes after the last newline go: the records checked above stay
        return done
    write_sidecar(out, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch()
    return set()


def finished_before(
    out: Path,
    images: ImageList,
    model_name: str | None,
    settings: GenerationSettings,
    shard: Shard,
    start: int,
    stop: int,
    ids: list[str],
    *,
    model_id: str | None = None,
    precision: str | None = None,
) -> bool:
    """Whether ``out`` already holds this exact run, complete; raises if it holds another run.

    ``model_id`` / ``precision``: the values the user gave (``--model-id``, a ``--precision`` other than
    ``auto``), None where the loaded model decides. Given, they are compared with the sidecar here, before
    the model loads: a finished file made with another value was reported as "nothing left to generate"
    (the loaded model's values are compared only when there is something to generate).
    """
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
        **({} if model_id is None else {"model_id": model_id}),
        **({} if precision is None else {"precision": precision}),
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
    model_id: str | None = None,
    precision: str | None = None,
) -> bool:
    """Whether ``out`` holds every image of ``images``, in order, generated with these settings
    (``model_id`` / ``precision``: as :func:`finished_before` compares them).

    Raises:
        RunExistsError: ``out`` was written by densify with other settings or for other images.
    """
    ids = images.image_ids
    return finished_before(
        Path(out),
        images,
        model_name,
        settings,
        Shard(),
        0,
        len(ids),
        ids,
        model_id=model_id,
        precision=precision,
    )


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
