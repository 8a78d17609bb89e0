"""Re-ranking time of one caption against a shortlist, with every patch and pruned at index time.

    python benchmarks/pruned_rerank.py --run /work/scale/run --keep 0.75 0.625 0.5625 --out benchmarks/results

The run is a SEPS model at ViT-B/16 shapes (``benchmarks/scale_search.py`` writes one: 197 image tokens of
512 dimensions); the images are random tokens pruned with ``patchword.search.pruning.prune_patches`` (what
``index build --keep-patches`` stores) and a precomputed dense score per image (``--dense-store scores``).
Each repetition scores the shortlist once per variant (interleaved, so drifts hit every variant alike); the
median is printed and written with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from patchword.bench.machine import machine_description
from patchword.eval.engine.core import engine_for, prepare_inputs
from patchword.runs import load_run
from patchword.search.pruning import prune_patches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--keep", type=float, nargs="+", default=[0.75, 0.625, 0.5625])
    parser.add_argument("--shortlist", type=int, default=50)
    parser.add_argument("--caption-len", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    matcher = load_run(args.run).model.matcher
    cfg = matcher.config
    g = torch.Generator().manual_seed(0)
    images = torch.randn(args.shortlist, cfg.num_patches + int(cfg.has_cls), cfg.embed_dim, generator=g)
    caption = torch.randn(1, args.caption_len, cfg.embed_dim, generator=g)
    lens = torch.tensor([args.caption_len])
    dense_scores = torch.randn(args.shortlist, generator=g)
    variants = {"every patch": (images, None)}
    for fraction in args.keep:
        kept = math.ceil(cfg.num_patches * fraction)
        pruned = prune_patches(engine_for(matcher), images, kept, device="cpu")
        variants[f"keep {fraction} ({kept} patches)"] = (pruned.tokens, pruned.prior)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats + 2):
        for name, (tokens, prior) in variants.items():
            out = torch.empty(args.shortlist, 1)
            start = time.perf_counter()
            inputs = prepare_inputs(
                matcher,
                tokens,
                caption,
                lens,
                None,
                None,
                None,
                image_constants=dense_scores,
                patch_prior=prior,
            )
            engine_for(matcher).score(inputs, out, budget=256 << 20, device="cpu", progress=False)
            times[name].append(time.perf_counter() - start)
    medians = {name: 1e3 * statistics.median(t[2:]) for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{name}: {ms:.1f} ms")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            "shortlist": args.shortlist,
            "caption_len": args.caption_len,
            "num_patches": cfg.num_patches,
            "median_ms": medians,
            "machine": machine_description(),
        }
        (args.out / "pruned_rerank.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
