"""What a hashing run's ``last.pt`` and ``import.json`` say before a command goes on with the run: the
checkpoint an evaluation reports (:func:`checkpoint_record`), whether a resume has anything to continue
(:func:`refuse_nothing_to_resume`) and any epochs to train (:func:`refuse_fewer_epochs`), and whether an
imported checkpoint has data to be evaluated on (:func:`refuse_imported_without_data`). Each refusal is
one line naming the key or the file and how to go on, said before anything is written."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError, MissingFileError
from patchword.hashing.config import HashDataConfig
from patchword.runs.files import CONFIG_FILE, IMPORT_FILE, LAST_CHECKPOINT

__all__ = [
    "IMPORTED_DATA_HINT",
    "checkpoint_record",
    "imported_untrained",
    "refuse_fewer_epochs",
    "refuse_imported_without_data",
    "refuse_nothing_to_resume",
]

#: The data overrides that give an imported checkpoint without data of its own its features (said by
#: ``patchword import`` and by the refusals of :func:`refuse_imported_without_data`).
IMPORTED_DATA_HINT = (
    "data.format=splits data.root=DIR (the official train / query / retrieval files), or "
    "data.format=pairs data.image=IMG.npy data.text=TXT.npy [data.labels=LAB.npy]"
)


def imported_untrained(run_dir: Path, step: int) -> bool:
    """Whether ``run_dir`` holds an imported checkpoint (``import.json``) not trained on since (its last.pt
    at ``step`` 0): its data are only those the import was given."""
    return step == 0 and (run_dir / IMPORT_FILE).is_file()


def refuse_nothing_to_resume(run_dir: Path) -> None:
    """``hash train --resume RUN`` of a run without a last.pt: no such run, a directory that is not a run,
    or a start killed before its first checkpoint (worded as ``patchword train`` words it).

    Raises:
        MissingFileError: saying which, and how to go on.
    """
    if (run_dir / LAST_CHECKPOINT).is_file():
        return
    if not run_dir.is_dir():
        raise MissingFileError(f"{run_dir} has no last.pt to resume: no such run directory")
    if not (run_dir / CONFIG_FILE).is_file():
        raise MissingFileError(
            f"{run_dir} is not a hashing run directory (no {CONFIG_FILE}): nothing to resume"
        )
    raise MissingFileError(
        f"{run_dir} has no last.pt to resume from (it stopped before its first checkpoint: killed before "
        "train.save_every epochs, or the end, wrote one): nothing to continue; run the command that started "
        "it again, without --resume (it starts the run anew)"
    )


def refuse_fewer_epochs(epochs: int, state: dict[str, Any], run_dir: Path) -> None:
    """A resume to ``epochs`` (``train.epochs``) of a run whose last.pt ``state`` trained past it would
    train nothing and evaluate again: refused before anything is written. As many epochs as trained (a
    finished run evaluated again, e.g. with other ``eval.*``) are a resume.

    Raises:
        ConfigError: naming train.epochs and the epochs trained.
    """
    done, batches = int(state["epoch"]), int(state.get("batch_in_epoch", 0))
    if epochs > done or (epochs == done and not batches):
        return
    trained = f"{done} epoch(s)" + (f" and {batches} batch(es) of epoch {done + 1}" if batches else "")
    raise ConfigError(
        "train.epochs",
        f"{epochs} but {run_dir} already trained {trained} ({LAST_CHECKPOINT}): a resume trains up to "
        f"train.epochs, so nothing would be trained; give train.epochs={done + 1} or more to train on, or "
        f"evaluate the run with `patchword hash eval {run_dir}`",
    )


def refuse_imported_without_data(
    run_dir: Path, saved: HashDataConfig, given: Collection[str], *, resuming: bool = False
) -> None:
    """An imported checkpoint not trained on since has no data of its own: its config.yaml's data section
    is synthetic features at the checkpoint's widths (``patchword import`` without data overrides), which
    only a ``data.format`` given on the command line evaluates (``data.format=synthetic`` on purpose). A
    resume (``resuming``) takes no data keys: it would fine-tune on the stand-in, so it is refused.

    Raises:
        ConfigError: naming data.format and the keys that say where the data are.
    """
    if saved.format != "synthetic" or "data.format" in given:
        return
    if resuming:
        how = (
            f"a resume would train it on them: import it again with its data ({IMPORTED_DATA_HINT} after "
            "--out)"
        )
    else:
        how = f"set {IMPORTED_DATA_HINT} (data.format=synthetic evaluates the stand-in on purpose)"
    raise ConfigError(
        "data.format",
        f"{run_dir} is an imported checkpoint without data of its own (its {CONFIG_FILE} has synthetic "
        f"stand-in features): {how}",
    )


def checkpoint_record(
    run_dir: Path, epoch: int, batch_in_epoch: int, step: int, epochs: int
) -> dict[str, Any]:
    """What an evaluation says about the weights it evaluated (``last.pt`` of ``run_dir``): its epoch and
    step, and whether the run had finished (reached the ``epochs`` it was trained to) or stopped on the
    way; an imported checkpoint not trained on since says so."""
    record: dict[str, Any] = {
        "file": LAST_CHECKPOINT,
        "epoch": epoch,
        "step": step,
        "finished": epoch >= epochs and batch_in_epoch == 0,
    }
    if imported_untrained(run_dir, step):
        record["imported"] = True
    return record
