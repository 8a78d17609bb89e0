"""Step c of ``benchmarks/gpu_check.py``: exhaustive SEPS scoring at Flickr30K and COCO-5K shapes on a device.

The workload is ``ddp_bench.py gpu-scoring``'s (``patchword.bench.inputs``: ViT-B/16-224 tokens, stand-in
caption and dense lengths), timed with the inputs already on the device and given from the host (the
upload is then part of the time), and checked against the official per-caption loop on a slice.
"""

from __future__ import annotations

import time

#: (config, shape) in the order they run: the image-tied cases first, each shape small before large.
CASES = [
    ("seps-code-image", "f30k"),
    ("seps-code-image", "coco5k"),
    ("seps-code-caption", "f30k"),
    ("seps-code-caption", "coco5k"),
]
#: A caption-tied case not measured yet is predicted from the image-tied one at this ratio (the CPU
#: benchmark's 199.8 vs 138.8 µs/pair, docs/benchmarks.md).
CAPTION_TIED_COST = 1.5


def memory_argument(call) -> float | None:
    """Call ``call(max_memory_mb)`` with None (the engine's automatic accelerator budget) and return None,
    or, where ``score_matrix`` does not accept None, with 16384 MiB and return that."""
    try:
        call(None)
        return None
    except (TypeError, ValueError) as err:
        if "max_memory_mb" not in str(err):
            raise
    call(16384)
    return 16384


def run_scoring(args, budget, partial, say) -> dict:
    """Score every case of :data:`CASES` that the budget holds; -> ``{"rows": [...], "summary": ...}``."""
    import torch

    from patchword.bench.inputs import (
        SCORING_SHAPES,
        scoring_inputs,
        stand_in_lengths,
    )

    device = torch.device(args.device)
    shapes = dict(SCORING_SHAPES)
    if args.quick:
        shapes = {"f30k": (16, 80), "coco5k": (40, 200)}
    cap_lens, dense_lens = stand_in_lengths()
    inputs: dict[str, tuple] = {}
    per_pair: dict[str, float] = {}  # config -> measured engine seconds per pair, inputs on the device
    generate_rate = None  # host input generation, floats per second
    rows: list[dict] = []
    for config, shape in CASES:
        n_img, n_txt = shapes[shape]
        floats = n_img * 197 * 512 + n_txt * 80 * 512 + n_img * 128 * 512
        prep = 0.0 if shape in inputs or generate_rate is None else floats / generate_rate
        rate = per_pair.get(config)
        if rate is None and per_pair:
            rate = CAPTION_TIED_COST * per_pair["seps-code-image"]

        host_too = shape in getattr(args, "host_shapes", "f30k,coco5k").split(",")

        def kinds_for(
            rate: float, prep: float = prep, pairs: int = n_img * n_txt, host_too=host_too
        ) -> list[str]:
            """Both input placements (where ``--host-shapes`` names the shape), the device-resident one
            alone, or none: what the budget holds."""
            one = 1.2 * rate * pairs + 2.0  # + the official loop's slice
            free = budget.free("scoring") - prep
            return ["device", "host"] if host_too and 2 * one <= free else ["device"] if one <= free else []

        label = f"scoring {config} {shape} {n_img}x{n_txt}"
        skipped = {"config": config, "shape": shape, "status": "skipped (budget)"}
        if rate is not None and not kinds_for(rate):
            need, free = 1.2 * rate * n_img * n_txt + prep, budget.free("scoring")
            say(f"{label}: skipped, ~{need:.0f} s needed (inputs on the device alone), {free:.0f} s free")
            rows.append(skipped)
            partial({"rows": rows})
            continue
        if shape not in inputs:
            start = time.perf_counter()
            reps = (n_img + dense_lens.numel() - 1) // dense_lens.numel()
            img, caps, lens, dense, dlens, t2i = scoring_inputs(
                n_img, cap_lens.repeat(reps), dense_lens.repeat(reps)
            )
            inputs[shape] = (img, caps[:n_txt], lens[:n_txt], dense, dlens, t2i[:n_txt])
            generate_rate = floats / (time.perf_counter() - start)
        try:
            new = _score_case(config, shape, inputs[shape], rate, kinds_for, args, device, say)
        except torch.cuda.OutOfMemoryError as err:
            new = [{"config": config, "shape": shape, "status": f"out of memory: {str(err)[:200]}"}]
            say(f"{label}: {new[0]['status']}")
        rows += new or [skipped]
        if new and "seconds" in new[0]:
            per_pair[config] = new[0]["seconds"] / (n_img * n_txt)
        partial({"rows": rows})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows, "summary": _summary(rows)}


def _summary(rows: list[dict]) -> str:
    """One line: seconds per case (inputs on the device / from the host), speed-up and error vs the loop."""
    parts = []
    for r in rows:
        if "loop_us_per_pair" in r:
            host = r.get("host_seconds")
            seconds = f"{r['seconds']:.2f} s" + (f" (host {host:.2f} s)" if host is not None else "")
            parts.append(
                f"{r['config'].removeprefix('seps-code-')} {r['shape']} {seconds}, "
                f"{r['speedup_vs_loop']:.0f}x loop, diff {r['max_abs_diff_vs_loop']:.0e}"
            )
        elif "seconds" not in r:
            parts.append(f"{r['config'].removeprefix('seps-code-')} {r['shape']} {r.get('status')}")
    return "; ".join(parts) or "nothing measured"


def _score_case(config, shape, host, rate, kinds_for, args, device, say) -> list[dict]:
    """The rows of one (config, shape): engine on device-resident and host inputs, the loop's slice; the
    input placements ``kinds_for(seconds per pair)`` holds (``rate``, or timed on a slice when None)."""
    import torch

    from patchword.bench.inputs import build_bench_matcher
    from patchword.eval import score_matrix
    from patchword.testing import seps_reference_scores

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    img, caps, lens, dense, dlens, t2i = host
    n_img, n_txt = img.shape[0], caps.shape[0]
    matcher = build_bench_matcher(config).to(device)
    caption_tied = matcher.dense_pairing == "caption"
    txt2img = t2i if caption_tied else None
    on_device = [t.to(device) for t in host[:5]]
    warm = on_device[0][:2], on_device[1][:10], on_device[2][:10], on_device[3][:2], on_device[4][:2]
    warm_t2i = t2i[:10] if caption_tied else None  # captions 0-9 belong to images 0 and 1
    memory = memory_argument(
        lambda mm: score_matrix(matcher, *warm, txt2img=warm_t2i, max_memory_mb=mm, device=device)
    )
    sync()
    if rate is None:  # the first case: a slice of ~1% of the pairs says what the budget holds
        n_cal_img, n_cal_txt = min(n_img, 100), min(n_txt, 500)
        sizes = (n_cal_img, n_cal_txt, n_cal_txt, n_cal_img, n_cal_img)
        cal = [t[:n] for t, n in zip(on_device, sizes, strict=True)]
        start = time.perf_counter()
        cal_t2i = t2i[:n_cal_txt] if caption_tied else None
        score_matrix(matcher, *cal, txt2img=cal_t2i, max_memory_mb=memory, device=device)
        sync()
        rate = (time.perf_counter() - start) / (n_cal_img * n_cal_txt)
    kinds = kinds_for(rate)
    if not kinds:
        say(f"scoring {config} {shape}: skipped, {rate * 1e6:.2f} µs/pair on a slice is more than the budget")
        return []
    rows, sims = [], {}
    for kind in kinds:
        given = on_device if kind == "device" else host[:5]
        start = time.perf_counter()
        sims[kind] = score_matrix(matcher, *given, txt2img=txt2img, max_memory_mb=memory, device=device)
        sync()
        seconds = time.perf_counter() - start
        row = {"config": config, "shape": shape, "images": n_img, "captions": n_txt, "inputs": kind}
        row.update(seconds=seconds, pairs_per_s=n_img * n_txt / seconds, max_memory_mb=memory)
        rows.append(row)
        upload = " (upload included)" if kind == "host" else ""
        say(
            f"scoring {config} {shape} {n_img}x{n_txt}, inputs on the {kind}: {seconds:.2f} s, "
            f"{row['pairs_per_s']:.3g} pairs/s{upload}"
        )
    if len(sims) == 2:
        rows[0]["host_seconds"] = rows[1]["seconds"]
        rows[1]["max_abs_diff_vs_device_inputs"] = float((sims["host"] - sims["device"]).abs().max())
    # the official loop on a slice: the first images against captions spread over the whole set
    n_ref_img, n_ref_txt = min(args.ref_images, n_img), min(args.ref_captions, n_txt)
    cols = torch.arange(n_ref_txt) * (n_txt // n_ref_txt)
    d_img, d_caps, d_lens, d_dense, d_dlens = on_device
    if caption_tied:  # every caption's dense row is its image's, wherever that image is in the set
        ref_args = (d_caps[cols], d_lens[cols], d_dense, d_dlens)
        warm_args = ref_args
        index = t2i[cols].to(device)
    else:  # one dense row per image scored
        ref_args = (d_caps[cols], d_lens[cols], d_dense[:n_ref_img], d_dlens[:n_ref_img])
        warm_args = (d_caps[cols], d_lens[cols], d_dense[:2], d_dlens[:2])
        index = None
    seps_reference_scores(matcher, d_img[:2], *warm_args, dense_index=index)  # warm-up: 2 images
    sync()
    start = time.perf_counter()
    ref = seps_reference_scores(matcher, d_img[:n_ref_img], *ref_args, dense_index=index)
    sync()
    loop_per_pair = (time.perf_counter() - start) / ref.numel()
    first = rows[0]
    engine_per_pair = first["seconds"] / (n_img * n_txt)
    first.update(
        loop_slice=[n_ref_img, n_ref_txt],
        loop_us_per_pair=loop_per_pair * 1e6,
        engine_us_per_pair=engine_per_pair * 1e6,
        speedup_vs_loop=loop_per_pair / engine_per_pair,
        max_abs_diff_vs_loop=float((sims[first["inputs"]][:n_ref_img, cols] - ref.float().cpu()).abs().max()),
    )
    say(
        f"scoring {config} {shape}: official loop on {n_ref_img}x{n_ref_txt} {first['loop_us_per_pair']:.2f} "
        f"µs/pair vs engine {first['engine_us_per_pair']:.3f} µs/pair: {first['speedup_vs_loop']:.1f}x; "
        f"max |engine - loop| {first['max_abs_diff_vs_loop']:.2e}"
    )
    return rows


def scoring_table(rows: list[dict]) -> list[str]:
    """Markdown table of the scoring rows."""
    lines = [
        "| config | shape | inputs | seconds | pairs/s | engine µs/pair | loop µs/pair (slice) | speed-up "
        "| max abs diff vs loop |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "seconds" not in r:
            lines.append(f"| {r['config']} | {r['shape']} | - | {r.get('status', '')} | | | | | |")
            continue
        shape = f"{r['shape']} {r['images']}x{r['captions']}"
        extra = ["", "", "", ""]
        if "loop_us_per_pair" in r:
            extra = [
                f"{r['engine_us_per_pair']:.3f}",
                f"{r['loop_us_per_pair']:.2f} ({r['loop_slice'][0]}x{r['loop_slice'][1]})",
                f"{r['speedup_vs_loop']:.1f}x",
                f"{r['max_abs_diff_vs_loop']:.1e}",
            ]
        elif "max_abs_diff_vs_device_inputs" in r:
            extra[3] = f"vs device inputs: {r['max_abs_diff_vs_device_inputs']:.1e}"
        cells = [r["config"], shape, r["inputs"], f"{r['seconds']:.2f}", f"{r['pairs_per_s']:.3g}", *extra]
        lines.append("| " + " | ".join(cells) + " |")
    memory = next((r["max_memory_mb"] for r in rows if "max_memory_mb" in r), "?")
    lines += [
        "",
        f"max_memory_mb: {'None (automatic)' if memory is None else memory}; TF32 matmuls as found.",
    ]
    return lines
