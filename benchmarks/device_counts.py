"""What exhaustive scoring and a training step cost on an accelerator, counted on the CPU (issue 34).

On a GPU the time of the scoring engine is set by how many ops it launches, how often the host waits for
the device (a sync) and how much it copies, not by its arithmetic (a COCO 5K matrix is ~1 PFLOP, ~15 s at
the fp32 peak of one H100/H200). All three can be counted without a GPU: the job runs on the simulated
device of :mod:`patchword.testing.simulated_device`; ``--dry`` (the default) walks real-size shapes with
meta tensors (no arithmetic: seconds for COCO 5K), ``--real`` computes on the CPU (small shapes only).

Commands (docs/benchmarks.md, "GPU"):

    .venv/bin/python benchmarks/device_counts.py scoring --json counts.json
    .venv/bin/python benchmarks/device_counts.py scoring --shapes f30k --configs laps --real --images 8
    .venv/bin/python benchmarks/device_counts.py step --batches 64,128
    .venv/bin/python benchmarks/device_counts.py pairs

``scoring`` prints, per SEPS/LAPS configuration and shape (Flickr30K 1000 x 5000, COCO 5K 5000 x 25000,
ViT-B/16 shapes): op calls, op calls per million pairs, host syncs, host<->device bytes, blocks. ``--images
N`` scores the first N images against every caption (ops grow linearly with images: the full count is then
extrapolated, and said to be). ``step`` counts one SEPS training step of the matcher (forward + backward of
the in-batch B x B pairs and the contrastive loss) at ViT-B/16 + BERT-base token shapes. ``pairs``
counts the default ``score_pairs`` (the re-ranking of SCAN, NAAF, VSE, FILIP and CLIP) on a small real
shape, inputs on the host and on the device (the bounds ``tests/eval/test_gpu_path_syncs.py`` asserts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from patchword.bench.device_work import DeviceWork, modelled_seconds  # noqa: E402
from patchword.bench.inputs import (  # noqa: E402
    SCORING_CONFIGS,
    SCORING_SHAPES,
    VIT_DIM,
    VIT_PATCHES,
    build_bench_matcher,
    stand_in_lengths,
)
from patchword.testing.simulated_device import SimulatedDevice  # noqa: E402

SHAPES = SCORING_SHAPES


def _lengths(n_img: int, n_txt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Caption and dense lengths of the stand-in distribution (medians 15 and 114), tiled to the shape."""
    cap_lens, dense_lens = stand_in_lengths()
    reps = math.ceil(n_img / dense_lens.numel())
    return cap_lens.repeat(reps)[:n_txt], dense_lens.repeat(reps)[:n_img]


def count_scoring(
    config: str,
    n_img: int,
    n_txt: int,
    *,
    images: int | None,
    dry: bool,
    budget_mb: float,
    work: bool = False,
):
    """Counts of ``score_matrix`` for ``config`` at (n_img, n_txt) on the simulated device, host inputs;
    with ``work`` also its bytes, FLOPs and modelled H100 time (:mod:`patchword.bench.device_work`)."""
    from patchword.eval import score_matrix

    spec = SCORING_CONFIGS[config]
    scored = min(n_img, images or n_img)
    cap_lens, dense_lens = _lengths(n_img, n_txt)
    txt2img = torch.arange(n_txt) // (n_txt // n_img)
    empty = torch.empty if dry else torch.randn  # dry: never read, so never allocated (lazy pages)
    img = empty(scored, VIT_PATCHES + 1, VIT_DIM)
    caps = empty(n_txt, int(cap_lens.max()), VIT_DIM)
    dense = dlens = None
    if spec["dense"]:
        n_dense = n_img if spec["dense_pairing"] == "caption" else scored
        dense, dlens = empty(n_dense, int(dense_lens.max()), VIT_DIM), dense_lens[:n_dense]
    caption_tied = spec["dense_pairing"] == "caption"
    matcher = build_bench_matcher(config)
    sim = SimulatedDevice(dry=dry)
    with sim:
        sim.to_device(matcher)
        sim.reset()  # the matcher's weights are not part of the job
        start = time.perf_counter()
        from patchword.eval.engine import engine_for

        engine = engine_for(matcher)
        recorder = DeviceWork()
        with recorder if work else contextlib.nullcontext():
            score_matrix(
                matcher,
                img,
                caps,
                cap_lens,
                dense,
                dlens,
                txt2img=txt2img if caption_tied and spec["dense"] else None,
                max_memory_mb=budget_mb,
                device=sim.device,
                engine=engine,
                progress=False,
            )
        seconds = time.perf_counter() - start
    counts = sim.counts
    plan = engine.last_plan
    image_blocks = math.ceil(scored / plan.image_block)
    text_blocks = plan.details.get("text_blocks", math.ceil(n_txt / plan.text_block))
    pairs = scored * n_txt
    scale = n_img / scored
    input_bytes = sum(t.numel() * t.element_size() for t in (img, caps, dense) if t is not None)
    row = {
        "config": config,
        "images": n_img,
        "captions": n_txt,
        "images_scored": scored,
        "extrapolated": scored < n_img,
        "ops": round(counts.ops * scale),
        "ops_per_million_pairs": counts.ops / pairs * 1e6,
        "host_syncs": round(counts.syncs * scale),
        "h2d_bytes": counts.h2d_bytes,
        "input_bytes": input_bytes,
        "d2h_bytes": round(counts.d2h_bytes * scale),
        "image_block": plan.image_block,
        "text_block": plan.text_block,
        "blocks": round(image_blocks * text_blocks * scale),
        "syncs_per_block": counts.syncs / max(1, image_blocks * text_blocks),
        "budget_mb": budget_mb,
        "walk_s": round(seconds, 1),
        "top_sync_sites": counts.sync_sites.most_common(4),
    }
    if work:
        ops = recorder.ops
        row["modelled_s"] = modelled_seconds(ops) * scale
        row["modelled_us_per_pair"] = modelled_seconds(ops) / pairs * 1e6
        row["kb_per_pair"] = sum(op.bytes for op in ops) / pairs / 1e3
        row["mflop_per_pair"] = sum(op.flops for op in ops) / pairs / 1e6
        row["top_sites"] = [[site, round(1e3 * sec * scale, 1)] for site, *_, sec in recorder.by_site()[:5]]
    return row


def step_work(batch: int, name: str, fused: bool = True, precision: str = "amp_bf16") -> dict:
    """Bytes, FLOPs and modelled H100 kernel time of one training step (encoders, ShardLoss, backward,
    gradient clipping, AdamW) of ``name`` at batch ``batch``, computed on the CPU under ``precision``
    (``amp_bf16``: bf16 autocast; ``bf16``: the bfloat16 copy with float32 master weights, gradients moved
    to them and the copy refreshed after the step, as the trainer does).

    The CPU's autocast policy stands in for CUDA's (both cast matrix products to bf16 and keep layer norm
    and softmax in fp32); attention runs the CPU's SDPA kernels, not cuDNN's. Real arithmetic: about a
    minute at ViT-B/16 + BERT-base, batch 64, on 2 cores. The optimizer's state is created by a first step
    outside the count. ``fused=False`` undoes the fused query/key/value projections of the Hugging Face
    backbones (:mod:`patchword.encoders.fused`) to count the step as transformers writes it."""
    import ddp_bench  # beside us: the gpu-step setting

    from patchword.precision import autocast_context

    torch.manual_seed(0)
    setting = argparse.Namespace(device="cpu", quick=False, model=name, batch=batch, unfused=not fused)
    setting.__dict__.update(precision=precision, pair_chunk=0, compile=False)
    model, cfg, loss_module, optimizer, shard, bf16 = ddp_bench.step_setup(setting)
    for p in model.parameters():  # the optimizer's state, made before the counted step
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    recorder = DeviceWork()
    start = time.perf_counter()
    with recorder:
        with autocast_context(precision, torch.device("cpu")):
            loss, _ = loss_module(shard, True, False, 1.0)
        forward_ops = len(recorder.ops)
        loss.backward()
        ddp_bench.optimizer_step(model, cfg, optimizer, bf16)
    ops = recorder.ops
    return {
        "model": name,
        "batch": batch,
        "precision": precision,
        "fused_qkv": fused,
        "ops": len(ops),
        "forward_ops": forward_ops,
        "gb": sum(op.bytes for op in ops) / 1e9,
        "tflop": sum(op.flops for op in ops) / 1e12,
        "modelled_ms": 1e3 * modelled_seconds(ops),
        "modelled_ms_forward": 1e3 * modelled_seconds(ops[:forward_ops]),
        "by_op": [
            [f"{k[0]} {k[1]}", n, round(b / 1e9, 2), round(1e3 * sec, 2)]
            for k, n, b, _, sec in recorder.by_op()[:15]
        ],
        "walk_s": round(time.perf_counter() - start, 1),
    }


def count_step(batch: int, *, dry: bool) -> dict:
    """Counts of one training step of the SEPS matcher (code variant, image-tied dense text): forward of
    the in-batch (B, B) pairs at ViT-B/16 + BERT-base token shapes, the contrastive loss, backward."""

    matcher = build_bench_matcher("seps-code-image").train()
    cap_lens, dense_lens = _lengths(batch, 5 * batch)
    lens, dlens = cap_lens[::5][:batch].clamp(max=40), dense_lens[:batch]
    g = torch.Generator().manual_seed(0)
    img = torch.randn(batch, VIT_PATCHES + 1, VIT_DIM, generator=g)
    caps = torch.randn(batch, int(lens.max()), VIT_DIM, generator=g)
    dense = torch.randn(batch, int(dlens.max()), VIT_DIM, generator=g)
    sim = SimulatedDevice(dry=dry)
    with sim:
        sim.to_device(matcher)
        args = [sim.to_device(t) for t in (img, caps, lens, dense, dlens)]
        args[0].requires_grad_(True)
        sim.reset()
        start = time.perf_counter()
        sims = matcher(*args).sims  # (B, B)
        loss = (sims.diagonal()[:, None] - sims + 0.2).clamp_min(0).sum()  # hinge: the step's shape
        loss.backward()
        seconds = time.perf_counter() - start
    counts = sim.counts
    return {
        "batch": batch,
        "pairs": batch * batch,
        "ops": counts.ops,
        "ops_per_pair": counts.ops / (batch * batch),
        "host_syncs": counts.syncs,
        "h2d_bytes": counts.h2d_bytes,
        "d2h_bytes": counts.d2h_bytes,
        "walk_s": round(seconds, 1),
        "top_sync_sites": counts.sync_sites.most_common(4),
        "top_ops": counts.op_names.most_common(6),
    }


def count_pairs(name: str, on_device: bool, n_img: int = 24, n_txt: int = 120, n_pairs: int = 480) -> dict:
    """Syncs, copies back and the upload ratio (bytes uploaded / the inputs' bytes) of the default
    ``score_pairs`` for matcher ``name`` (embedding width 16) on ``n_pairs`` random pairs, computed."""
    from patchword.eval.engine import engine_for
    from patchword.eval.engine.core import prepare_inputs
    from patchword.matching import build_matcher

    torch.manual_seed(1)
    matcher = build_matcher(name, embed_dim=16).eval()
    gen = torch.Generator().manual_seed(0)
    img = torch.randn(
        n_img, 8 if name in ("scan", "naaf") else 9, 16, generator=gen
    )  # region / CLS + patches
    caps = torch.randn(n_txt, 9, 16, generator=gen)
    lens = torch.randint(3, 10, (n_txt,), generator=gen)
    pairs = (
        torch.randint(0, n_img, (n_pairs,), generator=gen),
        torch.randint(0, n_txt, (n_pairs,), generator=gen),
    )
    sim = SimulatedDevice()
    with sim:
        sim.to_device(matcher)
        place = sim.to_device if on_device else (lambda t: t)
        inputs = prepare_inputs(matcher, place(img), place(caps), place(lens), None, None, None)
        index = tuple(place(p) for p in pairs)
        sim.reset()
        engine_for(matcher).score_pairs(inputs, *index, budget=64 << 20, device=sim.device)
    inputs_bytes = (img.numel() + caps.numel()) * 4 + lens.numel() * 8
    return {
        "matcher": name,
        "inputs": "device" if on_device else "host",
        "shape": f"{n_img} images, {n_txt} texts, {n_pairs} pairs",
        "syncs": sim.counts.syncs,
        "d2h_copies": sim.counts.d2h_copies,
        "upload_ratio": round(sim.counts.h2d_bytes / inputs_bytes, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_sc = sub.add_parser("scoring", help="op, sync and copy counts of exhaustive scoring")
    p_sc.add_argument("--shapes", default="f30k,coco5k")
    p_sc.add_argument("--configs", default=",".join(SCORING_CONFIGS))
    p_sc.add_argument("--images", type=int, default=None, help="score only the first N images (extrapolated)")
    p_sc.add_argument(
        "--budget-mb",
        type=float,
        default=32768,
        help="the engine budget: the default on an H100 or H200 (half the free memory, at most 32 GiB)",
    )
    mode = p_sc.add_mutually_exclusive_group()
    mode.add_argument("--dry", dest="dry", action="store_true", default=True)
    mode.add_argument("--real", dest="dry", action="store_false", help="compute on the CPU (small shapes)")
    p_sc.add_argument("--work", action="store_true", help="also bytes, FLOPs and the modelled H100 time")
    p_sw = sub.add_parser("step-work", help="bytes, FLOPs and modelled H100 time of one training step")
    p_sw.add_argument("--batches", default="64")
    p_sw.add_argument("--model", default="seps-vit-b16-paper")
    p_sw.add_argument("--unfused", action="store_true", help="query/key/value as three products")
    p_sw.add_argument("--precision", default="amp_bf16", choices=["amp_bf16", "bf16"])
    p_st = sub.add_parser("step", help="op, sync and copy counts of one matcher training step")
    p_st.add_argument("--batches", default="64,128")
    p_st.add_argument("--real", action="store_true", help="compute on the CPU instead of a dry walk")
    p_pa = sub.add_parser("pairs", help="sync and copy counts of the default score_pairs (small, computed)")
    p_pa.add_argument("--matchers", default="scan,naaf,vse,filip,clip")
    for p in (p_sc, p_st, p_sw, p_pa):
        p.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    if args.command == "scoring":
        options = {"images": args.images, "dry": args.dry, "budget_mb": args.budget_mb, "work": args.work}
        for shape in args.shapes.split(","):
            for config in args.configs.split(","):
                row = count_scoring(config, *SHAPES[shape], **options)
                row["shape"] = shape
                rows.append(row)
                print(json.dumps(row), flush=True)
    elif args.command == "step-work":
        for batch in (int(b) for b in args.batches.split(",")):
            row = step_work(batch, args.model, fused=not args.unfused, precision=args.precision)
            rows.append(row)
            print(json.dumps(row), flush=True)
    elif args.command == "pairs":
        for name in args.matchers.split(","):
            for on_device in (False, True):
                rows.append(count_pairs(name, on_device))
                print(json.dumps(rows[-1]), flush=True)
    else:
        for batch in (int(b) for b in args.batches.split(",")):
            row = count_step(batch, dry=not args.real)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
