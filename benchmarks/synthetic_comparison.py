"""Measured comparison on the synthetic scenes: global baseline, LAPS, SEPS code/paper, dense pairing.

Every model trains on the same data, from the same seed, for the same number of optimiser steps (the
first ``--warmup`` of them train only the global embeddings, which the fine-grained heads then start
from), and is evaluated on the same 1000-image test split. Writes a markdown table and a JSON file.

    python benchmarks/synthetic_comparison.py --out-dir runs/comparison --steps 800 --warmup 400
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from patchword.config import apply_overrides
from patchword.demo import DEMO_OVERRIDES
from patchword.train.config import RunConfig
from patchword.train.run import prepare_data, train_run

MODELS = {
    "vse (global, CLS)": ["model.matcher=vse", "data.dense=false"],
    "laps (code)": ["model.matcher=laps", "model.variant=code", "data.dense=false"],
    "seps code, image-tied dense": ["model.matcher=seps", "model.variant=code", "model.dense_pairing=image"],
    "seps code, caption-tied dense (official protocol, LEAKY)": [
        "model.matcher=seps",
        "model.variant=code",
        "model.dense_pairing=caption",
    ],
    "seps paper, image-tied dense": [
        "model.matcher=seps",
        "model.variant=paper",
        "model.dense_pairing=image",
    ],
}
KEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("runs/comparison"))
    parser.add_argument("--steps", type=int, default=800, help="optimiser steps per model")
    parser.add_argument("--warmup", type=int, default=400, help="global warm-up steps (all models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", help="subset of model labels (substring match)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_flush_denormal(True)
    base = [o for o in DEMO_OVERRIDES if not o.startswith(("name=", "model.", "train.time_budget_s"))]
    common = [
        *base,
        f"output_dir={args.out_dir}",
        f"seed={args.seed}",
        f"train.max_steps={args.steps}",
        f"train.global_warmup_steps={args.warmup}",
        "train.eval_every=0",
        "model.embed_dim=128",
    ]
    data_cache: dict[bool, object] = {}
    results = {}
    for i, (label, overrides) in enumerate(MODELS.items()):
        if args.only and not any(s in label for s in args.only):
            continue
        cfg = apply_overrides(RunConfig(), [*common, f"name=m{i}", *overrides])
        data = data_cache.setdefault(cfg.data.dense, prepare_data(cfg.data))
        t0 = time.perf_counter()
        summary = train_run(cfg, data=data)
        summary["wall_seconds"] = time.perf_counter() - t0
        results[label] = summary
        (args.out_dir / "comparison.json").write_text(json.dumps(results, indent=2))
    lines = ["| model | " + " | ".join(KEYS) + " | train s | eval s |", "|" + "---|" * (len(KEYS) + 3)]
    for label, s in results.items():
        cells = " | ".join(f"{s[k]:.1f}" for k in KEYS)
        lines.append(f"| {label} | {cells} | {s['train_seconds']:.0f} | {s['eval_seconds']:.0f} |")
    oracle = next(iter(results.values())).get("oracle_rsum")
    if oracle is not None:
        lines.append(f"| oracle bound of the split | | | | | | | {oracle:.1f} | | |")
    table = "\n".join(lines)
    (args.out_dir / "comparison.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
