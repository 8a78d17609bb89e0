"""What a model costs beside what it scores, for ``patchword report``: the cost columns of a row, the
accuracy-vs-cost Pareto front, the figure and the CSV.

A row's cost comes from the ``"cost"`` entry its evaluation recorded (:func:`patchword.eval.protocol.
evaluation_cost`: scoring time of the exhaustive matrix, pairs/s, peak memory (MiB), device, CPU, threads),
its parameters and, for a trained run, its training time. Times are comparable only on one machine and rSum
only on one test gallery (dataset, split, size) under one protocol: rows are grouped by :func:`machine_of`,
:func:`gallery_of` and :func:`is_leaky`, and the Pareto front is drawn within each group, never across. A row
whose runs were evaluated on different machines is not averaged as one (its times read "mixed") and is on no
front.

Functions take the report's rows (``patchword.experiments.report.Entry``: ``label``, ``runs``, ``planned``
(the seeds a sweep set out to run), ``summaries`` (one record per run), ``value(key)`` -> (mean, std) or
None, ``first(key)``) without importing them.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.sweep import mean_std
from patchword.readers import read_json

__all__ = [
    "CSV_KEYS",
    "GALLERY_PAIRS",
    "cost_rows",
    "csv_text",
    "dataset_label",
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
]

#: The gallery the scoring time is quoted for: 1K images x 5K captions (Flickr30K / COCO 1K test).
GALLERY_PAIRS = 1000 * 5000

#: Numeric figures of a row in the CSV (mean and std columns each), in order; dotted keys reach into
#: the recorded evaluation (``cost.scoring_seconds``).
CSV_KEYS = (
    *RECALL_KEYS,
    "images",
    "captions",
    "cost.scoring_seconds",
    "cost.pairs_per_s",
    "cost.peak_device_mb",
    "cost.peak_host_rss_mb",
    "cost.threads",
    "params_total",
    "params_trainable",
    "train_seconds",
    "train_steps_per_s",
)


def _run_machine(summary) -> str:
    """Where one run's times were measured: the device's name (a GPU's, or the CPU model), on a CPU the
    thread count, and the number of processes when several shared the evaluation; "unknown" for an
    evaluation that recorded no cost (written before it was recorded)."""
    cost = summary.get("cost")
    if not isinstance(cost, dict) or not cost.get("device_name"):
        return "unknown"
    processes = cost.get("world_size") or 1
    several = f", {processes} processes" if processes > 1 else ""
    if str(cost.get("device", "cpu")).startswith("cpu"):
        threads = cost.get("threads", "?")
        return f"{cost['device_name']}, {threads} thread{'' if threads == 1 else 's'}{several}"
    return str(cost["device_name"]) + several


def _run_machines(entry) -> dict[str, int]:
    """machine -> how many of the row's runs were evaluated on it."""
    counts: dict[str, int] = {}
    for summary in entry.summaries:
        machine = _run_machine(summary)
        counts[machine] = counts.get(machine, 0) + 1
    return counts


def mixed_machines(entry) -> bool:
    """Whether the row's runs were evaluated on different machines (a recorded cost and none count as
    different): their times and memory are never averaged into one figure."""
    return len(_run_machines(entry)) > 1


def machine_of(entry) -> str:
    """Where a row's times were measured (see :func:`_run_machine`; "unknown" for a row without runs); a
    row whose runs were evaluated on different machines: ``MIXED:`` and each machine with its run count."""
    counts = _run_machines(entry)
    if len(counts) <= 1:
        return next(iter(counts), "unknown")
    return "MIXED: " + "; ".join(f"{m} ({n} run{'' if n == 1 else 's'})" for m, n in sorted(counts.items()))


def is_incomplete(entry) -> bool:
    """Seeds the row's sweep set out to run are not all finished: its figures are never shown as whole."""
    return len(entry.runs) < entry.planned


def is_leaky(entry) -> bool:
    """Whether a run of the row was scored with the caption-tied (leaky) dense protocol."""
    return any(summary.get("leaky") is True for summary in entry.summaries)


def row_label(entry) -> str:
    """The row's label with what makes its figures not like the others': LEAKY (the caption-tied dense
    protocol) and INCOMPLETE (a sweep variant with seeds still to run)."""
    marks = []
    if is_incomplete(entry):
        marks.append(f"INCOMPLETE, {len(entry.runs)} of {entry.planned} seeds")
    if is_leaky(entry):
        marks.append("LEAKY")
    return entry.label + (f" ({'; '.join(marks)})" if marks else "")


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


def dataset_label(data) -> str:
    """The test data a run was scored on, from its ``data`` config (a ``DataConfig``): a real dataset's
    reader and root directory; the synthetic scenes' preset, generator seed and image size."""
    if data.dataset in ("synthetic", "synthetic_regions"):
        scenes = f"{data.synthetic_scenes} scenes, seed {data.synthetic_seed}, {data.synthetic_image_size} px"
        return f"{data.dataset} ({scenes})"
    return f"{data.dataset} ({data.root})"


def gallery_of(entry) -> str:
    """The test gallery a row's rSum was measured on (rSum is comparable only on one): split and size, and
    the dataset (``"dataset"`` of its record, which the report fills from the run's config)."""
    dataset = entry.first("dataset")
    size = f"{entry.first('split') or '?'} {entry.first('images') or '?'} x {entry.first('captions') or '?'}"
    return f"{size} of {dataset}" if dataset else size


def _group(entry) -> str:
    """Rows ranked against each other: one machine (times), one test gallery and one protocol (rSum)."""
    return f"{machine_of(entry)}; {gallery_of(entry)}" + ("; LEAKY" if is_leaky(entry) else "")


def _fronts(entries) -> dict[str, bool]:
    """label -> on the Pareto front of rSum vs 1K x 5K seconds among the rows of its machine, gallery and
    protocol (rows with a mixed machine or an unknown one are on none)."""
    groups: dict[str, list] = {}
    for entry in entries:
        if entry.value("rsum") and seconds_per_gallery(entry) and machine_of(entry) != "unknown":
            groups.setdefault(_group(entry), []).append(entry)
    front = {}
    for members in groups.values():
        points = [(e.value("rsum")[0], seconds_per_gallery(e)[0]) for e in members]
        front.update({e.label: on for e, on in zip(members, pareto_front(points), strict=True)})
    return front


def index_bytes_per_image(index_dir: Path) -> tuple[str, float]:
    """(the run the search index was built from, its bytes on disk per indexed image)."""
    manifest = read_json(index_dir / "manifest.json", "search index manifest", expect=dict)
    images = len(manifest.get("entries", []))
    size = sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file())
    return str(manifest.get("model", {}).get("run_dir", "")), size / max(images, 1)


def _fmt(value: tuple[float, float] | None, n: int, digits: int = 1) -> str:
    if value is None:
        return ""
    mean, std = value
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"


def _host_scope(entry) -> str:
    """ " (process)" where a row's peak host memory is the process's since it started (a system that
    cannot reset it, or an evaluation recorded before it could)."""
    scopes = {
        s.get("cost", {}).get("peak_host_scope") for s in entry.summaries if isinstance(s.get("cost"), dict)
    }
    return "" if not scopes or scopes == {"evaluation"} else " (process)"


def _scaled_up(entry) -> bool:
    cost = entry.first("cost")
    return isinstance(cost, dict) and bool(cost.get("pairs")) and cost["pairs"] < GALLERY_PAIRS


def _measured_cells(entry, on_front: bool) -> list[str]:
    """s / 1K x 5K (marked), pairs/s, peak device and host MiB: "mixed" for a row timed on several
    machines (one figure over them would describe none)."""
    if mixed_machines(entry):
        return ["mixed"] * 4
    n = len(entry.runs)
    host = _fmt(entry.value("cost.peak_host_rss_mb"), n, 0)
    marks = (" †" if _scaled_up(entry) else "") + (" ★" if on_front else "")
    return [
        _fmt(seconds_per_gallery(entry), n, 2) + marks,
        _fmt(entry.value("cost.pairs_per_s"), n, 0),
        _fmt(entry.value("cost.peak_device_mb"), n, 0),
        host + (_host_scope(entry) if host else ""),
    ]


def _precisions(entry) -> str:
    """ ", fp32" (each precision the row's runs were scored in)."""
    found = {s["cost"].get("precision") for s in entry.summaries if isinstance(s.get("cost"), dict)}
    return "".join(f", {p}" for p in sorted(found - {None}, key=str))


def cost_rows(entries, index_sizes: dict[str, float]) -> tuple[str, list[str], list[list[str]]]:
    """The cost table: (caption, header, rows)."""
    front = _fronts(entries)
    machines = {m for e in entries for m in _run_machines(e)} - {"unknown"}
    galleries = {gallery_of(e) for e in entries if e.runs and machine_of(e) != "unknown"}
    rows = []
    for e in entries:
        n = len(e.runs)
        params = e.value("params_total")
        trainable = e.value("params_trainable")
        rows.append(
            [
                row_label(e),
                _fmt(e.value("rsum"), n),
                *_measured_cells(e, bool(front.get(e.label))),
                f"{params[0] / 1e6:.2f} / {trainable[0] / 1e6:.2f}" if params and trainable else "",
                _fmt(e.value("train_seconds"), n, 0),
                _fmt(e.value("train_steps_per_s"), n, 2),
                f"{index_sizes[e.label]:,.0f}" if e.label in index_sizes else "",
                machine_of(e) + _precisions(e) if e.runs else "",
            ]
        )
    caption = (
        "Cost (s / 1K x 5K: the exhaustive matrix's scoring time scaled to 1000 images x 5000 captions; "
        "† scaled up from a smaller gallery, where fixed costs weigh more; ★ on the Pareto front of rSum "
        "against it among the rows of one machine, one test gallery and one protocol (leaky or leak-free); "
        "peak host memory: the resident high-water mark during the evaluation, or since the process started "
        "where marked (process); memory in MiB)"
    )
    caption += _caption_flags(entries, machines, galleries)
    header = [
        "run",
        "rsum",
        "s / 1K x 5K",
        "pairs/s",
        "peak device MiB",
        "peak host MiB",
        "params M (total / trainable)",
        "train s",
        "train steps/s",
        "index bytes/image",
        "machine, precision",
    ]
    return caption, header, rows


def _caption_flags(entries, machines: set[str], galleries: set[str]) -> str:
    """What the cost caption must warn of: several machines or galleries, and the rows marked in it."""
    flags = ""
    if len(machines) > 1:
        flags += (
            f"; {len(machines)} MACHINES: times measured on different devices or CPUs are not comparable, "
            "each row is ranked only against the rows of its own machine"
        )
    if any(mixed_machines(e) for e in entries):
        flags += (
            "; MIXED: a row whose runs were evaluated on different machines: its times and memory are not "
            "averaged (each run's summary.json has its own) and it is on no front"
        )
    if len(galleries) > 1:
        flags += (
            f"; {len(galleries)} TEST GALLERIES [{'; '.join(sorted(galleries))}]: rSum depends on the "
            "gallery, each row is ranked only against the rows measured on its own"
        )
    if any(is_leaky(e) for e in entries):
        flags += (
            "; LEAKY: queries carry dense text generated from their own target image (official SEPS "
            "protocol), ranked only against other leaky rows"
        )
    if any(is_incomplete(e) for e in entries):
        flags += (
            "; INCOMPLETE: a sweep variant that stopped before all its seeds finished, its figures over the "
            "finished seeds only"
        )
    return flags


def csv_text(entries) -> str:
    """One row per report row: label, finished seeds, machine, planned seeds, whether all finished, protocol
    and dataset, then the mean and std of every :data:`CSV_KEYS` figure and of the 1K x 5K scoring seconds
    (empty where a row lacks it; the ``cost.`` figures also where the row's runs were evaluated on
    different machines)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    keys = [*CSV_KEYS, "seconds_per_1k_x_5k"]
    described = ["run", "seeds", "machine", "planned", "complete", "protocol", "dataset"]
    writer.writerow([*described, *(f"{k}_{s}" for k in keys for s in ("mean", "std"))])
    for e in entries:
        protocol = ("leaky" if is_leaky(e) else "leak-free") if e.runs else ""
        complete = "no" if is_incomplete(e) else "yes"
        row: list = [
            e.label,
            len(e.runs),
            machine_of(e) if e.runs else "",
            e.planned,
            complete,
            protocol,
            e.first("dataset") or "",
        ]
        mixed = mixed_machines(e)
        values = [None if mixed and k.startswith("cost.") else e.value(k) for k in CSV_KEYS]
        for value in [*values, seconds_per_gallery(e)]:
            row += ["", ""] if value is None else list(value)  # floats as repr: they read back equal
        writer.writerow(row)
    return out.getvalue()


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
    placed = [e for e in entries if e.label in front]
    if not placed:
        return None
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    markers = "os^Dv<>p"
    for m, group in enumerate(sorted({_group(e) for e in placed})):
        members = [e for e in placed if _group(e) == group]
        xs = [seconds_per_gallery(e)[0] for e in members]
        ys = [e.value("rsum")[0] for e in members]
        ax.scatter(xs, ys, marker=markers[m % len(markers)], label=group)
        for e, x, y in zip(members, xs, ys, strict=True):
            ax.annotate(row_label(e), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        best = sorted((x, y) for e, x, y in zip(members, xs, ys, strict=True) if front[e.label])
        if len(best) > 1:
            ax.step([p[0] for p in best], [p[1] for p in best], where="post", linestyle="--", alpha=0.6)
    ax.set_xscale("log")
    ax.set(xlabel="scoring seconds per 1K x 5K (log)", ylabel="test rSum", title="accuracy vs cost")
    # Below the axes: a group's label (machine; gallery) is long and inside it would hide points and ticks.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.set_layout_engine("constrained")
    save_figure(fig, out)
    return out
