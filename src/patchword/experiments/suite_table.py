"""The compositional suite's table in ``patchword report``: each row's accuracy per kind, the suite it
scored (the synthetic split, or the ``--suite-file`` files) and the dense text its matcher read.

The kinds are the records' own (``"n"`` lists them): the synthetic suite's four, or one per SugarCrepe
file (``swap_obj``, ``replace_att``...), so a row scored on files shows its figures in its own columns,
never an empty row under the synthetic kinds. A sweep row some of whose seeds have no record shows its
figures over the scored seeds and says which are missing (``1 of 2 seeds scored (missing: seed 1)``).
Functions take the report's rows (``patchword.experiments.entries.Entry``: ``label``, ``runs``,
``configs``, ``compositional`` (one suite record per run, ``{}`` for none), ``stale``) without importing
them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import PurePath
from typing import Any

from patchword.data.synthetic.negatives import NEGATIVE_KINDS
from patchword.eval.compositional import DENSE_TEXT_WORDS
from patchword.experiments.rows import mean_cell, one_or_mixed_of
from patchword.experiments.sweep import mean_std_of

__all__ = ["compositional_table", "suite_kinds", "suite_value", "unscored_seeds"]


def suite_kinds(entries) -> list[str]:
    """Every kind the rows' records score, in their order (records list them in ``"n"``)."""
    kinds = [k for e in entries for record in e.compositional if record for k in record.get("n") or {}]
    return list(dict.fromkeys(kinds)) or list(NEGATIVE_KINDS)  # the synthetic suite's, in its order


def suite_value(entry, kind: str) -> tuple[float, float | None] | None:
    """(mean, sample std) of ``kind``'s accuracy over the row's scored runs (those with a suite record;
    :func:`unscored_seeds` names the others), None where none of them has it."""
    return mean_std_of([r.get(kind) for r in entry.compositional if r])


def unscored_seeds(entry) -> list[int]:
    """The seeds of the row's runs without a suite record of their default checkpoint (none scored, or
    a record of something else: ``entry.stale``)."""
    return [c.seed for c, record in zip(entry.configs, entry.compositional, strict=True) if not record]


def _label(entry) -> str:
    """The row's label, with how many of its seeds were scored where not all were (the figures are over
    the scored ones) and the runs whose record is not shown."""
    marks = []
    missing = unscored_seeds(entry)
    if missing and len(entry.runs) > 1:
        scored = len(entry.runs) - len(missing)
        listed = ", ".join(f"seed {s}" for s in missing)
        marks.append(f"{scored} of {len(entry.runs)} seeds scored (missing: {listed})")
    if entry.stale:
        marks.append(f"NOT SHOWN: {', '.join(sorted(set(entry.stale)))}")
    return entry.label + (f" ({'; '.join(marks)})" if marks else "")


def _suite(record: dict[str, Any]) -> str:
    """What a record scored: the synthetic split it names, or the names of the suite files it read."""
    source = record.get("source")
    if isinstance(source, list):
        return "files " + ", ".join(PurePath(str(path)).name for path in source)
    return str(source) if source else "not recorded"


def _per_run(entry, cell) -> str:
    """``cell(record)`` of the row's scored runs: their one value, or ``MIXED:`` and each with its count."""
    return one_or_mixed_of(Counter(cell(r) for r in entry.compositional if r), "")


def compositional_table(entries) -> tuple[str, list[str], list[list[str]]] | None:
    """The compositional table (caption, header, rows) of the rows with a suite record (or a stale one),
    None for none: run, suite, dense text, then the accuracy of every kind the records score (a row
    lacking a kind: empty)."""
    with_suite = [e for e in entries if any(e.compositional) or e.stale]
    if not with_suite:
        return None
    kinds = suite_kinds(with_suite)
    rows = [
        [
            _label(e),
            _per_run(e, _suite),
            _per_run(e, lambda r: str(r.get("dense_text") or "not recorded")),
            *(mean_cell(suite_value(e, k), sum(1 for r in e.compositional if r)) for k in kinds),
        ]
        for e in with_suite
    ]
    caption = (
        "Compositional suite (accuracy %, chance 50: the caption must score above its one-fact negative; "
        "the kinds are the suite's: the synthetic scenes' four, or one per SugarCrepe file; a row scored "
        "on another suite leaves the others' columns empty)"
    )
    if any(r.get("dense_text") == "none" for e in with_suite for r in e.compositional if r):
        caption += f"; dense text {DENSE_TEXT_WORDS['none']}"
    if any(unscored_seeds(e) and len(e.runs) > 1 for e in with_suite):
        caption += (
            "; n of m seeds scored: a sweep row some of whose seeds have no suite record of their default "
            "checkpoint: its figures are over the scored seeds only (`patchword eval RUN --suite "
            "compositional` scores a missing one)"
        )
    if any(e.stale for e in with_suite):
        caption += (
            "; NOT SHOWN: the named runs' eval_compositional.json is not of their default checkpoint's "
            "bytes with their present config and no overrides (another checkpoint, other data, or a "
            "file that does not record which): `patchword eval RUN --suite compositional --force` "
            "scores it"
        )
    return caption, ["run", "suite", "dense text", *kinds], rows
