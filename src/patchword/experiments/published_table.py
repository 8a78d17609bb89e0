"""The published-vs-measured table of ``patchword report``: for the rows that are imported official
checkpoints (:mod:`patchword.imports.published`), each published result of the method, backbone and dataset
the checkpoint was trained for beside what was measured here and their difference. Functions take the
report's rows (``patchword.experiments.entries.Entry``: ``label``, ``runs``, ``configs``, ``summaries``,
``imports``) without importing them.
"""

from __future__ import annotations

from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.report_page import Table
from patchword.imports.published import (
    DATASETS,
    caveats,
    compare_rows,
    imported_model,
    measured_metrics,
    not_measured,
)

__all__ = ["published_table"]

KEYS = RECALL_KEYS


def published_table(entries) -> Table | None:
    """Published vs measured here for the rows that are imported official checkpoints
    (:mod:`patchword.imports.published`): per published result of the method, backbone and dataset the
    checkpoint was trained for, its row, the row's measured figures and their difference; a row without an
    evaluation, or whose evaluation records no figures of its protocol (COCO 1K without ``eval.coco_1k``):
    "not measured here yet" (or why not), and no caveat of what was not measured. A published row with a
    recorded protocol or note (what is doubtful about the row as printed: a recall its paper prints
    otherwise elsewhere, a protocol the notes assume) is marked ``[n]``, its protocol and note under the
    table, as the model card shows them."""
    rows, notes, marks = [], [], {}
    for e in filter(lambda e: e.runs, entries):
        model = imported_model(e.imports[0])
        # the data config the evaluation read: which split its recorded role is, which data lay there
        data = e.configs[0].data
        record = e.summaries[0]
        for published in model.published() if model is not None else []:
            measured = measured_metrics(record, published.dataset)
            what = DATASETS[published.dataset] + (f", {published.variant}" if published.variant else "")
            unmeasured = not_measured(record, measured, published.dataset, e.configs[0].eval.coco_1k)
            for row in compare_rows(published, measured):
                if row["row"] != "published" and unmeasured:
                    if row["row"] == "measured here":
                        rows.append([e.label, what, unmeasured, *[""] * (len(KEYS) + 1)])
                    continue
                signed = row["row"] == "difference"
                cells = [
                    "" if row[k] is None else f"{row[k]:+.1f}" if signed else f"{row[k]:.1f}" for k in KEYS
                ]
                source = published.source if row["row"] == "published" else ""
                name = row["row"] + (_mark(published, what, marks) if row["row"] == "published" else "")
                rows.append([e.label, what, name, *cells, source])
            if not unmeasured:  # a row that measured nothing compares nothing: no note of how it differs
                notes += [f"{e.label}, {what}: {text}" for text in caveats(published, record, data, model)]
    if not rows:
        return None
    caption = (
        "Published (paper / official README, as printed) vs measured here, for imported official "
        "checkpoints; difference = measured - published"
    )
    if notes:
        caption += "; NOT LIKE FOR LIKE: " + "; ".join(notes)
    header = ["run", "published result", "row", *KEYS, "source"]
    return caption, header, rows, [f"[{n}] {text}" for text, n in marks.items()]


def _mark(published, what: str, marks: dict[str, int]) -> str:
    """`` [n]``: the footnote of ``published``'s protocol and note (``marks``: footnote text -> n, one
    number per text, shared by the rows that print it); ``""`` for a row that records neither."""
    said = [f"protocol: {published.protocol}"] if published.protocol else []
    said += [f"note: {published.note}"] if published.note else []
    if not said:
        return ""
    text = f"{what}: " + "; ".join(said)
    return f" [{marks.setdefault(text, len(marks) + 1)}]"
