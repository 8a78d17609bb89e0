"""``patchword report --csv FILE``: one row per report row, with the mean and the sample std of every figure
the Markdown shows (the recalls and ranks, patch selection against chance, cost, training, a two-stage
search's shortlists and time, the compositional suite's accuracies, the index's bytes per image).

Functions take the report's rows (``patchword.experiments.entries.Entry``) without importing them; what is
keyed per row is keyed by the row itself (``id(row)``), never by its label.
"""

from __future__ import annotations

import csv
import io

from patchword.eval.metrics import RANK_KEYS, RECALL_KEYS
from patchword.experiments.cost import gallery_of, seconds_per_gallery
from patchword.experiments.machines import machine_of, mixed_machines, mixed_training, train_machine_of
from patchword.experiments.rows import (
    TWO_STAGE_KEYS,
    evaluated,
    is_incomplete,
    one_or_mixed,
    protocol_cell,
    split_use_cell,
)
from patchword.experiments.suite_table import suite_kinds, suite_value

__all__ = ["CSV_KEYS", "csv_text"]

#: Numeric figures of a row in the CSV (mean and std columns each), in order; dotted keys reach into
#: the recorded evaluation (``cost.scoring_seconds``); a two-stage search's shortlists last (empty for an
#: exhaustive one).
CSV_KEYS = (
    *RECALL_KEYS,
    *RANK_KEYS,
    "images",
    "captions",
    "selection_object_recall.caption",
    "selection_chance.caption",
    "cost.scoring_seconds",
    "cost.search_seconds",
    "cost.pairs_per_s",
    "cost.peak_device_mb",
    "cost.peak_device_growth_mb",
    "cost.device_start_mb",
    "cost.peak_host_rss_mb",
    "cost.peak_host_growth_mb",
    "cost.host_rss_start_mb",
    "cost.threads",
    "params_total",
    "params_trainable",
    "train_seconds",
    "train_steps_per_s",
    "checkpoint_step",
    "steps",
    *TWO_STAGE_KEYS,
)

_DESCRIBED = (
    "run",
    "seeds",
    "machine",
    "planned",
    "complete",
    "protocol",
    "dataset",
    "split",
    "split_use",
    "gallery",
    "seeds_differ",
    "train_machine",
)


def _figures(e, index_sizes: dict[int, float], kinds: list[str]) -> list:
    """(mean, std) of every figure of the row, in the header's order (None: the row lacks it)."""
    # a figure over several machines' times describes none of them; an imported checkpoint's step is not
    # one of a training here (its record says 0)
    cost, steps, imported = mixed_machines(e), mixed_training(e), any(getattr(e, "imports", []))
    hidden = {
        k
        for k in CSV_KEYS
        if (cost and k.startswith("cost."))
        or (steps and k == "train_steps_per_s")
        or (imported and k == "checkpoint_step")
    }
    values = [None if k in hidden else e.value(k) for k in CSV_KEYS]
    values.append(seconds_per_gallery(e))
    if kinds:
        values += [suite_value(e, kind) for kind in kinds]
    values.append((index_sizes[id(e)], None) if id(e) in index_sizes else None)  # one index: no spread
    return values


def csv_text(entries, index_sizes: dict[int, float] | None = None) -> str:
    """One row per report row: label, finished seeds, machine, planned seeds, whether all finished and
    evaluated, protocol (``leaky`` / ``leak-free``, then a two-stage search's ``two-stage (shortlist 40/8, α
    1.0)``), dataset, the split scored and what else it is to each run (:func:`~patchword.experiments.rows.
    split_use_cell`), the test gallery, the config keys whose values differ between its seeds
    (``;``-separated) and the training machine, then the mean and std of every :data:`CSV_KEYS` figure, of
    the 1K x 5K scoring seconds, of each compositional kind (``compositional.<kind>``, over the seeds
    scored, counted in ``compositional_scored``; where any row has the suite) and the bytes per image of
    the row's search index (``index_sizes``: ``id(row)`` -> bytes). Empty where a row lacks a figure, the
    std for a single run (undefined), the ``cost.`` figures where the row's runs were evaluated on different
    machines, steps/s where it trained on several, the checkpoint step of an imported checkpoint. A row not
    evaluated has no protocol, dataset, split or gallery; a row whose runs differ in them reads ``MIXED:``
    and each value with its run count."""
    index_sizes = index_sizes or {}
    kinds = suite_kinds(entries) if any(any(getattr(e, "compositional", [])) for e in entries) else []
    keys = [*CSV_KEYS, "seconds_per_1k_x_5k", *(f"compositional.{k}" for k in kinds), "index_bytes_per_image"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    scored = ["compositional_scored"] if kinds else []
    writer.writerow([*_DESCRIBED, *scored, *(f"{k}_{s}" for k in keys for s in ("mean", "std"))])
    for e in entries:
        done = evaluated(e)
        row: list = [
            e.label,
            len(e.runs),
            machine_of(e) if e.runs else "",
            e.planned,
            "yes" if done and not is_incomplete(e) else "no",
            protocol_cell(e, leaky="leaky") if done else "",  # "leaky" / "leak-free", a two-stage search's
            one_or_mixed(e, "datasets") if done else "",
            one_or_mixed(e, "scored") if done else "",
            split_use_cell(e) if done else "",
            (gallery_of(e) or "") if done else "",
            "; ".join(e.seeds_differ),
            train_machine_of(e),
        ]
        if kinds:
            row.append(sum(1 for record in e.compositional if record))
        for value in _figures(e, index_sizes, kinds):
            row += ["", ""] if value is None else list(value)  # floats as repr: they read back equal
        writer.writerow(row)
    return out.getvalue()
