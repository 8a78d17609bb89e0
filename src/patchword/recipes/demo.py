"""``patchword demo``: the paper's setting in miniature, on a CPU, in a fixed number of steps.

SEPS fine-tunes pretrained backbones. The demo starts from the tiny encoders shipped in
``patchword/pretrained/synthetic-64`` (pretrained contrastively on the synthetic train split by
``patchword pretrain``), fine-tunes the paper-variant SEPS with leak-free (image-tied) dense text for a fixed
number of steps in float32, so the same seed gives the same numbers on any CPU up to float rounding, and
reports test recall next to the pretrained encoders alone and the split's oracle bound, plus how well patch
selection finds the objects.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ResumeHint, resume_command
from patchword.recipes.pretrain import KEYS
from patchword.runs.config import RunConfig, load_run_config
from patchword.runs.files import SUMMARY_FILE

__all__ = ["DEMO_RECIPE", "demo_config", "run_demo", "format_table"]

_logger = logging.getLogger(__name__)

#: The demo's recipe: ``patchword/configs/demo.yaml`` (what it sets, and why, is written there).
DEMO_RECIPE = "demo"


def demo_config(overrides: list[str] | None = None) -> RunConfig:
    """The demo run: defaults + the demo recipe + the user's overrides."""
    return load_run_config(DEMO_RECIPE, overrides)


def format_table(summary: dict[str, Any]) -> str:
    """Recall of the pretrained encoders alone, of the fine-tuned SEPS, and the oracle bound."""
    head = "| model | " + " | ".join(KEYS) + " |"
    rule = "|" + "---|" * (len(KEYS) + 1)
    lines = [head, rule]
    baseline = summary.get("pretrained_global")
    if baseline:
        cells = " | ".join(f"{baseline[k]:.1f}" for k in KEYS)
        lines.append(f"| pretrained encoders alone (global cosine, before fine-tuning) | {cells} |")
    native = summary.get("pretrained_native")
    if native:
        cells = " | ".join(f"{native[k]:.1f}" for k in KEYS)
        lines.append(
            f"| pretrained encoders alone ({native['matcher']}, the score they were pretrained with) "
            f"| {cells} |"
        )
    cells = " | ".join(f"{summary[k]:.1f}" for k in KEYS)
    lines.append(f"| SEPS (paper variant, leak-free dense text), fine-tuned | {cells} |")
    if "oracle_rsum" in summary:
        lines.append(
            "| oracle (every fitting image first) | " + " | " * 6 + f"{summary['oracle_rsum']:.1f} |"
        )
    recall, chance = summary.get("selection_object_recall"), summary.get("selection_chance")
    if recall:
        parts = [f"{b}: {recall[b]:.1f}% of object patches kept (chance {chance[b]:.1f}%)" for b in recall]
        lines.append("\npatch selection on the test images, " + "; ".join(parts))
    return "\n".join(lines)


def _check_demo(cfg: RunConfig) -> None:
    """Everything the demo can check before it moves a previous demo aside or prepares its scenes: the
    config (what ``train_run`` checks again, cheaply) and an ``output_dir`` that can hold the run."""
    from patchword.fileio import check_output_dir
    from patchword.train.validate import check_config

    check_config(cfg)
    check_output_dir(cfg.output_dir, "output_dir", what="the directory the demo's run goes in")


def _made_by_demo(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` is an earlier demo's run: its ``summary.json`` holds what only the demo adds
    (``pretrained_global``), or (a demo stopped before it wrote that) its ``config.yaml`` is this demo's
    config, up to keys that say nothing of the run (:data:`~patchword.runs.recorded.NEUTRAL_OVERRIDES`).
    A run this test cannot read is not one."""
    from patchword.config import config_diff
    from patchword.errors import PatchwordError
    from patchword.readers import read_json
    from patchword.runs.config import resolve_run_paths
    from patchword.runs.files import CONFIG_FILE
    from patchword.runs.load import read_run_config
    from patchword.runs.recorded import NEUTRAL_OVERRIDES

    summary, config = run_dir / SUMMARY_FILE, run_dir / CONFIG_FILE
    try:
        if summary.is_file() and "pretrained_global" in read_json(summary, "run summary"):
            return True
        if config.is_file():
            saved = resolve_run_paths(read_run_config(run_dir))  # an older run's relative paths, as cfg's
            return not [k for k in config_diff(saved, cfg) if k not in NEUTRAL_OVERRIDES]
    except PatchwordError:  # damaged records: nothing says it is a demo's
        pass
    return False


def _set_aside_previous(run_dir: Path, cfg: RunConfig) -> None:
    """Move an earlier demo's run in ``run_dir`` aside (:func:`_set_aside`), under the run's lock: a run
    another process trains now is refused, as ``patchword train`` refuses it, and so is a directory the
    demo did not make (an ordinary run, anything else: nothing but a demo's run is moved). A directory
    holding nothing, or only what a start killed before its first checkpoint left, is left to the run's
    start, which takes it (a file in its place too: the start refuses it).

    Raises:
        RunExistsError: the run is in use, or ``run_dir`` is not a demo's.
    """
    from patchword.errors import RunExistsError
    from patchword.runs.claim import LOCK_FILE
    from patchword.train.runner import TRAIN_RUNS

    if not TRAIN_RUNS.holds_files(run_dir) or TRAIN_RUNS.failed_start(run_dir) is not None:
        return
    foreign = RunExistsError(
        f"{run_dir} is not an earlier demo's run (the demo moves aside only its own): choose another name= "
        f"for the demo, or move {run_dir} yourself"
    )
    # refused before the lock is taken where there is no lock file yet: taking it would write one there
    if not (run_dir / LOCK_FILE).is_file() and not _made_by_demo(run_dir, cfg):
        raise foreign
    with TRAIN_RUNS.lock(run_dir):
        if not _made_by_demo(run_dir, cfg):
            raise foreign
        _set_aside(run_dir)


def _set_aside(run_dir: Path) -> None:
    # Never overwrite a previous demo silently: keep it under a timestamped name and say so.
    if not run_dir.exists():
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir.with_name(f"{run_dir.name}-{stamp}"), 1
    while target.exists():  # a second demo within the same second: moving into it would nest the run
        n += 1
        target = run_dir.with_name(f"{run_dir.name}-{stamp}-{n}")
    shutil.move(str(run_dir), target)
    _logger.warning("previous %s moved to %s", run_dir, target)


@contextlib.contextmanager
def _flush_denormals() -> Iterator[None]:
    """Denormal floats slow CPU training ~2x after a few hundred steps; flush them during the demo only
    (a process-wide setting torch cannot read back: reset to its default, off, afterwards)."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def run_demo(overrides: list[str] | None = None, *, plots: bool = True) -> dict[str, Any]:
    """Fine-tune, evaluate on the 1000-image test split, print the table, write plots."""
    from patchword.data.prepare import prepare_data
    from patchword.fileio import atomic_write_text
    from patchword.recipes.pretrain import global_recall, pretraining_recall
    from patchword.train.runner import train_run

    cfg = demo_config(overrides)
    run_dir = Path(cfg.output_dir) / cfg.name
    _check_demo(cfg)  # before a previous demo is moved or 12,000 scenes are prepared
    _set_aside_previous(run_dir, cfg)
    with _flush_denormals():
        data = prepare_data(cfg.data)
        summary = train_run(cfg, data=data, hint=_demo_hint(run_dir))
        summary["pretrained_global"] = global_recall(cfg, data)
        native = pretraining_recall(cfg, data)
        if native:
            summary["pretrained_native"] = native
        atomic_write_text(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2))
        print(format_table(summary))
        print(f"\nrun directory: {run_dir}  (summary.json, metrics.jsonl, config.yaml, checkpoints)")
        if plots:
            _plots(run_dir, data)
    return summary


def _demo_hint(run_dir: Path) -> ResumeHint:
    """How a stopped demo says to go on (:class:`~patchword.errors.ResumeHint`): ``patchword train
    --resume`` finishes its training and evaluation but not the demo's table and plots, and a new demo
    moves the stopped run aside; the runner's own advice named the first alone, as if it finished the demo."""
    how = resume_command("patchword train", run_dir)
    advice = (
        f"continue its training with {how} (the demo's table and plots are not made then), or run the "
        f"same `patchword demo` command again to start over ({run_dir} is moved aside)"
    )
    return ResumeHint(how, advice)


def _plots(run_dir: Path, data) -> None:
    try:
        from patchword.experiments.plots import plot_retrievals, plot_training_curve
    except ImportError as err:  # matplotlib is optional
        _logger.warning("plots skipped: %s", err)
        return
    from patchword.runs import load_run

    plot_training_curve(
        run_dir / "metrics.jsonl", run_dir / "training_curve.png", "patchword demo: SEPS (paper)"
    )
    run = load_run(run_dir)
    plot_retrievals(run, data.splits["test"], data.raw["test"].images, run_dir / "retrievals.png")
    print(f"plots: {run_dir / 'training_curve.png'}, {run_dir / 'retrievals.png'}")
