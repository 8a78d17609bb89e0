"""Which recorded evaluation of a run describes a given checkpoint of it.

A run directory can hold several evaluations: ``summary.json`` (written by training, from ``best.pt`` when
there is one, else from the final weights, which ``last.pt`` holds) and the ``eval_<split>.json`` files
``patchword eval`` writes (each naming its checkpoint and the hash of the config it used). A number shown
next to a checkpoint (an export's model card, a report row) must come from an evaluation of that checkpoint
with the run's current config: :func:`evaluation_of` finds it, or says there is none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchword.readers import read_json
from patchword.runs.files import BEST_CHECKPOINT, CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE
from patchword.runs.load import config_hash

__all__ = ["NEUTRAL_OVERRIDES", "evaluation_of"]


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when the file is missing; a damaged one is a DataError naming it."""
    return read_json(
        path, "recorded evaluation" if path.name.startswith("eval_") else "run summary", default=None
    )


#: Overrides of ``patchword eval`` after which its file still describes the run as configured: the
#: progress bar, where the data cache lives, loader workers, the scoring engine's memory budget (block
#: sizes: the engine is exact whatever they are).
NEUTRAL_OVERRIDES = frozenset({"progress", "data.cache_dir", "data.num_workers", "eval.max_memory_mb"})


def evaluation_of(
    run_dir: str | Path, checkpoint: str | Path, split: str | None = None
) -> tuple[dict, str | None]:
    """The recorded evaluation of ``checkpoint`` (a file of ``run_dir``) and the file it came from.

    Candidates, newest first: ``eval_*.json`` of that checkpoint (by file name), made with the run's current
    ``config.yaml`` (config hash), without overrides but those of :data:`NEUTRAL_OVERRIDES` (they change
    how the evaluation runs, not what it measures), not an ensemble, and not older than the checkpoint
    file; those of ``split`` (e.g. the run's ``eval.split``) before others. Then ``summary.json`` when the
    checkpoint is the one training evaluated (``best.pt``, or ``last.pt`` in a run without one) and the
    summary is not older than it. ``({}, None)`` when none describes it.
    """
    run_dir, checkpoint = Path(run_dir), Path(checkpoint)
    if not checkpoint.is_absolute() and not checkpoint.is_file():
        checkpoint = run_dir / checkpoint
    written = checkpoint.stat().st_mtime if checkpoint.is_file() else 0.0
    current = config_hash(run_dir) if (run_dir / CONFIG_FILE).is_file() else None
    found = []
    for path in run_dir.glob("eval_*.json"):
        record = _read(path)
        if (
            record is None
            or "ensemble" in record
            or any(str(o).split("=", 1)[0] not in NEUTRAL_OVERRIDES for o in record.get("overrides") or [])
            or Path(str(record.get("checkpoint", ""))).name != checkpoint.name
            or record.get("config_hash") != current
            or path.stat().st_mtime < written
        ):
            continue
        found.append(((split is None or record.get("split") == split), path.stat().st_mtime, path, record))
    if found:
        _, _, path, record = max(found, key=lambda item: item[:2])
        return record, path.name
    summary_path = run_dir / SUMMARY_FILE
    summary = _read(summary_path)
    trained = BEST_CHECKPOINT if (run_dir / BEST_CHECKPOINT).is_file() else LAST_CHECKPOINT
    if summary and checkpoint.name == trained and summary_path.stat().st_mtime >= written:
        return summary, summary_path.name
    return {}, None
