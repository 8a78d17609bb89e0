"""What a sweep finds in its members' run directories: the checks of every member an earlier invocation left,
before the sweep's first run (:func:`check_existing_member`), and a member's suite figures, its suite file
reused only when it provably measured what the sweep would (:func:`suite_figures`). See
:mod:`patchword.experiments.sweep`.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any

from patchword.errors import ConfigError
from patchword.readers import read_json
from patchword.runs.files import CONFIG_FILE, LAST_CHECKPOINT, SUMMARY_FILE

__all__ = ["check_existing_member", "refuse_other_settings", "suite_figures"]

_logger = logging.getLogger(__name__)


def check_existing_member(config: str | None, overrides: list[str], run_dir: Path, suites: list[str]) -> None:
    """What an earlier sweep left in ``run_dir`` is readable and made with the settings asked for now: checked
    for every member before the first run, so that a bad one stops the sweep before ``sweep.json`` is
    rewritten (the seeds before it would otherwise replace a complete record)."""
    from patchword.runs.config import load_run_config
    from patchword.train.runner import TRAIN_RUNS

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError("--name", f"{run_dir} is a file where the sweep keeps a run: move it away")
    unfinished = not (run_dir / SUMMARY_FILE).is_file() and not (run_dir / LAST_CHECKPOINT).is_file()
    # a start killed before its first checkpoint is started again (train_run removes what it left); the
    # files of anything else stay where they are
    if unfinished and TRAIN_RUNS.holds_files(run_dir) and TRAIN_RUNS.failed_start(run_dir) is None:
        raise ConfigError(
            "--name",
            f"{run_dir} holds files a run of the sweep did not leave: move them away or give the sweep "
            "another --name",
        )
    if (run_dir / CONFIG_FILE).is_file():
        refuse_other_settings(run_dir, load_run_config(config, overrides))
    if not (run_dir / SUMMARY_FILE).is_file() and (run_dir / LAST_CHECKPOINT).is_file():
        from patchword.checkpoint import load_checkpoint

        # the checkpoint the resume reads, read once now: damaged, it stops the sweep before the seeds
        # before it rewrite sweep.json (the resume reads it again: a second read of one file per member)
        load_checkpoint(run_dir / LAST_CHECKPOINT)
    if (run_dir / SUMMARY_FILE).is_file():
        read_json(run_dir / SUMMARY_FILE, "run summary")
        for suite in suites:
            if (run_dir / f"eval_{suite}.json").is_file():
                read_json(run_dir / f"eval_{suite}.json", "suite evaluation")


def refuse_other_settings(run_dir: Path, wanted) -> None:
    """A run directory left by an earlier sweep is kept or resumed only if every session of it trained with
    the settings asked for now: its ``config.yaml`` and, for each ``--resume`` recorded in ``resumes.jsonl``,
    ``config.yaml`` with that resume's overrides (what the resumed session ran with). A changed override
    under the same sweep name, or a seed resumed by hand with another ``train.max_steps``, would otherwise
    mix two recipes in one mean.

    Raises:
        ConfigError: naming ``--name``, the run (``.../seed-<s>``), the session and the keys that differ.
        DataError: a damaged ``resumes.jsonl``, naming it.
    """
    from patchword.config import flat_config
    from patchword.runs import RESUMES_FILE, read_run_config, resume_overrides
    from patchword.runs.config import resolve_new_run

    # both as a new run records them (paths absolute, the BERT vocabulary and augmentation resolved): a run
    # made before config.yaml recorded them so matches the sweep run again from where it was made
    wanted = copy.deepcopy(wanted)  # the caller's stays as it is
    resolve_new_run(wanted)
    asked = flat_config(wanted)
    sessions = [("was made with other settings (", [])]
    resumes = resume_overrides(run_dir)
    for i, overrides in enumerate(resumes, start=1):
        where = f"was resumed with other settings (resume {i} of {len(resumes)} in {RESUMES_FILE}: "
        sessions.append((where, overrides))
    for what, overrides in sessions:
        saved = read_run_config(run_dir, overrides)
        resolve_new_run(saved)
        saved = flat_config(saved)
        changed = sorted(k for k in saved.keys() | asked.keys() if saved.get(k) != asked.get(k))
        if changed:
            shown = ", ".join(f"{k} {saved.get(k)!r} -> {asked.get(k)!r}" for k in changed[:3])
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            raise ConfigError("--name", f"{run_dir} {what}{shown}{more}): give the sweep another --name")


def suite_figures(run_dir: Path, suite: str) -> dict[str, float]:
    """A suite's accuracies for one run: the ``eval_*.json`` record that provably measured what the sweep
    measures (:func:`~patchword.runs.recorded.suite_evaluation_of`: the synthetic suite of the bytes of the
    run's best checkpoint, with its present ``config.yaml``, no overrides but neutral ones), else the suite
    evaluated again. An ``eval_<suite>.json`` that is not such a record is first set aside as
    ``eval_<suite>.previous.json``: it may be a user's evaluation of another checkpoint or other data."""
    from patchword.runs import resolve_checkpoint
    from patchword.runs.recorded import IDENTITY_FIELDS, suite_evaluation_of
    from patchword.runs.suites import evaluate_patch_suite, evaluate_suite

    result, _ = suite_evaluation_of(run_dir, resolve_checkpoint(run_dir), suite, suite_files=[])
    if not result:
        path = run_dir / f"eval_{suite}.json"
        if path.is_file():
            aside = path.with_suffix(".previous.json")
            _logger.warning(
                "%s does not provably describe the run's best checkpoint with its config and the synthetic "
                "suite: set aside as %s, the suite is evaluated again",
                path,
                aside.name,
            )
            os.replace(path, aside)
        result, _ = (evaluate_suite if suite == "compositional" else evaluate_patch_suite)(run_dir)
    return {
        f"{suite}.{k}": float(v)
        for k, v in _flat({k: v for k, v in result.items() if k not in IDENTITY_FIELDS}).items()
        if isinstance(v, (int, float))
        and not k.startswith("n.")
        and not k.endswith("seconds")  # counts, times
    }


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        elif not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out
