"""What a model costs beside what it scores, for ``patchword report``: the cost columns of a row, the
accuracy-vs-cost Pareto front and the figure (the CSV: :mod:`patchword.experiments.report_csv`).

A row's cost comes from the ``"cost"`` entry its evaluation recorded (:func:`patchword.eval.protocol.
evaluation_cost`: scoring time of the exhaustive matrix, pairs/s, peak memory (MiB), device, CPU, threads),
its parameters and, for a trained run, its training time, labelled with the machine its sessions trained on
(:mod:`patchword.experiments.machines`). Times are comparable only on one machine and rSum only on one test
gallery (dataset, split, size) under one protocol: rows are grouped by :func:`machine_of`, :func:`gallery_of`
and :func:`is_leaky`, and the Pareto front is drawn within each group, never across. A row whose runs were
evaluated on different machines is not averaged as one (its times read "mixed"), and it or one whose runs
scored different galleries is on no front; a row trained on several machines shows no steps/s.

Functions take the report's rows (``patchword.experiments.entries.Entry``: ``label``, ``runs``, ``planned``
(the seeds a sweep set out to run) and ``missing`` (those not finished), ``summaries`` (one record per run,
``{}`` for a run not evaluated, its fields checked), ``galleries``, ``datasets``, ``scored`` and ``uses``
(per run), ``seeds_differ`` (config keys whose values differ between the row's runs), ``value(key)`` ->
(mean, std) or None, ``first(key)``) without importing them; what is keyed per row is keyed by the row
itself (``id(row)``), never by its label.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from patchword.experiments.cost_caption import caption_flags
from patchword.experiments.fields import LIST, MAPPING, TEXT, check_fields
from patchword.experiments.machines import (
    machine_of,
    mixed_machines,
    mixed_training,
    run_machines,
    train_machine_of,
)
from patchword.experiments.rows import (
    evaluated,
    galleries_of,
    is_incomplete,
    is_leaky,
    mixed_galleries,
    one_or_mixed_of,
    row_label,
    significant,
    split_use,
)
from patchword.experiments.sweep import mean_std
from patchword.readers import read_json
from patchword.search.store import dead_row_bytes

__all__ = [
    "GALLERY_PAIRS",
    "cost_rows",
    "evaluated",
    "gallery_of",
    "index_bytes_per_image",
    "is_incomplete",
    "is_leaky",
    "machine_of",
    "mixed_machines",
    "pareto_front",
    "plot_accuracy_cost",
    "row_label",
    "seconds_per_gallery",
    "significant",
    "split_use",
]

#: The gallery the scoring time is quoted for: 1K images x 5K captions (Flickr30K / COCO 1K test).
GALLERY_PAIRS = 1000 * 5000


def seconds_per_gallery(entry) -> tuple[float, float] | None:
    """Scoring seconds of a 1K x 5K exhaustive matrix (mean, std over the row's runs), scaled from the
    recorded time and pair count: None without an exhaustive scoring time, and for a row whose runs were
    timed on different machines (never averaged)."""
    if mixed_machines(entry):
        return None
    values = []
    for summary in entry.summaries:
        cost = summary.get("cost") if isinstance(summary.get("cost"), dict) else {}
        if not cost.get("scoring_seconds") or not cost.get("pairs"):
            return None
        values.append(cost["scoring_seconds"] * GALLERY_PAIRS / cost["pairs"])
    return mean_std(values) if values else None


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """For (accuracy, cost) points, whether each is on the front: no other point is at least as accurate
    and at most as costly while better in one of the two. Ties (equal points) are all on it."""
    on = []
    for i, (acc, cost) in enumerate(points):
        dominated = any(
            a >= acc and c <= cost and (a > acc or c < cost) for j, (a, c) in enumerate(points) if j != i
        )
        on.append(not dominated)
    return on


def gallery_of(entry) -> str | None:
    """The test gallery a row's rSum was measured on (rSum is comparable only on one): the split scored,
    its size and the data (:func:`patchword.experiments.galleries.gallery_of_run` of its evaluated runs);
    ``MIXED:`` and each with its run count where they differ; None for a row without an evaluation."""
    return one_or_mixed_of(galleries_of(entry), None)


def _group(entry) -> str:
    """Rows ranked against each other: one machine (times), one test gallery and one protocol (rSum)."""
    return f"{machine_of(entry)}; {gallery_of(entry)}" + ("; LEAKY" if is_leaky(entry) else "")


def _fronts(entries) -> dict[int, bool]:
    """``id(row)`` -> on the Pareto front of rSum vs 1K x 5K seconds among the rows of its machine, gallery
    and protocol (rows with a mixed machine or an unknown one, or mixed galleries, are on none)."""
    groups: dict[str, list] = {}
    for entry in entries:
        known = machine_of(entry) != "unknown" and not mixed_galleries(entry)
        if entry.value("rsum") and seconds_per_gallery(entry) and known:
            groups.setdefault(_group(entry), []).append(entry)
    front = {}
    for members in groups.values():
        points = [(e.value("rsum")[0], seconds_per_gallery(e)[0]) for e in members]
        front.update({id(e): on for e, on in zip(members, pareto_front(points), strict=True)})
    return front


def index_bytes_per_image(index_dir: Path) -> tuple[str, float]:
    """(the run the search index was built from, its bytes on disk per image, dead shard rows left out)."""
    path = index_dir / "manifest.json"
    manifest = read_json(path, "search index manifest", expect=dict)
    check_fields(manifest, {"model": MAPPING, "model.run_dir": TEXT, "entries": LIST}, str(path))
    images = len(manifest.get("entries") or [])
    size = sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file()) - dead_row_bytes(index_dir)
    return str((manifest.get("model") or {}).get("run_dir") or ""), size / max(images, 1)


def _fmt(value: tuple[float, float] | None, n: int, digits: int = 1) -> str:
    if value is None:
        return ""
    mean, std = value
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def _memory_cell(entry, n: int, growth_key: str, peak_key: str) -> str:
    """Peak MiB of the scoring itself (``growth_key``: the peak over what the process held at its start,
    comparable between a training process, which holds its optimizer state and gradients, and a fresh
    ``patchword eval``); for records without it (older files, a system that cannot reset the host's peak),
    the process's peak (``peak_key``), marked (process): never one figure over both kinds."""
    growth = _fmt(entry.value(growth_key), n, 0)
    if growth:
        return growth
    peak = _fmt(entry.value(peak_key), n, 0)
    return peak + " (process)" if peak else ""


def _search_cell(entry, n: int) -> str:
    """A two-stage search's recorded seconds (``cost.search_seconds``: encoding, shortlist and re-ranking
    over its own gallery, not scaled: its cost does not grow as an exhaustive matrix's), "mixed" for a row
    timed on several machines, empty for an exhaustive row."""
    value = entry.value("cost.search_seconds")
    if value is None:
        return ""
    return "mixed" if mixed_machines(entry) else significant(value, n)


def _scaled_up(entry) -> bool:
    cost = entry.first("cost")
    return isinstance(cost, dict) and bool(cost.get("pairs")) and cost["pairs"] < GALLERY_PAIRS


def _measured_cells(entry, on_front: bool) -> list[str]:
    """s / 1K x 5K (marked), pairs/s, peak device and host MiB: "mixed" for a row timed on several
    machines (one figure over them would describe none)."""
    if mixed_machines(entry):
        return ["mixed"] * 4
    n = len(entry.runs)
    marks = (" †" if _scaled_up(entry) else "") + (" ★" if on_front else "")
    return [
        significant(seconds_per_gallery(entry), n) + marks,
        _fmt(entry.value("cost.pairs_per_s"), n, 0),
        _memory_cell(entry, n, "cost.peak_device_growth_mb", "cost.peak_device_mb"),
        _memory_cell(entry, n, "cost.peak_host_growth_mb", "cost.peak_host_rss_mb"),
    ]


def _precisions(entry) -> str:
    """ ", fp32" (each precision the row's runs were scored in), and the dtype of weights other than
    float32 (``precision=fp64``: ", fp32, float64 weights")."""
    found = {s["cost"].get("precision") for s in entry.summaries if isinstance(s.get("cost"), dict)}
    weights = {s.get("model_dtype") for s in entry.summaries} - {None, "float32"}
    return "".join(f", {p}" for p in sorted(found - {None}, key=str)) + "".join(
        f", {w} weights" for w in sorted(weights, key=str)
    )


def _params(entry) -> str:
    """Parameters in millions, total / trainable, to three significant digits (a 4K-parameter model is
    0.00400, not 0.00)."""
    params, trainable = entry.value("params_total"), entry.value("params_trainable")
    if not params or not trainable:
        return ""
    return f"{significant(params[0] / 1e6)} / {significant(trainable[0] / 1e6)}"


def cost_rows(entries, index_sizes: dict[int, float]) -> tuple[str, list[str], list[list[str]]]:
    """The cost table: (caption, header, rows); ``index_sizes``: ``id(row)`` -> bytes per image of its
    index (keyed by the row, never by its label: two rows may share a directory name)."""
    front = _fronts(entries)
    machines = {m for e in entries for m in run_machines(e)} - {"unknown"}
    galleries = {g for e in entries for g in galleries_of(e)}  # every evaluated run, known machine or not
    rows = []
    for e in entries:
        n = len(e.runs)
        rows.append(
            [
                row_label(e),
                _fmt(e.value("rsum"), n),
                *_measured_cells(e, bool(front.get(id(e)))),
                _search_cell(e, n),
                _params(e),
                significant(e.value("train_seconds"), n),
                "mixed" if mixed_training(e) else significant(e.value("train_steps_per_s"), n),
                train_machine_of(e),
                f"{index_sizes[id(e)]:,.0f}" if id(e) in index_sizes else "",
                machine_of(e) + _precisions(e) if any(e.summaries) else "",  # none: nothing was measured
            ]
        )
    caption = (
        "Cost (s / 1K x 5K: the exhaustive matrix's scoring time scaled to 1000 images x 5000 captions, "
        "three significant digits; "
        "† scaled up from a smaller gallery, where fixed costs weigh more; ★ on the Pareto front of rSum "
        "against it among the rows of one machine, one test gallery and one protocol (leaky or leak-free); "
        "peak device and host memory: the scoring's own, its high-water mark over what the process held "
        "at its start (a training process holds its optimizer state and gradients), or the process's "
        "whole peak where marked (process); memory in MiB; train s and steps/s: on the train machine, "
        "each training session's device and threads, not the evaluation's)"
    )
    if any(e.value("cost.search_seconds") for e in entries):
        caption += (
            "; two-stage search s: a shortlist search's recorded time (encoding, shortlist and re-ranking "
            "over its own gallery), never scaled to 1K x 5K (its cost does not grow as a matrix's)"
        )
    caption += caption_flags(entries, machines, galleries)
    header = [
        "run",
        "rsum",
        "s / 1K x 5K",
        "pairs/s",
        "peak device MiB",
        "peak host MiB",
        "two-stage search s",
        "params M (total / trainable)",
        "train s",
        "train steps/s",
        "train machine",
        "index bytes/image",
        "machine, precision",
    ]
    return caption, header, rows


def plot_accuracy_cost(entries, out: Path) -> Path | None:
    """rSum against 1K x 5K scoring seconds (log scale), one point per row, one marker per machine, test
    gallery and protocol, the Pareto front of each drawn as a step line; None without matplotlib or without
    a point."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    from patchword.experiments.plots import save_figure

    front = _fronts(entries)
    placed = [e for e in entries if id(e) in front]
    if not placed:
        return None
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    markers = "os^Dv<>p"
    for m, group in enumerate(sorted({_group(e) for e in placed})):
        members = [e for e in placed if _group(e) == group]
        xs = [seconds_per_gallery(e)[0] for e in members]
        ys = [e.value("rsum")[0] for e in members]
        # a group's label names every data setting of its gallery: wrapped, it stays below the axes' width
        ax.scatter(xs, ys, marker=markers[m % len(markers)], label=textwrap.fill(group, 100))
        for e, x, y in zip(members, xs, ys, strict=True):
            ax.annotate(row_label(e), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        best = sorted((x, y) for e, x, y in zip(members, xs, ys, strict=True) if front[id(e)])
        if len(best) > 1:
            ax.step([p[0] for p in best], [p[1] for p in best], where="post", linestyle="--", alpha=0.6)
    ax.set_xscale("log")
    # "test rSum" only where every point is one: a dev-split row's legend entry names its split
    held_out = not any(split_use(e) for e in placed)
    ylabel = "test rSum" if held_out else "rSum of each row's split (see legend)"
    ax.set(xlabel="scoring seconds per 1K x 5K (log)", ylabel=ylabel, title="accuracy vs cost")
    # Below the axes: a group's label (machine; gallery) is long and inside it would hide points and ticks.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.set_layout_engine("constrained")
    save_figure(fig, out)
    return out
