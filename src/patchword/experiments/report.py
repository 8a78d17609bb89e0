"""``patchword report RUN_OR_SWEEP... --out report.md``: runs side by side.

One row per run (or per variant of a sweep, as mean +- std over its seeds; every variant the sweep set out to
run, INCOMPLETE where seeds are missing): the test recalls and rSum, the split and its gallery size, whether
the protocol is leaky (flagged), patch-selection object recall against chance and the compositional
accuracies where the run has them; what each costs (scoring time per 1K x 5K, memory, parameters, training
time, index size: :mod:`patchword.experiments.cost`, the Pareto front of accuracy against scoring time
marked within each machine, test gallery and protocol); the gallery-scale benchmarks given; then the
config keys whose values differ between the runs (everything else is shared), one figure of the training
curves overlaid (training loss, dev rSum) and one of accuracy against cost. Writes ``report.md``,
``report.html`` (the figures embedded), ``report_curves.png`` and ``report_cost.png`` beside it, and with
``csv`` one CSV row per report row (mean and std of every figure).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from patchword.config import flat_config
from patchword.errors import DataError, MissingFileError
from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.cost import (
    cost_rows,
    csv_text,
    dataset_label,
    index_bytes_per_image,
    is_incomplete,
    is_leaky,
    plot_accuracy_cost,
)
from patchword.experiments.gallery_table import gallery_rows
from patchword.experiments.report_page import Table, html_page, markdown_page
from patchword.experiments.sweep import SWEEP_FILE, mean_std, read_sweep
from patchword.fileio import atomic_write_text
from patchword.imports.base import IMPORT_FILE
from patchword.imports.published import (
    DATASETS,
    caveats,
    compare_rows,
    imported_model,
    measured_metrics,
)
from patchword.readers import read_json, read_json_lines
from patchword.runs.files import (
    BEST_CHECKPOINT,
    CONFIG_FILE,
    METRICS_FILE,
    METRICS_JSON,
    RESUMES_FILE,
    SUMMARY_FILE,
)
from patchword.runs.load import read_run_config, resolve_checkpoint
from patchword.runs.recorded import evaluation_of

__all__ = ["Entry", "collect", "differing_keys", "report_files", "write_report"]

KEYS = RECALL_KEYS
KINDS = ("attribute_swap", "relation_swap", "object_replace", "count_change")


class Entry:
    """One row: a run, or a variant of a sweep (its seeds' runs)."""

    def __init__(self, label: str, runs: list[Path], planned: int | None = None) -> None:
        self.label, self.runs = label, runs
        # the seeds a sweep set out to run; fewer finished runs: an interrupted sweep (never shown as whole)
        self.planned = max(planned or 0, len(runs))
        self.summaries = [_with_dataset(r, _metrics(r)) for r in runs]
        suites = [_suite_record(r, "eval_compositional.json") for r in runs]
        self.compositional = [record for record, _ in suites]
        # suite files scored before the checkpoint they name was last written (a run resumed since)
        self.stale = [name for _, name in suites if name]

    def value(self, key: str, source: str = "summaries") -> tuple[float, float] | None:
        """(mean, sample std) of ``key`` (``a.b`` reaches into a mapping) over the entry's runs, None where
        a run lacks it. ``source``: ``summaries`` or ``compositional``."""
        values = []
        for record in getattr(self, source):
            for part in key.split("."):
                record = record.get(part) if isinstance(record, dict) else None
            values.append(record)
        if not values or any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
            return None
        return mean_std(values)

    def first(self, key: str) -> Any:
        return next((s[key] for s in self.summaries if key in s), None)


def _metrics(run: Path) -> dict[str, Any]:
    """A run's row: its training summary, else the recorded evaluation of its default checkpoint (an
    imported run evaluated with ``patchword eval``), else its metrics.json."""
    summary = _json(run / SUMMARY_FILE)
    if summary:
        return summary
    try:
        evaluation, _ = evaluation_of(run, resolve_checkpoint(run))
    except MissingFileError:
        evaluation = {}
    return evaluation or _json(run / METRICS_JSON)


def _with_dataset(run: Path, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the ``"dataset"`` its test gallery came from (from the run's config where the
    record does not say): rSum is ranked only among rows of one dataset."""
    if record.get("dataset"):
        return record
    return {**record, "dataset": dataset_label(read_run_config(run).data)}


def _suite_record(run: Path, name: str) -> tuple[dict[str, Any], str | None]:
    """A suite's evaluation file in ``run`` and, when it is older than the checkpoint it names (training
    went on after it was scored), the name of that checkpoint."""
    path = run / name
    record = _json(path)
    checkpoint = run / Path(str(record.get("checkpoint") or BEST_CHECKPOINT)).name
    if record and checkpoint.is_file() and path.stat().st_mtime < checkpoint.stat().st_mtime:
        return record, checkpoint.name
    return record, None


def resume_overrides(run: Path) -> list[str]:
    """The overrides of every ``--resume`` of ``run``, in order (``resumes.jsonl``): what the run became
    differs from its ``config.yaml`` by these (a longer ``train.max_steps``...)."""
    return [
        o for record in read_json_lines(run / RESUMES_FILE, "resume log") for o in record.get("overrides", [])
    ]


def _json(path: Path) -> dict[str, Any]:
    return read_json(path, path.name, default={})


def collect(paths: list[Path]) -> list[Entry]:
    """Runs and sweeps -> rows (a sweep: one row per variant it set out to run, those with no finished
    seed yet included: an interrupted sweep never reads as whole)."""
    entries = []
    for path in paths:
        if (path / SWEEP_FILE).exists():
            sweep = read_sweep(path)
            planned = len(sweep.get("seeds", [])) or None
            # the planned variants in their order, then any finished one the record does not plan ("runs")
            for variant in dict.fromkeys([*sweep.get("variants", {}), *sweep["runs"]]):
                runs = sweep["runs"].get(variant, {})
                parent = path / variant if variant != "runs" else path
                label = f"{path.name}/{variant}" if variant != "runs" else path.name
                entries.append(Entry(label, [parent / f"seed-{s}" for s in runs], planned))
        elif (path / CONFIG_FILE).is_file():
            entries.append(Entry(path.name, [path]))
        else:
            raise MissingFileError(
                f"{path} is neither a run directory nor a sweep (no config.yaml, no sweep.json)"
            )
    return entries


def differing_keys(entries: list[Entry]) -> dict[str, list[Any]]:
    """Config keys whose values differ between the rows, with the value of each row. A run's config is its
    ``config.yaml`` with the overrides of its resumes applied. Run names and directories are left out; a
    sweep row's ``seed`` is its list of seeds. A row without a finished run has no config: its values are
    None and take no part in what differs."""
    configs: list[dict[str, Any] | None] = []
    for entry in entries:
        if not entry.runs:
            configs.append(None)
            continue
        # the config each run ended with: config.yaml, then what its resumes changed
        config = flat_config(read_run_config(entry.runs[0], resume_overrides(entry.runs[0])))
        if len(entry.runs) > 1:
            config["seed"] = [read_run_config(run).seed for run in entry.runs]
        configs.append(config)
    present = [c for c in configs if c is not None]
    ignored = {"name", "output_dir"}
    return {
        k: [None if c is None else c.get(k) for c in configs]
        for k in sorted(set().union(*present))
        if k not in ignored and len({json.dumps(c.get(k), sort_keys=True, default=str) for c in present}) > 1
    }


def _cell(value: tuple[float, float] | None, n: int) -> str:
    if value is None:
        return ""
    mean, std = value
    return f"{mean:.1f} ± {std:.1f}" if n > 1 else f"{mean:.1f}"


def _curves(entries: list[Entry], out: Path) -> Path | None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from patchword.experiments.plots import save_figure

    fig = Figure(figsize=(10, 4))
    loss_ax, dev_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, entry in enumerate(entries):
        colour = f"C{i % 10}"
        for j, run in enumerate(entry.runs):
            records = read_json_lines(run / METRICS_FILE, "metrics log")
            train = [r for r in records if r.get("split") == "train"]
            dev = [r for r in records if r.get("split") == "dev"]
            label = entry.label if j == 0 else None
            loss_ax.plot(
                [r["step"] for r in train], [r["loss"] for r in train], color=colour, alpha=0.8, label=label
            )
            dev_ax.plot(
                [r["step"] for r in dev], [r["rsum"] for r in dev], "o-", color=colour, alpha=0.8, label=label
            )
    loss_ax.set(xlabel="step", ylabel="training loss", title="training loss")
    dev_ax.set(xlabel="step", ylabel="dev rSum", title="dev rSum")
    dev_ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out)
    return out


def _test_row(e: Entry) -> list[str]:
    """A row of the test-metrics table (a row without a finished run: its label and seed count only)."""
    done = len(e.runs)
    label = e.label + (" (INCOMPLETE)" if is_incomplete(e) else "")
    seeds = f"{done} of {e.planned}" if is_incomplete(e) else str(done)
    if not done:
        return [label, seeds, *[""] * (len(KEYS) + 4)]
    recall, chance = e.value("selection_object_recall.caption"), e.value("selection_chance.caption")
    selection = f"{_cell(recall, done)} / {chance[0]:.1f}" if recall and chance else ""
    split = f"{e.first('split') or ''} ({e.first('images') or '?'} / {e.first('captions') or '?'})"
    seconds = e.value("train_seconds")
    return [
        label,
        seeds,
        *(_cell(e.value(k), done) for k in KEYS),
        split,
        "LEAKY" if is_leaky(e) else "leak-free",
        selection,
        f"{seconds[0]:.0f}" if seconds else "",
    ]


def _tables(
    entries: list[Entry], index_sizes: dict[str, float] | None = None, galleries: tuple[Path, ...] = ()
) -> list[Table]:
    n = {e.label: len(e.runs) for e in entries}
    rows = [_test_row(e) for e in entries]
    caption = "Test metrics (mean ± sample std over seeds where a row has several)"
    if any(is_incomplete(e) for e in entries):
        caption += (
            "; INCOMPLETE: a sweep that stopped before all its seeds finished, its figures over the finished"
            " seeds only, none for a variant with no finished seed (the same `patchword sweep` command"
            " resumes it)"
        )
    if any(is_leaky(e) for e in entries):
        caption += (
            "; LEAKY: queries carry dense text generated from their own target image (official SEPS code)"
        )
    header = [
        "run",
        "seeds",
        *KEYS,
        "split (images / captions)",
        "protocol",
        "selection recall / chance",
        "train s",
    ]
    tables: list[Table] = [(caption, header, rows)]
    with_suite = [e for e in entries if any(e.compositional)]
    if with_suite:
        rows = [
            [
                e.label + (f" (STALE: before {', '.join(sorted(set(e.stale)))})" if e.stale else ""),
                *(_cell(e.value(k, "compositional"), n[e.label]) for k in KINDS),
            ]
            for e in with_suite
        ]
        caption = (
            "Compositional suite (accuracy %, chance 50: the caption must score above its one-fact negative)"
        )
        if any(e.stale for e in with_suite):
            caption += (
                "; STALE: scored before the named checkpoint was last written (training went on since): "
                "`patchword eval RUN --suite compositional --force` scores it again"
            )
        tables.append((caption, ["run", *KINDS], rows))
    tables.append(cost_rows(entries, index_sizes or {}))
    published = _published_table(entries)
    if published is not None:
        tables.append(published)
    tables += [gallery_rows(path) for path in galleries]
    diff = differing_keys(entries)
    rows = [
        [k, *("" if not e.runs else json.dumps(v, default=str) for e, v in zip(entries, values, strict=True))]
        for k, values in diff.items()
    ]
    tables.append(
        ("Config keys that differ (all others are equal)", ["key", *(e.label for e in entries)], rows)
    )
    return tables


def _published_table(entries: list[Entry]) -> Table | None:
    """Published vs measured here for the rows that are imported official checkpoints
    (:mod:`patchword.imports.published`): per published result of the method, backbone and dataset the
    checkpoint was trained for, its row, the row's measured figures and their difference."""
    rows, notes = [], []
    for e in filter(lambda e: e.runs, entries):
        model = imported_model(_json(e.runs[0] / IMPORT_FILE))
        # the data config the evaluation read: which split its recorded role is, which data lay there
        data = read_run_config(e.runs[0]).data if model is not None else None
        for published in model.published() if model is not None else []:
            measured = measured_metrics(e.summaries[0], published.dataset)
            what = DATASETS[published.dataset] + (f", {published.variant}" if published.variant else "")
            for row in compare_rows(published, measured):
                signed = row["row"] == "difference"
                cells = [
                    "" if row[k] is None else f"{row[k]:+.1f}" if signed else f"{row[k]:.1f}" for k in KEYS
                ]
                source = published.source if row["row"] == "published" else ""
                rows.append([e.label, what, row["row"], *cells, source])
            notes += [
                f"{e.label}, {what}: {text}" for text in caveats(published, e.summaries[0], data, model)
            ]
    if not rows:
        return None
    caption = (
        "Published (paper / official README, as printed) vs measured here, for imported official "
        "checkpoints; difference = measured - published"
    )
    if notes:
        caption += "; NOT LIKE FOR LIKE: " + "; ".join(notes)
    return caption, ["run", "published result", "row", *KEYS, "source"], rows


def _index_sizes(entries: list[Entry], indexes: tuple[Path, ...]) -> dict[str, float]:
    """Row label -> bytes per image of the search index built from that row's run (``--index``)."""
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
        sizes[owner.label] = per_image
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
    tables = _tables(entries, _index_sizes(entries, indexes), galleries)
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
        atomic_write_text(csv, csv_text(entries))
    return out
