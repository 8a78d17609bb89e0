"""What a model costs beside what it scores, for ``patchword report``: the cost columns of a row, the
accuracy-vs-cost Pareto front, the figure and the CSV.

A row's cost comes from the ``"cost"`` entry its evaluation recorded (:func:`patchword.eval.protocol.
evaluation_cost`: scoring time of the exhaustive matrix, pairs/s, peak memory, device, CPU, threads), its
parameters and, for a trained run, its training time. Times are comparable only on one machine: rows are
grouped by :func:`machine_of` and the Pareto front is drawn within each group, never across.

Functions take the report's rows (``patchword.experiments.report.Entry``: ``label``, ``runs``,
``value(key)`` -> (mean, std) or None, ``first(key)``) without importing them.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from patchword.errors import DataError
from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.sweep import mean_std
from patchword.readers import read_json

__all__ = [
    "CSV_KEYS",
    "GALLERY_PAIRS",
    "cost_rows",
    "csv_text",
    "gallery_rows",
    "index_bytes_per_image",
    "machine_of",
    "pareto_front",
    "plot_accuracy_cost",
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


def machine_of(entry) -> str:
    """Where a row's times were measured: the device's name (a GPU's, or the CPU model), on a CPU the thread
    count, and the number of processes when several shared the evaluation; "unknown" for an evaluation that
    recorded no cost (written before it was recorded)."""
    cost = entry.first("cost")
    if not isinstance(cost, dict) or not cost.get("device_name"):
        return "unknown"
    processes = cost.get("world_size") or 1
    several = f", {processes} processes" if processes > 1 else ""
    if str(cost.get("device", "cpu")).startswith("cpu"):
        threads = cost.get("threads", "?")
        return f"{cost['device_name']}, {threads} thread{'' if threads == 1 else 's'}{several}"
    return str(cost["device_name"]) + several


def seconds_per_gallery(entry) -> tuple[float, float] | None:
    """Scoring seconds of a 1K x 5K exhaustive matrix (mean, std over the row's runs), scaled from the
    recorded time and pair count: None without an exhaustive scoring time."""
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


def gallery_of(entry) -> str:
    """The test gallery a row's rSum was measured on (rSum is comparable only on one): split and size."""
    return f"{entry.first('split') or '?'} {entry.first('images') or '?'} x {entry.first('captions') or '?'}"


def _group(entry) -> str:
    """Rows ranked against each other: one machine (times) and one test gallery (rSum)."""
    return f"{machine_of(entry)}; {gallery_of(entry)}"


def _fronts(entries) -> dict[str, bool]:
    """label -> on the Pareto front of rSum vs 1K x 5K seconds among the rows of its machine and gallery."""
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


def cost_rows(entries, index_sizes: dict[str, float]) -> tuple[str, list[str], list[list[str]]]:
    """The cost table: (caption, header, rows)."""
    front = _fronts(entries)
    machines = {machine_of(e) for e in entries} - {"unknown"}
    galleries = {gallery_of(e) for e in entries if machine_of(e) != "unknown"}
    rows = []
    for e in entries:
        n = len(e.runs)
        params = e.value("params_total")
        trainable = e.value("params_trainable")
        gallery = seconds_per_gallery(e)
        mark = "★" if front.get(e.label) else ""
        rows.append(
            [
                e.label,
                _fmt(e.value("rsum"), n),
                _fmt(gallery, n, 2) + (" †" if _scaled_up(e) else "") + (f" {mark}" if mark else ""),
                _fmt(e.value("cost.pairs_per_s"), n, 0),
                _fmt(e.value("cost.peak_device_mb"), n, 0),
                _fmt(e.value("cost.peak_host_rss_mb"), n, 0) + _host_scope(e),
                f"{params[0] / 1e6:.2f} / {trainable[0] / 1e6:.2f}" if params and trainable else "",
                _fmt(e.value("train_seconds"), n, 0),
                _fmt(e.value("train_steps_per_s"), n, 2),
                f"{index_sizes[e.label]:,.0f}" if e.label in index_sizes else "",
                machine_of(e)
                + (f", {e.first('cost').get('precision')}" if isinstance(e.first("cost"), dict) else ""),
            ]
        )
    caption = (
        "Cost (s / 1K x 5K: the exhaustive matrix's scoring time scaled to 1000 images x 5000 captions; "
        "† scaled up from a smaller gallery, where fixed costs weigh more; ★ on the Pareto front of rSum "
        "against it among the rows of one machine and one test gallery; peak host memory: the resident "
        "high-water mark during the evaluation, or since the process started where marked (process))"
    )
    if len(machines) > 1:
        caption += (
            f"; {len(machines)} MACHINES: times measured on different devices or CPUs are not comparable, "
            "each row is ranked only against the rows of its own machine"
        )
    if len(galleries) > 1:
        caption += (
            f"; {len(galleries)} TEST GALLERIES ({', '.join(sorted(galleries))}): rSum depends on the "
            "gallery, each row is ranked only against the rows measured on its own"
        )
    header = [
        "run",
        "rsum",
        "s / 1K x 5K",
        "pairs/s",
        "peak device MB",
        "peak host MB",
        "params M (total / trainable)",
        "train s",
        "train steps/s",
        "index bytes/image",
        "machine, precision",
    ]
    return caption, header, rows


def csv_text(entries) -> str:
    """One row per report row: label, seeds, machine, then the mean and std of every :data:`CSV_KEYS`
    figure and of the 1K x 5K scoring seconds (empty where a row lacks it)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    keys = [*CSV_KEYS, "seconds_per_1k_x_5k"]
    writer.writerow(["run", "seeds", "machine", *(f"{k}_{s}" for k in keys for s in ("mean", "std"))])
    for e in entries:
        row: list = [e.label, len(e.runs), machine_of(e)]
        for value in [*(e.value(k) for k in CSV_KEYS), seconds_per_gallery(e)]:
            row += ["", ""] if value is None else list(value)  # floats as repr: they read back equal
        writer.writerow(row)
    return out.getvalue()


def plot_accuracy_cost(entries, out: Path) -> Path | None:
    """rSum against 1K x 5K scoring seconds (log scale), one point per row, one marker per machine and test
    gallery, the Pareto front of each drawn as a step line; None without matplotlib or without a point."""
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
            ax.annotate(e.label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        best = sorted((x, y) for e, x, y in zip(members, xs, ys, strict=True) if front[e.label])
        if len(best) > 1:
            ax.step([p[0] for p in best], [p[1] for p in best], where="post", linestyle="--", alpha=0.6)
    ax.set_xscale("log")
    ax.set(xlabel="scoring seconds per 1K x 5K (log)", ylabel="test rSum", title="accuracy vs cost")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out)
    return out


def gallery_rows(path: Path) -> tuple[str, list[str], list[list[str]]]:
    """The table of a ``patchword bench gallery --json`` file: (caption, header, rows); extrapolated
    rows say so."""
    record = read_json(path, "gallery benchmark", expect=dict)
    needed = ("images", "captions", "seconds", "pairs_per_s", "peak_host_mb", "extrapolated")
    if record.get("kind") != "gallery" or not isinstance(record.get("rows"), list):
        raise DataError(f"{path}: not a `patchword bench gallery --json` file (kind {record.get('kind')!r})")
    for i, r in enumerate(record["rows"], start=1):
        missing = [k for k in needed if not isinstance(r, dict) or k not in r]
        if missing:
            raise DataError(f"{path}: row {i} lacks {', '.join(missing)}")
    rows = []
    for r in record.get("rows", []):
        measured = (
            "extrapolated from {:,} pairs".format(r.get("pairs_scored", 0))
            if r["extrapolated"]
            else "measured"
        )
        peak = r.get("peak_device_mb")
        rows.append(
            [
                f"{r['images']:,} x {r['captions']:,}",
                f"{r['seconds']:.1f}",
                f"{r['pairs_per_s']:,.0f}",
                ""
                if r["peak_host_mb"] is None
                else f"{r['peak_host_mb']:,.0f}"
                + ("" if r.get("peak_host_scope") == "shape" else " (process)"),
                "" if peak is None else f"{peak:,.0f}",
                measured,
            ]
        )
    machine = record.get("machine", {})
    caption = (
        f"Gallery scale ({path.name}: {record.get('config')}, device {record.get('device')}, "
        f"CPU {machine.get('cpu', '?')}, budget {record.get('max_memory_mb')} MiB)"
    )
    header = ["images x captions", "seconds", "pairs/s", "peak host MB", "peak device MB", ""]
    return caption, header, rows
