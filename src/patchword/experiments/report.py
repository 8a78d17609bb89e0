"""``patchword report RUN_OR_SWEEP... --out report.md``: runs side by side.

One row per run (or per variant of a sweep, as mean +- std over its seeds; every variant the sweep set out to
run, INCOMPLETE where seeds it was asked for are missing; rows and what they read:
:mod:`patchword.experiments.entries`): the recalls and rSum, the split the evaluation read (flagged where it
is the run's model-selection or training split) with its gallery size and, where the rows span several test
galleries, its gallery's tag, whether the protocol is leaky (flagged) and a two-stage search's shortlists (its
recalls' meaning in a note under the table), patch-selection object recall against chance and the
compositional accuracies where the run has them (:mod:`patchword.experiments.suite_table`); a run nothing
evaluated is "not evaluated" (with its evaluation files that describe something else, and why); an
imported checkpoint's published results beside its measured ones, each published row's protocol and note
under the table (:mod:`patchword.experiments.published_table`); what each costs (scoring time per 1K x 5K,
memory, a two-stage search's time, parameters, training time, index size: :mod:`patchword.experiments.cost`,
the Pareto front of accuracy against scoring time marked within each machine, test gallery and protocol);
the gallery-scale benchmarks given; then the config keys whose values differ between the rows or between
the seeds of one row (everything else is shared), one figure of the training curves overlaid (training
loss, dev rSum) and one of accuracy against cost. Writes ``report.md``, ``report.html`` (the figures
embedded), ``report_curves.png`` and ``report_cost.png`` beside it, and with ``csv`` one CSV row per report
row (mean and std of every figure: :mod:`patchword.experiments.report_csv`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from patchword.errors import DataError
from patchword.eval.metrics import RECALL_KEYS
from patchword.eval.two_stage import two_stage_of
from patchword.experiments.cost import (
    cost_rows,
    evaluated,
    index_bytes_per_image,
    is_incomplete,
    is_leaky,
    plot_accuracy_cost,
    significant,
    split_use,
)
from patchword.experiments.entries import Entry, SeedsDiffer, collect
from patchword.experiments.gallery_table import gallery_rows
from patchword.experiments.published_table import published_table
from patchword.experiments.report_csv import csv_text
from patchword.experiments.report_page import Table, html_page, markdown_page
from patchword.experiments.rows import (
    TWO_STAGE_NOTE,
    galleries_of,
    has_recalls,
    mean_cell,
    mixed,
    not_evaluated_cell,
    not_evaluated_mark,
    protocol_cell,
    shared_flags,
    split_uses,
)
from patchword.experiments.suite_table import compositional_table
from patchword.fileio import atomic_write_text
from patchword.runs.files import METRICS_FILE

__all__ = ["Entry", "collect", "differing_keys", "report_files", "write_report"]

KEYS = RECALL_KEYS


def differing_keys(entries: list[Entry]) -> dict[str, list[Any]]:
    """Config keys whose values differ between the rows, or between the runs of one row, with the value of
    each row (:attr:`Entry.config`: each run's config as it ended, with its last resume's overrides; a key
    whose runs differ: a :class:`SeedsDiffer`). Run names and directories are left out; a sweep row's
    ``seed`` is its list of seeds. A row without a finished run has no config: its values are None and take
    no part in what differs."""
    configs = [entry.config for entry in entries]
    present = [c for c in configs if c is not None]
    ignored = {"name", "output_dir"}
    return {
        k: [None if c is None else c.get(k) for c in configs]
        for k in sorted(set().union(*present))
        if k not in ignored
        and (
            len({json.dumps(c.get(k), sort_keys=True, default=str) for c in present}) > 1
            or any(isinstance(c.get(k), SeedsDiffer) for c in present)
        )
    }


def _curves(entries: list[Entry], out: Path) -> Path | None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from patchword.experiments.plots import curve_records, dev_label, save_figure

    fig, every_dev = Figure(figsize=(10, 4)), []
    loss_ax, dev_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, entry in enumerate(entries):
        colour = f"C{i % 10}"
        for j, run in enumerate(entry.runs):
            train, dev = curve_records(run / METRICS_FILE)
            every_dev += dev
            label = entry.label if j == 0 else None
            loss_ax.plot(
                [r["step"] for r in train], [r["loss"] for r in train], color=colour, alpha=0.8, label=label
            )
            dev_ax.plot(
                [r["step"] for r in dev], [r["rsum"] for r in dev], "o-", color=colour, alpha=0.8, label=label
            )
    loss_ax.set(xlabel="step", ylabel="training loss", title="training loss")
    # "dev rSum (300 images)" when every run validated on the same number of images (eval_max_images)
    dev_title = dev_label(every_dev)
    dev_ax.set(xlabel="step", ylabel=dev_title, title=dev_title)
    if dev_ax.get_legend_handles_labels()[0]:  # rows without runs draw nothing to name
        dev_ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out)
    return out


def _test_label(e: Entry) -> str:
    marks = [
        "INCOMPLETE" if is_incomplete(e) else "",
        not_evaluated_mark(e) if e.runs and not evaluated(e) else "",
        "SEEDS DIFFER" if e.seeds_differ else "",
    ]
    marks = [m for m in marks if m]
    return e.label + (f" ({'; '.join(marks)})" if marks else "")


def _split_cell(e: Entry, tags: dict[str, str]) -> str:
    """The split the row's evaluation read, its gallery size, what else the split is to the run and, where
    the rows span several galleries, the row's gallery tag; a row whose runs scored different galleries:
    ``MIXED:`` and each (split, size, tag) with its run count, then what else any of those splits is."""
    counts: dict[tuple[str, str], int] = {}  # (split (size), tag) -> runs
    for record, scored, gallery in zip(e.summaries, e.scored, e.galleries, strict=True):
        if has_recalls(record):
            size = f"{record.get('images') or '?'} / {record.get('captions') or '?'}"
            key = (f"{scored or '?'} ({size})", f" [{tags[gallery]}]" if gallery in tags else "")
            counts[key] = counts.get(key, 0) + 1
    uses = "".join(f", {use.upper()} SPLIT" for use in split_uses(e))
    if len(counts) == 1:  # the tag after what the split is: "dev (8 / 40), MODEL SELECTION SPLIT [G2]"
        split, tag = next(iter(counts))
        return split + uses + tag
    return mixed({split + tag: n for (split, tag), n in counts.items()}) + uses


def _test_row(e: Entry, tags: dict[str, str]) -> list[str]:
    """A row of the test-metrics table (a row without a finished run: its label and seed count only; a run
    without an evaluation: "not evaluated"). ``tags``: gallery -> its tag, where there are several."""
    done = len(e.runs)
    said = [f"missing: {', '.join(map(str, e.missing))}"] if e.missing else []
    if e.outside:
        said.append(
            f"finished outside the sweep: {', '.join(map(str, e.outside))}; rerun the sweep command to "
            "record it"
        )
    seeds = (
        f"{done} of {e.planned}" + (f" ({'; '.join(said)})" if said else "")
        if is_incomplete(e)
        else str(done)
    )
    if not done:
        return [_test_label(e), seeds, *[""] * (len(KEYS) + 5)]
    if not evaluated(e):
        return [_test_label(e), seeds, *[""] * len(KEYS), not_evaluated_cell(e), "", "", "", ""]
    recall, chance = e.value("selection_object_recall.caption"), e.value("selection_chance.caption")
    selection = f"{mean_cell(recall, done)} / {chance[0]:.1f}" if recall and chance else ""
    return [
        _test_label(e),
        seeds,
        *(mean_cell(e.value(k), done) for k in KEYS),
        _split_cell(e, tags),
        protocol_cell(e),
        selection,
        significant(e.value("train_seconds"), done),
        _steps_cell(e),
    ]


def _steps_cell(e: Entry) -> str:
    """The training step of the checkpoint the row's figures are of and the steps its run trained
    (``4 / 8``): runs with equal configs may have kept other checkpoints. A row whose runs differ: each
    run's in order (``3, 4 / 8, 8``); ``?`` where a record lacks it. An imported checkpoint was trained
    elsewhere: its step is ``?`` whatever its record says (an import writes step 0), or the official
    training's iteration count where its ``import.json`` recorded one (``4242 official iterations``)."""
    imported = [_imported_steps(record) for record in e.imports]

    def runs_of(key: str) -> str:
        shown = [
            ("?" if s.get(key) is None else f"{s[key]:.10g}")
            if origin is None
            else (origin if key == "checkpoint_step" else "?")
            for s, origin in zip(e.summaries, imported, strict=True)
        ]
        return shown[0] if len(set(shown)) == 1 else ", ".join(shown)

    cell = f"{runs_of('checkpoint_step')} / {runs_of('steps')}"
    return "" if cell == "? / ?" and not any(i is not None for i in imported) else cell


def _imported_steps(record: dict[str, Any]) -> str | None:
    """What an imported run's checkpoint step is shown as (``record``: its ``import.json``): the official
    iteration count it recorded (``metadata.Eiters``), labelled, else ``?``; None for a run trained here."""
    if not record:
        return None
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    iterations = metadata.get("Eiters")
    if isinstance(iterations, int) and not isinstance(iterations, bool) and iterations >= 0:
        return f"{iterations} official iterations"
    return "?"


def _test_caption(entries: list[Entry], tags: dict[str, str]) -> str:
    """The test-metrics table's caption: what its rows scored (held-out test splits, or not all), and a
    warning for each mark its rows carry."""
    held_out = not any(split_use(e) for e in entries)
    caption = "Test metrics" if held_out else "Metrics of the split each row scored (not all held-out test)"
    caption += (
        " (mean ± sample std over seeds where a row has several; train s: three significant digits; "
        "checkpoint step / steps: the training step of the checkpoint evaluated and the steps the run "
        "trained, each run's where a row's differ)"
    )
    if any(any(e.imports) for e in entries):
        caption += (
            "; an imported checkpoint trained elsewhere: its checkpoint step is `?`, or the official "
            "training's iteration count where its import.json records one, and its steps `?`"
        )
    if tags:
        listed = "; ".join(f"{tag}: {gallery}" for gallery, tag in tags.items())
        caption += (
            f"; {len(tags)} TEST GALLERIES [{listed}]: recalls and rSum compare only between rows of one "
            "gallery (the tag in the split column)"
        )
    if any(is_incomplete(e) for e in entries):
        caption += (
            "; INCOMPLETE: a sweep variant with seeds it was asked for not finished (missing: those seeds), "
            "its figures over the finished seeds only, none for a variant with no finished seed; "
            "`patchword sweep` with the sweep's --config, overrides and --name, the row's --variant (if it "
            "has one) and the missing --seeds resumes it"
        )
    if any(e.outside for e in entries):
        caption += (
            "; finished outside the sweep: a seed whose run has its summary.json but which sweep.json does "
            "not list (continued with `patchword train --resume`): not in the row's figures; the same "
            "`patchword sweep` command again records it"
        )
    caption += shared_flags(entries)
    if any(is_leaky(e) for e in entries):
        caption += (
            "; LEAKY: queries carry dense text generated from their own target image (official SEPS code)"
        )
    return caption


def _gallery_tags(entries: list[Entry]) -> dict[str, str]:
    """gallery -> ``G1``, ``G2``... in the rows' (and their runs') order, where the evaluated runs span
    several; else {}."""
    galleries = list(dict.fromkeys(g for e in entries for g in galleries_of(e)))
    return {g: f"G{i}" for i, g in enumerate(galleries, start=1)} if len(galleries) > 1 else {}


def _tables(
    entries: list[Entry], index_sizes: dict[int, float] | None = None, galleries: tuple[Path, ...] = ()
) -> list[Table]:
    tags = _gallery_tags(entries)
    rows = [_test_row(e, tags) for e in entries]
    header = [
        "run",
        "seeds",
        *KEYS,
        "split (images / captions)",
        "protocol",
        "selection recall / chance",
        "train s",
        "checkpoint step / steps",
    ]
    test: Table = (_test_caption(entries, tags), header, rows)
    if any(two_stage_of(s) for e in entries for s in e.summaries if has_recalls(s)):
        test = (*test, [TWO_STAGE_NOTE])  # a two-stage row's recalls are of its shortlists: what that means
    tables = [test]
    suite = compositional_table(entries)
    if suite is not None:
        tables.append(suite)
    tables.append(cost_rows(entries, index_sizes or {}))
    published = published_table(entries)
    if published is not None:
        tables.append(published)
    tables += [gallery_rows(path) for path in galleries]
    tables.append(_config_table(entries))
    return tables


def _config_table(entries: list[Entry]) -> Table:
    diff = differing_keys(entries)
    rows = [
        [k, *("" if not e.runs else _config_cell(v) for e, v in zip(entries, values, strict=True))]
        for k, values in diff.items()
    ]
    caption = "Config keys that differ (all others are equal)"
    if any(isinstance(v, SeedsDiffer) for values in diff.values() for v in values):
        caption += (
            "; DIFFERS BETWEEN SEEDS: the runs of one sweep row ran with different values of the key (each "
            "run's config.yaml with its last resume's overrides): the row's mean ± std is not over seeds of "
            "one recipe"
        )
    return caption, ["key", *(e.label for e in entries)], rows


def _config_cell(value: Any) -> str:
    return str(value) if isinstance(value, SeedsDiffer) else json.dumps(value, default=str)


def _index_sizes(entries: list[Entry], indexes: tuple[Path, ...]) -> dict[int, float]:
    """``id(row)`` -> bytes per image of the search index built from that row's run (``--index``)."""
    sizes = {}
    for index in indexes:
        run, per_image = index_bytes_per_image(index)
        owner = next(
            (e for e in entries if run and any(Path(run).resolve() == r.resolve() for r in e.runs)), None
        )
        if owner is None:
            raise DataError(
                f"{index}: built from the run {run or '(none recorded)'}, which is not in the report"
            )
        sizes[id(owner)] = per_image
    return sizes


def report_files(out: Path) -> dict[str, Path]:
    """The files :func:`write_report` writes for ``out`` (the CSV aside): the Markdown, the HTML and the two
    figures beside them."""
    return {
        "markdown": out,
        "html": out.with_suffix(".html"),
        "curves": out.with_name(out.stem + "_curves.png"),
        "cost": out.with_name(out.stem + "_cost.png"),
    }


def write_report(
    paths: list[Path],
    out: Path,
    *,
    csv: Path | None = None,
    indexes: tuple[Path, ...] = (),
    galleries: tuple[Path, ...] = (),
) -> Path:
    """Write ``out`` (Markdown), ``out`` with ``.html`` and the figures beside it, and the CSV when asked
    (``csv``); ``indexes``: search index directories (their bytes per image join their run's row);
    ``galleries``: ``patchword bench gallery`` JSON files. Returns ``out``."""
    entries = collect(paths)
    index_sizes = _index_sizes(entries, indexes)
    tables = _tables(entries, index_sizes, galleries)
    files = report_files(out)
    figures = []
    curves = _curves(entries, files["curves"])
    if curves is not None:
        figures.append(("training curves", curves))
    trade_off = plot_accuracy_cost(entries, files["cost"])
    if trade_off is not None:
        figures.append(("accuracy vs cost", trade_off))
    atomic_write_text(out, markdown_page(tables, figures))
    atomic_write_text(files["html"], html_page(tables, figures))
    if csv is not None:
        atomic_write_text(csv, csv_text(entries, index_sizes))
    return out
