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

The suites (``eval_compositional.json``, ``eval_patches.json``: ``patchword eval RUN --suite``) record the
same identity (:func:`evaluation_identity`, the fields a recall record carries) and
:func:`suite_evaluation_of` finds the one describing a checkpoint by the same rules; a suite record written
before they carried it is never trusted (nothing in it proves which weights or settings it scored).
:func:`evaluation_and_unused` also says why each other recall ``eval_*.json`` does not describe it, by the
same rules (:func:`_why_unused`: one function decides both). :class:`RecordedEvaluations` answers both
lookups of a checkpoint from one read of each file.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from patchword.fileio import file_sha256
from patchword.readers import read_json
from patchword.runs.files import BEST_CHECKPOINT, CONFIG_FILE, IMPORT_FILE, LAST_CHECKPOINT, SUMMARY_FILE
from patchword.runs.load import config_hash
from patchword.version import __version__

__all__ = [
    "DIGEST_FIELD",
    "IDENTITY_FIELDS",
    "NEUTRAL_OVERRIDES",
    "RecordedEvaluations",
    "checkpoint_facts",
    "checkpoint_identity",
    "evaluation_and_unused",
    "evaluation_identity",
    "evaluation_provenance",
    "evaluation_of",
    "file_sha256",
    "path_in_run",
    "suite_evaluation_of",
    "suite_files_identity",
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
    it was saved at; none for imported weights, trained elsewhere) and ``dev_rsum`` (``best.pt``: the dev
    rSum that made it the best). Read memory-mapped (the tensors are not loaded); ``{}`` for a file that
    records nothing (``model.safetensors``) or that cannot be read that way."""
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
    # an import of an older version wrote step 0 beside its import.json: weights trained elsewhere, at a
    # step patchword does not know (an import now writes none)
    imported = state.get("step") == 0 and (path.parent / IMPORT_FILE).is_file()
    if isinstance(state.get("step"), int) and not imported:
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


#: The fields :func:`evaluation_identity`, :func:`evaluation_provenance` and :func:`suite_files_identity`
#: write into a record: what it measured and how, not figures (a reader collecting a suite's numbers skips
#: them: ``checkpoint_step`` is a number too).
IDENTITY_FIELDS = frozenset(
    {"run_dir", "checkpoint", "checkpoint_step", DIGEST_FIELD, "config_hash"}
    | {"patchword_version", "time", "overrides", "suite_files"}
)


def evaluation_identity(
    run_dir: str | Path, checkpoint: str | Path, *, digest: bool = True
) -> dict[str, Any]:
    """What every evaluation record (``eval_<split>.json`` and each member of an ensemble's, the suites'
    ``eval_compositional.json`` / ``eval_patches.json``) says about what it scored: ``run_dir`` and
    ``checkpoint`` (the paths as the evaluation was given them, so relative to one working directory),
    :func:`checkpoint_identity` (with ``digest``; false on the processes of a launch that write nothing:
    hashing the file there would be wasted) and ``config_hash`` (the run's ``config.yaml``). By these
    :func:`evaluation_of` and :func:`suite_evaluation_of` later tell whether it describes a checkpoint."""
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        **(checkpoint_identity(checkpoint) if digest else {}),
        "config_hash": config_hash(run_dir),
    }


def evaluation_provenance(overrides: list[str]) -> dict[str, Any]:
    """What every evaluation file records beside :func:`evaluation_identity`: the version and time that
    wrote it and the ``overrides`` it ran under (a record is trusted only without any but
    :data:`NEUTRAL_OVERRIDES`)."""
    return {
        "patchword_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "overrides": overrides,
    }


def suite_files_identity(files: Sequence[str | Path] | None) -> list[dict[str, str]]:
    """A suite record's ``"suite_files"``: each file it read (``--suite-file``) as ``{"path": as given,
    "sha256": of its bytes}``; ``[]`` for a suite that read none (the run's own synthetic suite, the patch
    probes)."""
    return [{"path": str(f), "sha256": file_sha256(f)} for f in files or []]


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


class _Target(NamedTuple):
    """A checkpoint looked up in a run: ``absolute`` (its path), ``inside`` (relative to the run
    directory), ``written`` (its mtime, 0 when missing), ``digest`` (its sha256, None when it is no file)
    and the run's ``current`` config hash (None without a config.yaml)."""

    absolute: Path
    inside: Path
    written: float
    digest: Callable[[], str | None]
    current: str | None


def _target(run_dir: Path, checkpoint: str | Path) -> _Target | None:
    """``checkpoint`` resolved as :func:`evaluation_of` describes; None for a file outside the run."""
    absolute = Path(checkpoint)
    if not absolute.is_absolute() and ((run_dir / absolute).is_file() or not absolute.is_file()):
        absolute = run_dir / absolute
    inside = path_in_run(run_dir, absolute)
    if inside is None:
        return None
    written = absolute.stat().st_mtime if absolute.is_file() else 0.0
    current = config_hash(run_dir) if (run_dir / CONFIG_FILE).is_file() else None
    # hashed on the first call only: once per lookup, and not at all when no record carries a digest
    digest = functools.cache(lambda: file_sha256(absolute) if absolute.is_file() else None)
    return _Target(absolute, inside, written, digest, current)


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
    measures), not an ensemble nor a suite's record (:func:`suite_evaluation_of`), and of the file's present
    content (the digest it records; for a record without one, not older than the checkpoint file); those of
    ``split`` (e.g. the run's ``eval.split``) before others. Then ``summary.json`` when it evaluated these
    bytes (its digest) or, for a summary without a digest, the checkpoint is the one training evaluated
    (``best.pt`` holding the summary's best dev rSum, or ``last.pt`` in a run without one) and the summary
    is not older than it. ``({}, None)`` when none describes it, and always for a checkpoint outside the
    run. The checkpoint is hashed at most once, and only when a candidate carries a digest.
    """
    return evaluation_and_unused(run_dir, checkpoint, split)[:2]


def evaluation_and_unused(
    run_dir: str | Path, checkpoint: str | Path, split: str | None = None
) -> tuple[dict, str | None, list[tuple[str, str]]]:
    """:func:`evaluation_of`, with the (file name, why) of each recall ``eval_*.json`` of ``run_dir`` that
    does not describe ``checkpoint`` (overrides that change what it measures, another checkpoint, another
    config, other bytes, an ensemble's), in name order; suite records are left out (they are no recall
    evaluation). One lookup of the checkpoint, one read of each file: what a report says of a run.
    """
    return RecordedEvaluations(run_dir, checkpoint).recall(split)


def _why_unused(record: dict[str, Any], target: _Target, recorded_at: float) -> str | None:
    """Why an ``eval_*.json`` record does not describe ``target`` (:func:`evaluation_of`'s rules, in the
    order a user would fix them); None where it does. A suite's record must also carry every identity
    field (the digest, the overrides and the suite files it read: one of an older version proves nothing).
    ``overrides``: a list, one string (one override) or none; anything else is not trusted."""
    if "ensemble" in record:
        return "an ensemble's evaluation, not of this checkpoint alone"
    if record.get("suite") is not None and (
        record.get(DIGEST_FIELD) is None
        or not isinstance(record.get("overrides"), list)
        or not isinstance(record.get("suite_files"), list)
    ):
        return "written before suite records said what they scored"
    overrides = record.get("overrides")
    if overrides is not None and not isinstance(overrides, (str, list)):
        return f"records its overrides as {type(overrides).__name__}, not a list"
    listed = [overrides] if isinstance(overrides, str) else overrides or []
    changing = [str(o) for o in listed if str(o).split("=", 1)[0].strip() not in NEUTRAL_OVERRIDES]
    if changing:
        return f"made with overrides that change what it measures ({', '.join(changing)})"
    if not _names(record, target.inside):
        named = record.get("checkpoint")
        return f"of another checkpoint ({named})" if named else "names no checkpoint it scored"
    if record.get("config_hash") != target.current:
        return "made with another config.yaml than the run's present one"
    if not _measured(record, target.digest, recorded_at, target.written):
        kind = "other weights than" if record.get(DIGEST_FIELD) is not None else "older than"
        return f"of {kind} {target.inside} holds now"
    return None


def _scored_files(record: dict[str, Any]) -> list[str]:
    """The sorted digests of the suite files a suite record read (an entry without one: "")."""
    return sorted(str(e.get("sha256") or "") if isinstance(e, dict) else "" for e in record["suite_files"])


def suite_evaluation_of(
    run_dir: str | Path,
    checkpoint: str | Path,
    suite: str,
    *,
    suite_files: Sequence[str | Path] | None = None,
) -> tuple[dict, str | None]:
    """The recorded ``suite`` evaluation (``"compositional"`` or ``"patches"``) of ``checkpoint`` and the
    name of the file it came from in ``run_dir``; ``({}, None)`` when no record describes it.

    ``checkpoint`` is resolved as :func:`evaluation_of` resolves it (pass
    ``resolve_checkpoint(run_dir)`` for the run's best checkpoint). Candidates are the ``eval_*.json``
    files of ``run_dir`` (``eval_compositional.json``, ``eval_patches.json``, or any ``--out`` name there)
    whose ``"suite"`` is ``suite`` and which, by :func:`evaluation_of`'s rules, describe the checkpoint:
    they name it (``run_dir`` / ``checkpoint``), carry the sha256 of its present bytes, the hash of the
    run's present ``config.yaml`` and no overrides but :data:`NEUTRAL_OVERRIDES` (``data.synthetic_seed=3``
    scores other scenes). The newest of them (file mtime) is returned. Unlike :func:`evaluation_of` there is
    no fallback: a suite record without the digest, the ``overrides`` list or the ``suite_files`` list (of
    a version before they were recorded) is never returned, nor is ``summary.json`` (training runs no
    suite). A checkpoint outside the run has none.

    ``suite_files`` chooses what the suite must have scored (the record's ``"suite_files"``:
    :func:`suite_files_identity`): None, anything (the run's synthetic suite or any ``--suite-file``: the
    returned record's ``"suite_files"`` says which, with their digests); ``[]``, the run's own synthetic
    suite only (no suite files: what ``patchword sweep --suite`` scores); files, exactly the files holding
    these bytes now (compared by sha256, in any order; the images they name are not hashed, the record's
    ``"image_root"`` says where they were read; a file that cannot be read raises OSError).

    Returns:
        (the record as written: for ``"compositional"`` ``{kind: accuracy % or None, ..., "n": {kind:
        triples}, "suite", "source", "image_root", "matcher", "eval_seconds"}`` and :data:`IDENTITY_FIELDS`;
        for ``"patches"`` the probe figures with the same identity, its file name such as
        ``"eval_compositional.json"``), or ``({}, None)``. The checkpoint is hashed at most once.
    """
    return RecordedEvaluations(run_dir, checkpoint).suite(suite, suite_files=suite_files)


class RecordedEvaluations:
    """The evaluations ``run_dir`` recorded of ``checkpoint`` (resolved as :func:`evaluation_of` resolves
    it), each ``eval_*.json`` read once and the checkpoint hashed at most once for every lookup made:
    :meth:`recall` (:func:`evaluation_and_unused`) and :meth:`suite` (:func:`suite_evaluation_of`), both of
    which ``patchword report`` asks of each run."""

    def __init__(self, run_dir: str | Path, checkpoint: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._target = _target(self.run_dir, checkpoint)
        # (mtime, path, record) of each eval_*.json in name order; none read for a checkpoint outside the run
        paths = sorted(self.run_dir.glob("eval_*.json")) if self._target is not None else []
        read = [(path, _read(path)) for path in paths]
        self._files = [(path.stat().st_mtime, path, record) for path, record in read if record is not None]

    def recall(self, split: str | None = None) -> tuple[dict, str | None, list[tuple[str, str]]]:
        """:func:`evaluation_and_unused` of the run and checkpoint."""
        if (target := self._target) is None:
            return {}, None, []
        records, unused = self._of_kind(None)
        found = [
            ((split is None or record.get("split") == split), recorded_at, path, record)
            for recorded_at, path, record in records
        ]
        if found:
            _, _, path, record = max(found, key=lambda item: item[:2])
            return record, path.name, unused
        summary_path = self.run_dir / SUMMARY_FILE
        summary = _read(summary_path)
        if (
            summary
            and _summary_describes(self.run_dir, summary, target.inside, target.absolute)
            and _measured(summary, target.digest, summary_path.stat().st_mtime, target.written)
        ):
            return summary, summary_path.name, unused
        return {}, None, unused

    def suite(
        self, suite: str, *, suite_files: Sequence[str | Path] | None = None
    ) -> tuple[dict, str | None]:
        """:func:`suite_evaluation_of` of the run and checkpoint."""
        found = self._of_kind(suite)[0]  # none for a checkpoint outside the run (no file read)
        if suite_files is not None:
            wanted = sorted(file_sha256(f) for f in suite_files)
            found = [item for item in found if _scored_files(item[2]) == wanted]
        if not found:
            return {}, None
        _, path, record = max(found, key=lambda item: item[0])
        return record, path.name

    def _of_kind(self, suite: str | None) -> tuple[list[tuple[float, Path, dict]], list[tuple[str, str]]]:
        """The records of one kind (``suite``: None for recall records, else that suite's), split by
        :func:`_why_unused`: (mtime, path, record) of each describing the checkpoint, (name, why) of others"""
        found, unused = [], []
        for recorded_at, path, record in self._files:
            if record.get("suite") != suite:
                continue
            why = _why_unused(record, self._target, recorded_at)
            if why is None:
                found.append((recorded_at, path, record))
            else:
                unused.append((path.name, why))
        return found, unused
