"""Which recorded evaluation of a run describes a given checkpoint of it.

A run directory can hold several evaluations: ``summary.json`` (written by training, from ``best.pt`` when
there is one, else from the final weights, which ``last.pt`` holds) and the ``eval_<split>.json`` files
``patchword eval`` writes (each naming its run directory, its checkpoint and the hash of the config it used).
A number shown next to a checkpoint (an export's model card, a report row) must come from an evaluation of
that checkpoint with the run's current config: :func:`evaluation_of` finds it, or says there is none. A
checkpoint outside the run directory has none: nothing the run recorded measured it.

Which checkpoint a record measured is decided by content: ``patchword eval`` and training record the sha256
of the checkpoint file they scored (``checkpoint_sha256``), and the record describes a file only while it
holds those bytes. File dates cannot say it: a checkpoint copied over another with its date kept (``cp -p``,
``rsync -t``) or a clock set back leaves a newer-looking evaluation of other weights. Records written before
the digest was kept fall back to the path they name and the dates.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patchword.fileio import file_sha256
from patchword.readers import read_json
from patchword.runs.files import BEST_CHECKPOINT, CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE
from patchword.runs.load import config_hash

__all__ = [
    "DIGEST_FIELD",
    "NEUTRAL_OVERRIDES",
    "checkpoint_facts",
    "checkpoint_identity",
    "evaluation_of",
    "file_sha256",
    "path_in_run",
]

#: The field of an evaluation record (``eval_*.json``, ``summary.json``) holding the sha256 of the
#: checkpoint file it scored.
DIGEST_FIELD = "checkpoint_sha256"


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when the file is missing; a damaged one is a DataError naming it."""
    return read_json(
        path, "recorded evaluation" if path.name.startswith("eval_") else "run summary", default=None
    )


#: Overrides of ``patchword eval`` after which its file still describes the run as configured: the
#: progress bar, where the data cache lives, loader workers, the scoring engine's memory budget (block
#: sizes: the engine is exact whatever they are).
NEUTRAL_OVERRIDES = frozenset({"progress", "data.cache_dir", "data.num_workers", "eval.max_memory_mb"})


def path_in_run(run_dir: str | Path, checkpoint: str | Path) -> Path | None:
    """``checkpoint``'s path relative to ``run_dir`` (``best.pt``), or None when it lies outside it.

    Directories are compared with symbolic links resolved (a run reached through a link is the same run);
    the file itself is not followed, so a link named ``best.pt`` inside the run is that run's file."""
    checkpoint = Path(checkpoint)
    folder = Path(os.path.realpath(checkpoint.absolute().parent))
    try:
        return (folder / checkpoint.name).relative_to(Path(os.path.realpath(run_dir)))
    except ValueError:
        return None


def checkpoint_facts(checkpoint: str | Path) -> dict[str, Any]:
    """What a patchword checkpoint records about itself besides its weights: ``step`` (the training step
    it was saved at) and ``dev_rsum`` (``best.pt``: the dev rSum that made it the best). Read memory-mapped
    (the tensors are not loaded); ``{}`` for a file that records nothing (``model.safetensors``) or that
    cannot be read that way."""
    import torch

    path = Path(checkpoint)
    if path.suffix == ".safetensors" or not path.is_file():
        return {}
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an old or odd file: nothing can be said about it, nothing is claimed
        return {}
    if not isinstance(state, dict):
        return {}
    facts: dict[str, Any] = {}
    if isinstance(state.get("step"), int):
        facts["step"] = state["step"]
    rsum = (state.get("metrics") or {}).get("rsum") if isinstance(state.get("metrics"), dict) else None
    if isinstance(rsum, (int, float)):
        facts["dev_rsum"] = float(rsum)
    return facts


def checkpoint_identity(checkpoint: str | Path) -> dict[str, Any]:
    """What an evaluation records of the checkpoint it scored: ``checkpoint_step`` (the training step it was
    saved at; None for a file that records none) and its content digest (:data:`DIGEST_FIELD`), by which
    :func:`evaluation_of` later tells whether the file still holds those weights."""
    return {
        "checkpoint_step": checkpoint_facts(checkpoint).get("step"),
        DIGEST_FIELD: file_sha256(checkpoint),
    }


def _lazy_digest(path: Path) -> Callable[[], str | None]:
    """The digest of ``path`` (None when it is no file), computed on the first call only: hashing a large
    checkpoint is paid once per lookup, and not at all when no record carries a digest."""
    return functools.cache(lambda: file_sha256(path) if path.is_file() else None)


def _measured(
    record: dict[str, Any], digest: Callable[[], str | None], recorded_at: float, written: float
) -> bool:
    """Whether ``record`` (written at ``recorded_at``) measured the checkpoint's present bytes: by content
    when it carries their digest (dates play no part), else, for records of older versions, when it is not
    older than the checkpoint file (``written``)."""
    if record.get(DIGEST_FIELD) is not None:
        return record[DIGEST_FIELD] == digest()
    return recorded_at >= written


def _names(record: dict[str, Any], checkpoint: Path) -> bool:
    """Whether an ``eval_*.json`` record evaluated ``checkpoint`` (a path relative to the run directory):
    the checkpoint it names, relative to the run directory it names (both as ``patchword eval`` was given
    them, so from the same working directory), is that path. A record naming no run directory says
    nothing provable about its checkpoint."""
    recorded, run = record.get("checkpoint"), record.get("run_dir")
    if not recorded or not run:
        return False
    return Path(os.path.normpath(os.path.relpath(str(recorded), str(run)))) == checkpoint


def _usable(record: dict[str, Any] | None, checkpoint: Path, current: str | None) -> bool:
    """An ``eval_*.json`` recall evaluation of ``checkpoint`` alone with the run's current config, as
    configured."""
    return (
        record is not None
        and "ensemble" not in record
        and "suite" not in record  # eval_compositional.json / eval_patches.json: no recall table
        and not any(str(o).split("=", 1)[0] not in NEUTRAL_OVERRIDES for o in record.get("overrides") or [])
        and record.get("config_hash") == current
        and _names(record, checkpoint)
    )


def _summary_describes(run_dir: Path, summary: dict[str, Any], checkpoint: Path, absolute: Path) -> bool:
    """Whether ``summary.json`` is training's evaluation of ``checkpoint``: a summary carrying the digest of
    the file it evaluated describes the file holding those bytes (checked by :func:`_measured`); an older
    one, the file training evaluated (``best.pt``, or ``last.pt`` in a run without one) and, for ``best.pt``,
    only while it holds the dev rSum the summary says the best checkpoint reached (a file copied over it
    with its date kept holds another)."""
    if summary.get(DIGEST_FIELD) is not None:
        return True
    trained = BEST_CHECKPOINT if (run_dir / BEST_CHECKPOINT).is_file() else LAST_CHECKPOINT
    if checkpoint != Path(trained):
        return False
    best = summary.get("best_dev_rsum")
    dev_rsum = checkpoint_facts(absolute).get("dev_rsum") if trained == BEST_CHECKPOINT else None
    return best is None or dev_rsum is None or float(best) == dev_rsum


def evaluation_of(
    run_dir: str | Path, checkpoint: str | Path, split: str | None = None
) -> tuple[dict, str | None]:
    """The recorded evaluation of ``checkpoint`` (a file of ``run_dir``; a relative path is looked up in the
    run first, as :func:`~patchword.runs.load.resolve_checkpoint` does) and the file it came from.

    Candidates, newest first: ``eval_*.json`` of that checkpoint (the file it names, relative to the run
    directory it names, is this one), made with the run's current ``config.yaml`` (config hash), without
    overrides but those of :data:`NEUTRAL_OVERRIDES` (they change how the evaluation runs, not what it
    measures), not an ensemble, and of the file's present content (the digest it records; for a record
    without one, not older than the checkpoint file); those of ``split`` (e.g. the run's ``eval.split``)
    before others. Then ``summary.json`` when it evaluated these bytes (its digest) or, for a summary without
    a digest, the checkpoint is the one training evaluated (``best.pt`` holding the summary's best dev rSum,
    or ``last.pt`` in a run without one) and the summary is not older than it. ``({}, None)`` when none
    describes it, and always for a checkpoint outside the run. The checkpoint is hashed at most once, and
    only when a candidate carries a digest.
    """
    run_dir, absolute = Path(run_dir), Path(checkpoint)
    if not absolute.is_absolute() and ((run_dir / absolute).is_file() or not absolute.is_file()):
        absolute = run_dir / absolute
    inside = path_in_run(run_dir, absolute)
    if inside is None:
        return {}, None
    written = absolute.stat().st_mtime if absolute.is_file() else 0.0
    digest = _lazy_digest(absolute)
    current = config_hash(run_dir) if (run_dir / CONFIG_FILE).is_file() else None
    found = []
    for path in run_dir.glob("eval_*.json"):
        record = _read(path)
        recorded_at = path.stat().st_mtime
        if _usable(record, inside, current) and _measured(record, digest, recorded_at, written):
            found.append(((split is None or record.get("split") == split), recorded_at, path, record))
    if found:
        _, _, path, record = max(found, key=lambda item: item[:2])
        return record, path.name
    summary_path = run_dir / SUMMARY_FILE
    summary = _read(summary_path)
    if (
        summary
        and _summary_describes(run_dir, summary, inside, absolute)
        and _measured(summary, digest, summary_path.stat().st_mtime, written)
    ):
        return summary, summary_path.name
    return {}, None
