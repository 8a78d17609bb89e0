"""Markdown tables of the benchmark results (what docs/benchmarks.md quotes)."""

from __future__ import annotations

from typing import Any

from patchword.bench.inputs import F30K_CAPTIONS, F30K_IMAGES
from patchword.eval.two_stage import APPROXIMATE_BACKENDS

__all__ = ["format_duration", "format_scoring", "format_two_stage"]


def format_duration(seconds: float) -> str:
    """``42 s``, ``11.6 min`` or ``3.3 h``: the unit that keeps the number readable."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_scoring(result: dict[str, Any]) -> str:
    """Markdown table of :func:`~patchword.bench.scoring.run_scoring` results, one row per config.

    The engine's GFLOP/s percentage is of the larger of the two peak measurements (start and end of the
    run). A "peak" below the engine's rate (a matmul too small to reach the machine's peak, ``--peak-size``)
    is no ceiling: no percentage is shown for it, and a line under the table says why. The Flickr30K times
    are extrapolated from the time per pair of the (far fewer) pairs timed: their column says so (``~``),
    and a line under the table says from how many pairs. The peak RSS growth measured in a fresh process
    (``engine_rss_growth_mb``, the first config's; absent with ``--no-rss``) is a line under the table too.
    The peak tensor memory is metered on the engine run with one worker and the whole budget (its plan:
    ``peak_tensor_plan``), not on the timed engine, whose workers split the budget (``plan``).
    """
    peak = max(result["peak_gflops"], result.get("peak_gflops_end", 0.0))
    above_peak = []
    lines = [
        "| config | engine us/pair | reference us/pair | speed-up "
        "| GFLOP/s engine / reference (engine % of peak) | MFLOP/pair engine / reference "
        "| peak tensor MiB (one worker, whole budget) "
        "| F30K 1000x5000 engine / reference (extrapolated) | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    timed, rss = {}, []
    for name, e in result["configs"].items():
        if "engine_rss_growth_mb" in e:  # None: the probe failed (logged)
            growth = e["engine_rss_growth_mb"]
            rss.append(f"{name}: " + ("the probe failed" if growth is None else f"{growth:.0f} MiB"))
        gflops = f"{e['engine_gflops']:.1f} / {e['reference_gflops']:.1f}"
        if peak > 0 and e["engine_gflops"] <= peak:
            gflops += f" ({100 * e['engine_gflops'] / peak:.0f}%)"
        else:
            gflops += " (above the measured peak)"
            above_peak.append(name)
        f30k = f"~{format_duration(e['f30k_engine_s'])} / ~{format_duration(e['f30k_reference_s'])}"
        lines.append(
            f"| {name} | {e['engine_us_per_pair']:.1f} | {e['reference_us_per_pair']:.0f} | "
            f"**{e['speedup']:.1f}x** | {gflops} | "
            f"{e['engine_mflop_per_pair']:.1f} / {e['reference_mflop_per_pair']:.1f} | "
            f"{e['engine_peak_tensor_mb']:.0f} | {f30k} | {e['max_abs_diff_vs_reference']:.1e} |"
        )
        if "extrapolated_from_pairs" in e:
            pairs = e["extrapolated_from_pairs"]
            timed[(pairs["engine"], pairs["reference"])] = True
    if above_peak:
        lines += [
            "",
            f"The fp32 matmul peak measured ({peak:.2f} GFLOP/s) is below the engine's rate in "
            f"{', '.join(above_peak)}: that matmul was too small to reach the machine's peak (a larger "
            "--peak-size measures it), so no % of peak is shown there.",
        ]
    if timed:
        counts = "; ".join(f"{engine:,} (engine) and {ref:,} (reference)" for engine, ref in timed)
        lines += [
            "",
            f"F30K times (~) are extrapolated to its {F30K_IMAGES * F30K_CAPTIONS:,} pairs from the time per "
            f"pair of the pairs timed: {counts}.",
        ]
    if rss:
        lines += ["", f"Peak RSS growth of the engine's call in a fresh process: {'; '.join(rss)}."]
    return "\n".join(lines)


def _k_used(row: dict[str, Any], model: dict[str, Any]) -> str:
    """The shortlist length a two-stage row used in each direction: its recorded ``k_used``, or (a result
    file older than that field) ``k`` clipped to the candidates of each direction (the test captions for
    i2t, the test images for t2i); ``i2t / t2i`` when they differ, ``all`` for the exhaustive row."""
    k = row["k"]
    if k is None:
        return "all"
    used = row.get("k_used")
    if used is not None:
        i2t, t2i = used["i2t"], used["t2i"]
    else:
        i2t = min(k, model.get("test_captions") or k)
        t2i = min(k, model.get("test_images") or k)
    return str(i2t) if i2t == t2i else f"{i2t} / {t2i}"


def format_two_stage(result: dict[str, Any]) -> str:
    """Markdown table of :func:`~patchword.bench.two_stage.run_two_stage` results, one row per method, then
    the first-stage backend (an approximate one marked) and, when a k asked for exceeds the candidates of a
    direction, that the k shown is the one used (each row's ``k_used``; i2t / t2i when they differ)."""
    model = result.get("model") or {}
    lines = [
        "| method | k | alpha | pairs scored | seconds | speed-up | rSum | delta rSum | i2t R@1 | t2i R@1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    clipped = []
    for r in result["rows"]:
        used = _k_used(r, model)
        if r["k"] is not None and used != str(r["k"]):
            clipped.append(r["k"])
        lines.append(
            f"| {r['method']} | {used} | {r['alpha']:g} | {r['pairs']:,} | {r['seconds']:.1f} | "
            f"{r.get('speedup', 1.0):.1f}x | {r['rsum']:.1f} | {r.get('rsum_delta', 0.0):+.1f} | "
            f"{r['i2t_r1']:.1f} | {r['t2i_r1']:.1f} |"
        )
    backend = result.get("backend")
    if backend is None:
        lines += ["", "First stage: not recorded (a result file older than the backend field)."]
    elif backend in APPROXIMATE_BACKENDS:
        lines += [
            "",
            f"First stage: {backend} (APPROXIMATE: a shortlist may miss candidates the exact one holds, so "
            "rSum is not the exact two-stage search's).",
        ]
    elif backend == "exact":
        lines += ["", "First stage: exact (matrix product and top-k)."]
    else:
        lines += ["", f"First stage: {backend} (exact)."]
    if clipped:
        asked = ", ".join(str(k) for k in dict.fromkeys(clipped))
        counts = (model.get("test_captions"), model.get("test_images"))
        candidates = (
            f"{counts[0]} test captions for i2t, {counts[1]} test images for t2i; " if all(counts) else ""
        )
        lines.append(
            f"k is the shortlist length used, clipped to the candidates each direction ranks ({candidates}"
            f"i2t / t2i where they differ): k = {asked} were asked for."
        )
    return "\n".join(lines)
