"""A run directory while a command trains it, for every command that does (``patchword train``, ``patchword
hash train``): claimed by one new run, locked against a second command, removed again when the start fails
before its first checkpoint, cleared of what a start killed before its first checkpoint left and of the
temporary files of writes a kill cut short.

* A new run never writes into a directory that holds anything (a killed run's ``config.yaml`` would be
  rewritten and its ``metrics.jsonl`` get a second run's records appended) except what a start writes before
  its first checkpoint: a start killed outright (``kill -9``, the OOM killer: no cleanup runs) left it, and
  the same command removes it and starts again (:meth:`RunKind.failed_start`).
* One command at a time owns a run directory: it holds an advisory lock on its :data:`LOCK_FILE` for its
  whole life (the operating system drops it when the process ends, even by ``kill -9``), so a second start
  of the same name or a second ``--resume`` is refused instead of writing into the same files.
* A start or ``--resume`` removes the temporary files of writes a kill cut short, under the lock.

What differs between the commands (the files a start writes, the files written atomically, the words of
their refusals) is a :class:`RunKind`; each command defines its own (``patchword.train.runner``,
``patchword.hashing.rundir``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchword.errors import RunExistsError, resume_command
from patchword.fileio import only_entries, remove_stale_temps
from patchword.locks import exclusive_lock
from patchword.runs.files import BEST_CHECKPOINT, CONFIG_FILE, LAST_CHECKPOINT

__all__ = ["LOCK_FILE", "Claim", "Refusals", "RunKind"]

#: The file in a run directory whose lock the command training the run holds (empty; it may stay behind).
LOCK_FILE = ".lock"


def _no_outputs(run_dir: Path) -> Sequence[str]:  # noqa: ARG001 - the signature of RunKind.own_outputs
    return ()


@dataclass(frozen=True)
class Refusals:
    """The words of a new run's refusal of a directory that holds more than a killed start left, as
    ``str.format`` templates of ``run_dir`` and ``resume`` (the command line that continues the run)."""

    #: It holds a checkpoint: the run can be continued.
    resumable: str
    #: It holds a ``config.yaml`` but no checkpoint, and files a start does not write.
    stopped: str
    #: It holds neither: files of something else.
    foreign: str
    #: ``run_dir`` is a file.
    is_file: str
    #: It holds the best checkpoint but no ``last.pt`` (a kill while the first was written): weights one
    #: may evaluate, nothing to resume. Empty: ``stopped`` / ``foreign`` say it.
    evaluable: str = ""


@dataclass
class Claim:
    """What a start's failure may remove: ``owned`` once the run directory is this command's, ``created``
    when the command made the directory (else it took an empty one a user made, and removes only what it
    wrote)."""

    owned: bool = False
    created: bool = False


@dataclass(frozen=True)
class RunKind:
    """The run directories of one training command, and the rules of their life.

    Attributes:
        command: the command that trains them, as a user types it (``patchword train``): its messages name it.
        start_files: what a start writes before its first checkpoint (:data:`LOCK_FILE` among them; the
            metrics of steps nobody can resume too). Not a checkpoint that one may evaluate.
        start_temps: the files of ``start_files`` (and the first checkpoint) written atomically, whose
            ``.{name}.XXXX.tmp`` a kill during the write leaves.
        atomic_files: every file a run writes atomically, as paths inside the run directory
            (``export/model.safetensors``): a resume removes their leftover temporary files.
        refusals: the words of a new run's refusals.
        own_outputs: more entries a start of the run in ``run_dir`` writes, read from what it wrote (the
            outputs of the trackers its config names); none by default.
        logger: the name of the logger that reports what was removed (the command's own module).
    """

    command: str
    start_files: tuple[str, ...]
    start_temps: tuple[str, ...]
    atomic_files: tuple[str, ...]
    refusals: Refusals
    own_outputs: Callable[[Path], Sequence[str]] = field(default=_no_outputs)
    logger: str = __name__

    def _log(self) -> logging.Logger:
        return logging.getLogger(self.logger)

    def resume_command(self, run_dir: Path) -> str:
        """The command line that continues the run in ``run_dir``, quoted as messages quote it."""
        return resume_command(self.command, run_dir)

    def lock(self, run_dir: Path) -> contextlib.AbstractContextManager[None]:
        """Hold the exclusive lock of ``run_dir`` for the block (one training command at a time on a run).

        Raises:
            RunExistsError: another process holds it (it trains or resumes this run now).
        """
        return exclusive_lock(
            run_dir / LOCK_FILE,
            f"run directory {run_dir} is in use by another process (a `{self.command}` or `--resume` of it "
            "is running): wait for it to end, or stop it first",
        )

    def holds_files(self, run_dir: Path) -> bool:
        """Whether ``run_dir`` is a directory with something in it (its lock file alone is nothing)."""
        return run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir())

    def failed_start(self, run_dir: Path) -> list[str] | None:
        """The entries of ``run_dir`` when it holds only what a start writes before its first checkpoint and
        the temporary files of those writes (a start killed outright, which runs no cleanup): nothing anyone
        could resume or evaluate, so the same command starts the run again. None when it holds anything
        else (a checkpoint, results, a file the run did not write) or does not exist."""
        names = [*self.start_files, *self.own_outputs(run_dir)]
        return only_entries(run_dir, names, temps_of=self.start_temps)

    def exists_error(self, run_dir: Path) -> RunExistsError:
        """The refusal of a new run in ``run_dir``, which holds more than a killed start left: how to
        continue it (``--resume``) or, without a checkpoint, that there is nothing to resume."""
        words = self.refusals
        if (run_dir / LAST_CHECKPOINT).is_file():
            template = words.resumable
        elif words.evaluable and (run_dir / BEST_CHECKPOINT).is_file():
            template = words.evaluable
        elif (run_dir / CONFIG_FILE).is_file():
            template = words.stopped
        else:
            template = words.foreign
        return RunExistsError(template.format(run_dir=run_dir, resume=self.resume_command(run_dir)))

    def refuse_existing(self, run_dir: Path, *, probe_lock: bool = True) -> None:
        """Before a new run does any work: refuse ``run_dir`` when it is a file, or holds more than a start
        killed before its first checkpoint left (:meth:`claim_new` checks again, under the lock). A run
        that another process trains now is refused as in use, not with the advice to ``--resume`` it,
        which the lock would refuse. ``probe_lock``: take the lock for a moment to see (False where another
        process of the same launch may be probing it at the same moment).

        Raises:
            RunExistsError: why, and what to do.
        """
        if run_dir.exists() and not run_dir.is_dir():
            raise RunExistsError(self.refusals.is_file.format(run_dir=run_dir))
        if not self.holds_files(run_dir) or self.failed_start(run_dir) is not None:
            return
        if probe_lock and (run_dir / LOCK_FILE).is_file():
            with self.lock(run_dir):
                pass
        raise self.exists_error(run_dir)

    def claim_new(self, run_dir: Path, locks: contextlib.ExitStack, claim: Claim) -> None:
        """Create ``run_dir`` and lock it (held until ``locks`` closes), or take the empty directory a user
        made, under the lock; race-free against another start of the same name. Removes what a start killed
        before its first checkpoint left there. ``claim`` records what a failed start may remove.

        Raises:
            RunExistsError: another process holds the run, or it holds more than a killed start left.
        """
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()  # the atomic claim: of two starts of one name, one creates the directory
            created = True
        except FileExistsError:
            created = False
        locks.enter_context(self.lock(run_dir))
        if not created:  # looked at under the lock: nobody writes it now
            left = self.failed_start(run_dir)
            if left is None:
                raise self.exists_error(run_dir)
            left = [name for name in left if name != LOCK_FILE]
            if left:
                self._remove_entries(run_dir, left)
                self._log().warning(
                    "%s: a start killed before its first checkpoint left %s: removed, starting the run again",
                    run_dir,
                    ", ".join(left),
                )
        claim.created, claim.owned = created, True

    def lock_for_resume(self, run_dir: Path, locks: contextlib.ExitStack) -> None:
        """Lock the run for a resume (held until ``locks`` closes); then, nobody else writing it, delete the
        temporary files of writes a kill cut short (a ``.last.pt.XXXX.tmp`` is as large as the checkpoint).

        Raises:
            RunExistsError: another process holds the run.
        """
        locks.enter_context(self.lock(run_dir))
        folders: dict[Path, list[str]] = {}
        for path in map(Path, self.atomic_files):
            folders.setdefault(path.parent, []).append(path.name)
        for folder, names in folders.items():
            remove_stale_temps(run_dir / folder, names)

    def remove_failed_start(self, run_dir: Path, created: bool) -> None:
        """A start that failed before the first checkpoint leaves nothing behind (the same command can simply
        be run again; a half-made directory would be refused): the directory it ``created``, else (an empty
        directory a user made) only what the run wrote."""
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            self._remove_entries(run_dir, self.failed_start(run_dir) or self.start_files)
        self._log().info("start failed before the first checkpoint: %s removed", run_dir)

    @staticmethod
    def _remove_entries(run_dir: Path, names: Sequence[str]) -> None:
        for name in names:
            path = run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif name != LOCK_FILE:  # the lock stays: another start may hold an open handle on it
                path.unlink(missing_ok=True)
