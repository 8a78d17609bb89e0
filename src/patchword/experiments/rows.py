"""What marks a row of ``patchword report`` as not like the others (INCOMPLETE, NOT EVALUATED, SEEDS DIFFER,
a scored split that is not a held-out test split, runs scored on different galleries, LEAKY, a two-stage
search's recalls), what the tables' captions say of each, and how a figure is written to significant
digits. Functions take the
report's rows (``patchword.experiments.entries.Entry``) without importing them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

from patchword.eval.metrics import RECALL_KEYS
from patchword.eval.two_stage import TWO_STAGE_RECALLS, two_stage_of
from patchword.imports.published import SELECTION_SPLIT, TRAINING_SPLIT

__all__ = [
    "evaluated",
    "galleries_of",
    "has_recalls",
    "is_incomplete",
    "is_leaky",
    "mixed",
    "mixed_galleries",
    "not_evaluated_cell",
    "not_evaluated_mark",
    "one_or_mixed",
    "protocol_cell",
    "row_label",
    "run_counts",
    "shared_flags",
    "significant",
    "split_use",
    "split_use_cell",
    "split_uses",
    "TWO_STAGE_KEYS",
    "TWO_STAGE_NOTE",
    "unused_files",
]

#: A two-stage (shortlist) search's figures in its record (:func:`patchword.eval.protocol` records them):
#: the candidates kept per image and per caption query, the weight of the global score in the re-ranking
#: score, and the % of queries whose ground truth the shortlist missed.
TWO_STAGE_KEYS = (
    "shortlist_i2t",
    "shortlist_t2i",
    "hybrid_alpha",
    "shortlist_miss_i2t",
    "shortlist_miss_t2i",
)

#: What a table showing a two-stage row says under it.
TWO_STAGE_NOTE = (
    f"TWO-STAGE: {TWO_STAGE_RECALLS}, and rank N+1 in the record's medr / meanr (N: the captions an image "
    "query ranks, the images a caption query ranks); the CSV's shortlist_miss columns give the % of queries "
    "it missed"
)


def is_incomplete(entry) -> bool:
    """Seeds the row's sweep set out to run are not all finished: its figures are never shown as whole."""
    return len(entry.runs) < entry.planned


def has_recalls(record) -> bool:
    """Whether a run's record is an evaluation: it holds a recall figure (a record of something else, such
    as an export's ``metrics.json`` with its figures nested, is none)."""
    return any(
        isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)
        for key in RECALL_KEYS
    )


def split_uses(entry) -> list[str]:
    """What the scored splits of the row's evaluated runs are besides a test set (``model selection``,
    ``training``: see :func:`patchword.imports.published.split_use`), each once, in the runs' order; empty
    where every one scored a held-out split."""
    pairs = zip(entry.uses, entry.summaries, strict=True)
    return list(dict.fromkeys(use for use, summary in pairs if use and has_recalls(summary)))


def split_use(entry) -> str | None:
    """The first of :func:`split_uses` (a row of which any run scored a split that is not a held-out test
    split is marked as such); None where every evaluated run scored a held-out one."""
    return next(iter(split_uses(entry)), None)


def split_use_cell(entry) -> str:
    """What the scored splits of the row's evaluated runs are besides a test set, for the CSV: the one use
    (``model selection``; ``""`` for a held-out split) where every run's is the same, else one entry per
    run, in the runs' order, ``;``-separated, ``held-out`` for a held-out split (``held-out; held-out;
    model selection``: a seed evaluated again on its dev split)."""
    pairs = zip(entry.uses, entry.summaries, strict=True)
    per_run = [use or "held-out" for use, summary in pairs if has_recalls(summary)]
    if len(set(per_run)) <= 1:
        return "" if not per_run or per_run[0] == "held-out" else per_run[0]
    return "; ".join(per_run)


def evaluated(entry) -> bool:
    """Whether the row has runs and each has an evaluation recorded (its recall figures; not one still
    training or killed before its test evaluation)."""
    return bool(entry.runs) and all(has_recalls(s) for s in entry.summaries)


def _unused(entry) -> Iterator[tuple[str, str]]:
    """(shown name, why) of each ``eval_*.json`` of the row's runs that no evaluation shown came from
    (``entry.unused``): ``eval_test.json``, or ``seed-1/eval_test.json`` in a row of several runs."""
    for run, found in zip(entry.runs, getattr(entry, "unused", [[]] * len(entry.runs)), strict=True):
        for name, why in found:
            yield (name if len(entry.runs) == 1 else f"{run.name}/{name}"), why


def unused_files(entry) -> list[str]:
    """The ``eval_*.json`` files of the row's runs that no evaluation shown came from (they do not describe
    the run's checkpoint as configured: ``entry.unused``), each once: ``eval_test.json``, or
    ``seed-1/eval_test.json`` in a row of several runs."""
    return list(dict.fromkeys(name for name, _ in _unused(entry)))


def not_evaluated_mark(entry) -> str:
    """``NOT EVALUATED``, and the evaluation files not used where the runs have some (``NOT EVALUATED:
    eval_test.json not used``)."""
    files = unused_files(entry)
    return "NOT EVALUATED" + (f": {', '.join(files)} not used" if files else "")


def not_evaluated_cell(entry) -> str:
    """What the row's split column says of a row not evaluated: ``not evaluated``, then why each evaluation
    file is not used (``eval_test.json: made with overrides that change what it measures
    (data.max_caption_len=20)``)."""
    whys = [f"{name}: {why}" for name, why in _unused(entry)]
    return "not evaluated" + (f" ({'; '.join(whys)})" if whys else "")


def mixed(counts: dict[str, int], unit: str = "run") -> str:
    """``MIXED:`` and each value with how many of the row's runs (or ``unit``) had it, sorted: what a row
    whose runs differ shows in place of one value."""
    return "MIXED: " + "; ".join(
        f"{v} ({n} {unit}{'' if n == 1 else 's'})" for v, n in sorted(counts.items())
    )


def one_or_mixed_of(counts: dict[str, int], default: Any, unit: str = "run") -> Any:
    """The one value of ``counts`` (``default`` for none), or :func:`mixed` of them where they differ."""
    return next(iter(counts), default) if len(counts) <= 1 else mixed(counts, unit)


def run_counts(entry, attribute: str) -> dict[str, int]:
    """The values of the row's evaluated runs' ``attribute`` (``galleries``, ``scored``, ``datasets``),
    each with how many runs have it, in the runs' order."""
    values = getattr(entry, attribute)
    return Counter(str(v) for v, s in zip(values, entry.summaries, strict=True) if v and has_recalls(s))


def one_or_mixed(entry, attribute: str) -> str:
    """The one value of :func:`run_counts` (``""`` for none), or :func:`mixed` of them where runs differ."""
    return one_or_mixed_of(run_counts(entry, attribute), "")


def galleries_of(entry) -> dict[str, int]:
    """The test galleries the row's evaluated runs scored (``entry.galleries``), each with its run count."""
    return run_counts(entry, "galleries")


def mixed_galleries(entry) -> bool:
    """Whether the row's runs scored different galleries (a seed evaluated again with ``eval.split=dev``):
    its mean is over no one test set, and it is ranked against no other row."""
    return len(galleries_of(entry)) > 1


def protocol_cell(entry, leaky: str = "LEAKY") -> str:
    """The row's protocol: ``leaky`` (the table's mark; the CSV's ``leaky``) or ``leak-free``, then a
    two-stage search's shortlists (``leak-free, two-stage (shortlist 40/8, α 1.0)``; ``MIXED:`` and each
    with its run count where the row's evaluated runs searched differently)."""
    searches = Counter(
        two_stage_of(record) or "exhaustive" for record in entry.summaries if has_recalls(record)
    )
    search = one_or_mixed_of(searches, "exhaustive")
    return (leaky if is_leaky(entry) else "leak-free") + ("" if search == "exhaustive" else f", {search}")


def is_leaky(entry) -> bool:
    """Whether a run of the row was scored with the caption-tied (leaky) dense protocol."""
    return any(summary.get("leaky") is True for summary in entry.summaries)


def row_label(entry) -> str:
    """The row's label with what makes its figures not like the others': INCOMPLETE (a sweep variant with
    seeds still to run), NOT EVALUATED (a run without an evaluation; ``NOT EVALUATED: eval_test.json not
    used`` where its evaluation files describe something else), SEEDS DIFFER (a sweep row whose seeds
    ran with different config values), MODEL SELECTION SPLIT / TRAINING SPLIT (a run not scored on a
    held-out test split), MIXED GALLERIES (runs scored on different galleries) and LEAKY (the caption-tied
    dense protocol)."""
    marks = []
    if is_incomplete(entry):
        marks.append(f"INCOMPLETE, {len(entry.runs)} of {entry.planned} seeds")
    if entry.runs and not evaluated(entry):
        marks.append(not_evaluated_mark(entry))
    if entry.seeds_differ:
        marks.append("SEEDS DIFFER")
    marks += [f"{use.upper()} SPLIT" for use in split_uses(entry)]
    if mixed_galleries(entry):
        marks.append("MIXED GALLERIES")
    if is_leaky(entry):
        marks.append("LEAKY")
    return entry.label + (f" ({'; '.join(marks)})" if marks else "")


def _decimals(value: float, digits: int) -> int:
    """Decimals that show ``value`` to ``digits`` significant digits (none for a whole part that has them)."""
    if not math.isfinite(value) or value == 0:
        return 0
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def mean_cell(value: tuple[float, float] | None, n: int) -> str:
    """A percentage ``(mean, std)`` of a row's ``n`` runs to one decimal: ``mean ± std`` where it has
    several, ``mean`` for one, empty for none."""
    if value is None:
        return ""
    mean, std = value
    return f"{mean:.1f} ± {std:.1f}" if n > 1 else f"{mean:.1f}"


def significant(value: tuple[float, float] | float | None, n: int = 1, digits: int = 3) -> str:
    """A figure to ``digits`` significant digits in fixed notation (``0.000412``, ``25.8``, ``13580``),
    where a fixed number of decimals would show a short time or a small model as 0; a (mean, std) pair
    over ``n`` > 1 runs: both at the mean's decimals (one run's std is None: undefined, not shown)."""
    if value is None:
        return ""
    mean, std = value if isinstance(value, tuple) else (value, None)
    places = _decimals(mean, digits)
    return f"{mean:.{places}f} ± {std:.{places}f}" if n > 1 and std is not None else f"{mean:.{places}f}"


def shared_flags(entries) -> str:
    """The marks the test table and the cost table share: NOT EVALUATED, SEEDS DIFFER, MIXED GALLERIES, a
    scored split that is not a held-out test split."""
    flags = ""
    if any(e.runs and not evaluated(e) for e in entries):
        flags += (
            "; NOT EVALUATED: a run with no evaluation recorded (still training, or stopped before its "
            "test evaluation): no figures, no protocol"
        )
    if any(unused_files(e) for e in entries if e.runs and not evaluated(e)):
        flags += (
            "; NOT EVALUATED: FILE not used: the run has an evaluation file, but it does not describe the "
            "run's checkpoint as configured (made with overrides that change what it measures, of another "
            "checkpoint, with another config.yaml, of other weights; the split column says which): its "
            "figures are not the run's; `patchword eval RUN` without such overrides records its evaluation"
        )
    if any(e.seeds_differ for e in entries):
        flags += (
            "; SEEDS DIFFER: a sweep row whose seeds ran with different config values (a seed resumed with "
            "other limits...; the config table lists them): its mean ± std is not over seeds of one recipe"
        )
    if any(mixed_galleries(e) for e in entries):
        flags += (
            "; MIXED GALLERIES: a sweep row whose runs scored different splits or galleries (a seed "
            "evaluated again with eval.split=dev...; the split column counts each): its mean ± std is over "
            "no one test set, and it is on no Pareto front"
        )
    uses = {use for e in entries for use in split_uses(e)}
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
