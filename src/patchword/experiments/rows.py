"""What marks a row of ``patchword report`` as not like the others (INCOMPLETE, NOT EVALUATED, SEEDS DIFFER,
a scored split that is not a held-out test split, LEAKY), what the tables' captions say of each, and how a
figure is written to significant digits. Functions take the report's rows
(``patchword.experiments.entries.Entry``) without importing them.
"""

from __future__ import annotations

import math

from patchword.imports.published import SELECTION_SPLIT, TRAINING_SPLIT

__all__ = [
    "evaluated",
    "is_incomplete",
    "is_leaky",
    "row_label",
    "shared_flags",
    "significant",
    "split_use",
]


def is_incomplete(entry) -> bool:
    """Seeds the row's sweep set out to run are not all finished: its figures are never shown as whole."""
    return len(entry.runs) < entry.planned


def split_use(entry) -> str | None:
    """What the row's scored split is besides a test set (``model selection``, ``training``: see
    :func:`patchword.imports.published.split_use`), for its first evaluated run; None for a held-out one."""
    return next((use for use, summary in zip(entry.uses, entry.summaries, strict=True) if summary), None)


def evaluated(entry) -> bool:
    """Whether the row has runs and each has an evaluation recorded (not one still training or killed
    before its test evaluation)."""
    return bool(entry.runs) and all(entry.summaries)


def is_leaky(entry) -> bool:
    """Whether a run of the row was scored with the caption-tied (leaky) dense protocol."""
    return any(summary.get("leaky") is True for summary in entry.summaries)


def row_label(entry) -> str:
    """The row's label with what makes its figures not like the others': INCOMPLETE (a sweep variant with
    seeds still to run), NOT EVALUATED (a run without an evaluation), SEEDS DIFFER (a sweep row whose seeds
    ran with different config values), MODEL SELECTION SPLIT / TRAINING SPLIT (not scored on a held-out
    test split) and LEAKY (the caption-tied dense protocol)."""
    marks = []
    if is_incomplete(entry):
        marks.append(f"INCOMPLETE, {len(entry.runs)} of {entry.planned} seeds")
    if entry.runs and not evaluated(entry):
        marks.append("NOT EVALUATED")
    if entry.seeds_differ:
        marks.append("SEEDS DIFFER")
    if split_use(entry):
        marks.append(f"{split_use(entry).upper()} SPLIT")
    if is_leaky(entry):
        marks.append("LEAKY")
    return entry.label + (f" ({'; '.join(marks)})" if marks else "")


def _decimals(value: float, digits: int) -> int:
    """Decimals that show ``value`` to ``digits`` significant digits (none for a whole part that has them)."""
    if not math.isfinite(value) or value == 0:
        return 0
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def significant(value: tuple[float, float] | float | None, n: int = 1, digits: int = 3) -> str:
    """A figure to ``digits`` significant digits in fixed notation (``0.000412``, ``25.8``, ``13580``),
    where a fixed number of decimals would show a short time or a small model as 0; a (mean, std) pair
    over ``n`` > 1 runs: both at the mean's decimals."""
    if value is None:
        return ""
    mean, std = value if isinstance(value, tuple) else (value, 0.0)
    places = _decimals(mean, digits)
    return f"{mean:.{places}f} ± {std:.{places}f}" if n > 1 else f"{mean:.{places}f}"


def shared_flags(entries) -> str:
    """The marks the test table and the cost table share: NOT EVALUATED, SEEDS DIFFER, a scored split that
    is not a held-out test split."""
    flags = ""
    if any(e.runs and not evaluated(e) for e in entries):
        flags += (
            "; NOT EVALUATED: a run with no evaluation recorded (still training, or stopped before its "
            "test evaluation): no figures, no protocol"
        )
    if any(e.seeds_differ for e in entries):
        flags += (
            "; SEEDS DIFFER: a sweep row whose seeds ran with different config values (a seed resumed with "
            "other limits...; the config table lists them): its mean ± std is not over seeds of one recipe"
        )
    uses = {split_use(e) for e in entries} - {None}
    if SELECTION_SPLIT in uses:
        flags += (
            "; MODEL SELECTION SPLIT: scored on the split the run chose its checkpoint on (eval.split=dev, "
            "or data.test_split naming data.dev_split): a validation figure, not a held-out test result"
        )
    if TRAINING_SPLIT in uses:
        flags += (
            "; TRAINING SPLIT: scored on the split the run trained on (data.test_split): not a test result"
        )
    return flags
