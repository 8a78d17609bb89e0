"""The compositional suite's table in ``patchword report``: each row's accuracy per kind, the suite it
scored (the synthetic split, or the ``--suite-file`` files) and the dense text its matcher read.

The kinds are the records' own (``"n"`` lists them): the synthetic suite's four, or one per SugarCrepe
file (``swap_obj``, ``replace_att``...), so a row scored on files shows its figures in its own columns,
never an empty row under the synthetic kinds. Functions take the report's rows
(``patchword.experiments.entries.Entry``: ``label``, ``runs``, ``compositional`` (one suite record per run,
``{}`` for none), ``stale``, ``value(key, "compositional")``) without importing them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import PurePath
from typing import Any

from patchword.data.synthetic.negatives import NEGATIVE_KINDS
from patchword.eval.compositional import DENSE_TEXT_WORDS
from patchword.experiments.rows import mean_cell, one_or_mixed_of

__all__ = ["compositional_table"]


def _kinds(entries) -> list[str]:
    """Every kind the rows' records score, in their order (records list them in ``"n"``)."""
    kinds = [k for e in entries for record in e.compositional if record for k in record.get("n") or {}]
    return list(dict.fromkeys(kinds)) or list(NEGATIVE_KINDS)  # the synthetic suite's, in its order


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
    kinds = _kinds(with_suite)
    rows = [
        [
            e.label + (f" (NOT SHOWN: {', '.join(sorted(set(e.stale)))})" if e.stale else ""),
            _per_run(e, _suite),
            _per_run(e, lambda r: str(r.get("dense_text") or "not recorded")),
            *(mean_cell(e.value(k, "compositional"), len(e.runs)) for k in kinds),
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
    if any(e.stale for e in with_suite):
        caption += (
            "; NOT SHOWN: the named runs' eval_compositional.json is not of their default checkpoint's "
            "bytes with their present config and no overrides (another checkpoint, other data, or a "
            "file that does not record which): `patchword eval RUN --suite compositional --force` "
            "scores it"
        )
    return caption, ["run", "suite", "dense text", *kinds], rows
