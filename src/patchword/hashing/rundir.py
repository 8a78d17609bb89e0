"""A hashing run directory while a command trains it: claimed by one new run (never written into when it
holds anything but what a start killed before its first checkpoint left), locked against a second command,
removed again when the start fails before its first checkpoint, cleared of the temporary files of writes
a kill cut short, and SIGTERM / SIGINT outside the training loop turned into :class:`Interrupted` with a
line saying what was kept. The same rules as ``patchword train``'s run directories
(:mod:`patchword.train.runner`).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from patchword.errors import RunExistsError
from patchword.fileio import exclusive_lock, only_entries, remove_stale_temps
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, METRICS_FILE, RESUMES_FILE, WEIGHTS_FILE
from patchword.train.runner import LOCK_FILE

__all__ = ["claim_new_run", "lock_run", "refuse_existing", "remove_run", "run_lock"]

_logger = logging.getLogger(__name__)

#: What a start writes before its first ``last.pt`` (metrics.jsonl: the records of epochs nobody can
#: resume), and the files it writes atomically by then, whose ``.{name}.XXXX.tmp`` a kill leaves.
_START_FILES = (LOCK_FILE, CONFIG_FILE, METRICS_FILE)
_START_TEMPS = (CONFIG_FILE, LAST_CHECKPOINT)
#: Every file a run writes atomically (the export: model.safetensors, config.json).
_ATOMIC_FILES = (*_START_TEMPS, METRICS_FILE, RESUMES_FILE, "eval.json", WEIGHTS_FILE, "config.json")


def _holds_files(run_dir: Path) -> bool:
    """Whether ``run_dir`` exists with something in it (its lock file alone is nothing)."""
    return run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir())


def _failed_start(run_dir: Path) -> list[str] | None:
    """The entries of ``run_dir`` when it holds only what a start writes before its first checkpoint and
    the temporary files of those writes (a start killed outright, ``kill -9`` or the OOM killer, which runs
    no cleanup): nothing to resume, so the same command starts the run again. None otherwise."""
    return only_entries(run_dir, _START_FILES, temps_of=_START_TEMPS)


def refuse_existing(run_dir: Path) -> None:
    """A new run never writes into a directory that holds anything (a killed run's config.yaml was
    rewritten and its metrics.jsonl got a second run's records appended) except what a start killed before
    its first checkpoint left, which :func:`claim_new_run` removes.

    Raises:
        RunExistsError: saying how to continue (``--resume``) or, without a checkpoint, what to remove.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise RunExistsError(f"{run_dir} is a file: choose another --name or --output-dir")
    if not _holds_files(run_dir) or _failed_start(run_dir) is not None:
        return
    if (run_dir / LAST_CHECKPOINT).is_file():
        raise RunExistsError(
            f"{run_dir} already holds a run; continue it with `patchword hash train --resume {run_dir}` or "
            "choose another --name"
        )
    what = "files of something else"
    if (run_dir / CONFIG_FILE).is_file():
        what = (
            f"a run that stopped before its first checkpoint ({CONFIG_FILE}, no {LAST_CHECKPOINT}) with "
            "files a start does not write"
        )
    raise RunExistsError(
        f"{run_dir} already holds {what}: nothing to --resume; remove it or choose another --name"
    )


def run_lock(run_dir: Path) -> contextlib.AbstractContextManager[None]:
    """The exclusive lock of ``run_dir`` for the block (one training command at a time on a run).

    Raises:
        RunExistsError: another process holds it.
    """
    return exclusive_lock(
        run_dir / LOCK_FILE,
        f"run directory {run_dir} is in use by another process (a `patchword hash train` or `--resume` of "
        "it is running): wait for it to end, or stop it first",
    )


def claim_new_run(run_dir: Path, locks: contextlib.ExitStack, claim: dict[str, bool]) -> None:
    """Create ``run_dir`` and lock it (or take the empty directory a user made, under the lock); race-free
    against another start of the same name. ``claim`` says what a failed start may remove: ``owned`` once
    the run is this command's, ``created`` when it made the directory."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_dir.mkdir()  # of two starts of one name, one creates the directory
        created = True
    except FileExistsError:
        created = False
    locks.enter_context(run_lock(run_dir))
    refuse_existing(run_dir)  # under the lock: nobody writes it now
    left = [name for name in _failed_start(run_dir) or [] if name != LOCK_FILE]
    if left:
        for name in left:
            (run_dir / name).unlink(missing_ok=True)
        _logger.warning(
            "%s: a start killed before its first checkpoint left %s: removed, starting the run again",
            run_dir,
            ", ".join(left),
        )
    claim.update(created=created, owned=True)


def lock_run(run_dir: Path, locks: contextlib.ExitStack) -> None:
    """Lock the run for a resume; then, nobody else writing it, delete the temporary files of writes a
    kill cut short (a ``.last.pt.XXXX.tmp`` is as large as the checkpoint)."""
    locks.enter_context(run_lock(run_dir))
    remove_stale_temps(run_dir, _ATOMIC_FILES)


def remove_run(run_dir: Path, created: bool) -> None:
    """A start that failed before the first checkpoint leaves nothing behind (the same command can simply
    be run again; a half-made directory would be refused)."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:  # an empty directory the user made: remove only what this run wrote
        for name in _failed_start(run_dir) or _START_FILES:
            if name != LOCK_FILE:
                (run_dir / name).unlink(missing_ok=True)
    _logger.info("start failed before the first checkpoint: %s removed", run_dir)
