"""Which exact SEPS formulation is fastest on a GPU, and where a training step spends its time (issue 34).

The engine's cost model (``SEPSEngine._form``) was measured on a CPU. On a GPU this script times each
formulation forced (``gram``, ``direct``, ``kdirect``) on the Flickr30K shape (1000 x 5000, ViT-B/16
shapes, SEPS code variant, image- and caption-tied dense text), then scores the COCO 5K shape with the
fastest one, and profiles one training step (ViT-B/16 + BERT-base, batch 64, bf16 autocast). Every line is
printed as soon as it exists; ``--json`` writes them all.

    PYTHONPATH=src python3 benchmarks/gpu_formulations.py --device cuda --json $OUT/formulations.json
    .venv/bin/python benchmarks/gpu_formulations.py --device cpu --quick     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "src", ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(n_img: int, n_txt: int):
    from patchword.bench.inputs import scoring_inputs, stand_in_lengths

    cap_lens, dense_lens = stand_in_lengths()
    reps = (n_img + dense_lens.numel() - 1) // dense_lens.numel()
    img, caps, lens, dense, dlens, t2i = scoring_inputs(n_img, cap_lens.repeat(reps), dense_lens.repeat(reps))
    return img, caps[:n_txt], lens[:n_txt], dense, dlens, t2i[:n_txt]


def time_scoring(config: str, inputs, formulation: str, device, tf32: bool = False) -> tuple[float, object]:
    """Seconds of ``score_matrix`` with the formulation forced, inputs on the device (and the matrix)."""
    import torch

    from patchword.bench.inputs import build_bench_matcher
    from patchword.eval import score_matrix
    from patchword.eval.engine import SEPSEngine

    matcher = build_bench_matcher(config).to(device)
    img, caps, lens, dense, dlens, t2i = inputs
    t2i = t2i if matcher.dense_pairing == "caption" else None
    engine = SEPSEngine(matcher, formulation=formulation)
    warm_t2i = None if t2i is None else t2i[:10]
    score_matrix(
        matcher, img[:2], caps[:10], lens[:10], dense[:2], dlens[:2], txt2img=warm_t2i, engine=engine
    )
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        _sync(device)
        start = time.perf_counter()
        sims = score_matrix(matcher, img, caps, lens, dense, dlens, txt2img=t2i, engine=engine, device=device)
        _sync(device)
        return time.perf_counter() - start, sims
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def profile_step(device, quick: bool) -> dict:
    """One training step of ddp_bench's gpu-step setting under torch.profiler: top ops by device time."""
    import argparse as _argparse

    import ddp_bench
    from torch.profiler import ProfilerActivity, profile

    args = _argparse.Namespace(
        device=str(device),
        tf32=False,
        quick=quick,
        model="seps-vit-b16-code",
        pair_chunk=0,
        precision="amp_bf16",
        compile=False,
        batch=8 if quick else 64,
        warmup=3,
        steps=10,
        sync_debug=False,
        unfused=False,
    )
    timed = ddp_bench.gpu_step(args)  # prints its JSON
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    args.steps, args.warmup = 3, 1
    with profile(activities=activities) as prof:
        ddp_bench.gpu_step(args)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=25)
    print(table, flush=True)
    events = prof.key_averages()
    calls = {e.key: e.count for e in events}
    syncs = {k: v for k, v in calls.items() if "Synchronize" in k or "_local_scalar_dense" in k}
    launches = sum(v for k, v in calls.items() if k in ("cudaLaunchKernel", "cudaLaunchKernelExC"))
    return {"steps_per_s": timed["steps_per_s"], "syncs_in_profile": syncs, "kernel_launches": launches}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-coco", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")

    f30k = (40, 200) if args.quick else (1000, 5000)
    coco = (80, 400) if args.quick else (5000, 25000)
    host = _inputs(*f30k)
    inputs = [t.to(device) for t in host]
    best = {}
    for config in ("seps-code-image", "seps-code-caption"):
        times, ref, results = {}, None, {}
        for form in ("gram", "direct", "kdirect"):
            seconds, sims = time_scoring(config, inputs, form, device)
            ref = sims if ref is None else ref
            times[form], results[form] = seconds, sims
            record(
                {
                    "config": config,
                    "shape": "f30k",
                    "formulation": form,
                    "seconds": seconds,
                    "max_abs_diff_vs_gram": float((sims - ref).abs().max()),
                }
            )
        best[config] = min(times, key=times.get)
        seconds, sims = time_scoring(config, inputs, best[config], device, tf32=True)
        record(
            {
                "config": config,
                "shape": "f30k",
                "formulation": best[config],
                "tf32": True,
                "seconds": seconds,
                "max_abs_diff_vs_fp32": float((sims - results[best[config]]).abs().max()),
            }
        )
    del inputs
    try:
        record({"step_profile": profile_step(device, args.quick)})
    except Exception as err:  # noqa: BLE001 - report and go on: the scoring rows matter more
        record({"step_profile": f"failed: {err!r}"})
    if not args.skip_coco:
        inputs = [t.to(device) for t in _inputs(*coco)]
        for config in ("seps-code-caption", "seps-code-image"):
            seconds, _ = time_scoring(config, inputs, best[config], device)
            record({"config": config, "shape": "coco5k", "formulation": best[config], "seconds": seconds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
