"""A hashing run directory while a command trains it: the :class:`~patchword.runs.claim.RunKind` of
``patchword hash train``, which follows the rules of every training command's run directories (claimed by
one new run, locked against a second command, removed again when the start fails before its first
checkpoint, cleared of what a killed start or write left: :mod:`patchword.runs.claim`).
"""

from __future__ import annotations

from patchword.runs.claim import LOCK_FILE, Refusals, RunKind
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, METRICS_FILE, RESUMES_FILE, WEIGHTS_FILE

__all__ = ["HASH_RUNS"]

#: Start files: what a start writes before its first ``last.pt`` (metrics.jsonl: the records of epochs
#: nobody can resume); start temps: the files it writes atomically by then. Atomic files: every file a run
#: writes atomically, the export (model.safetensors, config.json) in the run directory itself.
HASH_RUNS = RunKind(
    command="patchword hash train",
    start_files=(LOCK_FILE, CONFIG_FILE, METRICS_FILE),
    start_temps=(CONFIG_FILE, LAST_CHECKPOINT),
    atomic_files=(
        CONFIG_FILE,
        LAST_CHECKPOINT,
        METRICS_FILE,
        RESUMES_FILE,
        "eval.json",
        WEIGHTS_FILE,
        "config.json",
    ),
    refusals=Refusals(
        resumable="{run_dir} already holds a run; continue it with {resume} or choose another --name",
        stopped=(
            f"{{run_dir}} already holds a run that stopped before its first checkpoint ({CONFIG_FILE}, no "
            f"{LAST_CHECKPOINT}) with files a start does not write: nothing to --resume; remove it or choose "
            "another --name"
        ),
        foreign=(
            "{run_dir} already holds files of something else: nothing to --resume; remove it or choose "
            "another --name"
        ),
        is_file="{run_dir} is a file: choose another --name or --output-dir",
    ),
    logger=__name__,
)
