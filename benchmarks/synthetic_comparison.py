"""Measured comparison on the synthetic scenes: global baseline, LAPS, SEPS code/paper, dense pairing.

One global warm-up run trains the encoders for ``--warmup`` steps (the demo recipe's first phase, the
VSE objective: CLS vs mean of the caption words). Every model then starts from those weights
(``train.init_from``; the fine-grained heads start from their initialisation) and trains for the same
``--steps`` optimiser steps on the same batches (same seed), and is evaluated on the same 1000-image test
split. The VSE row simply continues the global training for the same number of steps, so every row has
seen the same number of batches. Writes ``comparison.md`` and ``comparison.json`` to ``--out-dir``.

    python benchmarks/synthetic_comparison.py --out-dir runs/comparison --warmup 1000 --steps 170
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import torch

from patchword.config import apply_overrides
from patchword.demo import DEMO_OVERRIDES
from patchword.train.config import RunConfig
from patchword.train.run import prepare_data, train_run

MODELS = {
    "vse (global, CLS)": ["model.matcher=vse"],
    "laps (code)": ["model.matcher=laps", "model.seps.variant=code"],
    "seps code, image-tied dense": [
        "model.matcher=seps",
        "model.seps.variant=code",
        "model.seps.dense_pairing=image",
    ],
    "seps code, caption-tied dense (official protocol, LEAKY)": [
        "model.matcher=seps",
        "model.seps.variant=code",
        "model.seps.dense_pairing=caption",
    ],
    "seps paper, image-tied dense": [
        "model.matcher=seps",
        "model.seps.variant=paper",
        "model.seps.dense_pairing=image",
    ],
}
KEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"]


def _common(args: argparse.Namespace) -> list[str]:
    # The demo's data, model size, lr, precision and negatives; no time budget (a fixed step count).
    skip = ("name=", "model.matcher", "model.seps.variant", "model.seps.dense_pairing", "train.time_budget_s")
    base = [o for o in DEMO_OVERRIDES if not o.startswith(skip)]
    return [
        *base,
        f"output_dir={args.out_dir}",
        f"seed={args.seed}",
        f"train.num_threads={args.threads}",
        "train.eval_every=0",
        "progress=false",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("runs/comparison"))
    parser.add_argument("--warmup", type=int, default=1000, help="shared global warm-up steps")
    parser.add_argument("--steps", type=int, default=170, help="optimiser steps per model after the warm-up")
    parser.add_argument(
        "--lr-drop-after", type=int, default=100, help="lr x0.3 after this many steps (as the demo's end)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--only", nargs="*", help="subset of model labels (substring match)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_flush_denormal(True)
    common = _common(args)
    data = prepare_data(apply_overrides(RunConfig(), common).data)

    warm_dir = args.out_dir / "warmup"
    if not (warm_dir / "last.pt").is_file():
        warm = apply_overrides(
            RunConfig(),
            [
                *common,
                "name=warmup",
                "model.matcher=vse",
                f"train.max_steps={args.warmup}",
                "train.lr_milestone_steps=[]",
            ],
        )
        t0 = time.perf_counter()
        warm_summary = train_run(warm, data=data)
        warm_summary["wall_seconds"] = time.perf_counter() - t0
        (warm_dir / "warmup_summary.json").write_text(json.dumps(warm_summary, indent=2))
    warm_summary = json.loads((warm_dir / "warmup_summary.json").read_text())

    results_path = args.out_dir / "comparison.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for i, (label, overrides) in enumerate(MODELS.items()):
        if args.only and not any(s in label for s in args.only):
            continue
        cfg = apply_overrides(
            RunConfig(),
            [
                *common,
                f"name=m{i}",
                *overrides,
                f"train.init_from={warm_dir / 'last.pt'}",
                f"train.max_steps={args.steps}",
                f"train.lr_milestone_steps=[{args.lr_drop_after}]",
                "train.global_warmup_steps=0",
                "train.align_warmup_epochs=0",  # the warm-up already was the ramp
            ],
        )
        t0 = time.perf_counter()
        summary = train_run(cfg, data=data)
        summary["wall_seconds"] = time.perf_counter() - t0
        results[label] = summary
        results_path.write_text(json.dumps(results, indent=2))

    lines = [
        f"Warm-up: {args.warmup} global steps, {warm_summary['train_seconds']:.0f} s, test rSum of the "
        f"warm-up model itself {warm_summary['rsum']:.1f}. Then {args.steps} steps per model (lr x0.3 "
        f"after {args.lr_drop_after}). "
        f"Machine: {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s).",
        "",
        "| model | " + " | ".join(KEYS) + " | train s | eval s |",
        "|" + "---|" * (len(KEYS) + 3),
    ]
    for label in MODELS:
        if label not in results:
            continue
        s = results[label]
        cells = " | ".join(f"{s[k]:.1f}" for k in KEYS)
        lines.append(f"| {label} | {cells} | {s['train_seconds']:.0f} | {s['eval_seconds']:.0f} |")
    oracle = warm_summary.get("oracle_rsum")
    if oracle is not None:
        lines.append(f"| oracle bound of the split | | | | | | | {oracle:.1f} | | |")
    table = "\n".join(lines)
    (args.out_dir / "comparison.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
