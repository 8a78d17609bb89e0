"""Equal-budget comparison on the synthetic scenes: every matcher fine-tuned from the same pretrained
encoders.

Every model starts from the shipped pretrained tiny encoders (``model.tiny_pretrained=synthetic-64``, the
demo's starting point; the matcher heads start from their initialisation), trains for the demo's step count
on the same batches (same seed, the demo's recipe), and is evaluated on the same 1000-image test split:
recall, the compositional suite (hard negatives that change one fact), and for patch-selecting matchers
how many object patches the selection keeps. Writes ``comparison.md`` and ``comparison.json`` to
``--out-dir`` (rows already there are kept, so an interrupted comparison continues).

    python benchmarks/synthetic_comparison.py --out-dir runs/comparison          # make compare
    python benchmarks/synthetic_comparison.py --out-dir runs/cmp-simple \
        model.tiny_pretrained=synthetic-64 data.vocab_path=synthetic-64 data.synthetic_scenes=simple

Overrides after the options replace the demo's (other encoders, other scenes).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from patchword.bench.machine import machine_description
from patchword.data.prepare import prepare_data
from patchword.demo import demo_config
from patchword.eval.compositional import format_compositional_comparison
from patchword.eval.runs import evaluate_suite
from patchword.fileio import atomic_write_text
from patchword.train.runner import resume_run, train_run

MODELS = {
    "vse (global: CLS vs mean of words)": ["model.name=vse-tiny"],
    "laps (code)": ["model.name=laps-tiny"],
    "seps code, image-tied dense": ["model.seps.variant=code", "model.seps.dense_pairing=image"],
    "seps code, caption-tied dense (official protocol, LEAKY)": [
        "model.seps.variant=code",
        "model.seps.dense_pairing=caption",
    ],
    "seps paper, image-tied dense (the demo)": ["model.seps.variant=paper", "model.seps.dense_pairing=image"],
}
KEYS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"]
KINDS = ["attribute_swap", "relation_swap", "object_replace", "count_change"]


def _common(args: argparse.Namespace) -> list[str]:
    # the demo's encoders, also under another model.name (a named model replaces the model section)
    demo = demo_config(args.overrides)
    return [
        *args.overrides,
        f"model.tiny_pretrained={demo.model.tiny_pretrained}",
        f"output_dir={args.out_dir}",
        f"seed={args.seed}",
        f"train.num_threads={args.threads}",
        *([f"train.max_steps={args.steps}"] if args.steps else []),
        "progress=false",
    ]


def _table(results: dict, common: list[str]) -> str:
    cfg = demo_config(common)
    steps, encoders = cfg.train.max_steps, cfg.model.tiny_pretrained
    machine = machine_description()
    lines = [
        f"{steps} steps each from the pretrained encoders ({encoders}), {cfg.data.synthetic_scenes} scenes, "
        f"the demo's recipe, seed, batches; {machine['cpu']}, {machine['torch_threads']} thread(s), "
        f"torch {machine['torch']}.",
        "",
        "| model | " + " | ".join(KEYS) + " | selection recall / chance (caption) | train s |",
        "|" + "---|" * (len(KEYS) + 3),
    ]
    for label in MODELS:
        if label not in results:
            continue
        s = results[label]
        cells = " | ".join(f"{s[k]:.1f}" for k in KEYS)
        recall, chance = s.get("selection_object_recall", {}), s.get("selection_chance", {})
        sel = f"{recall['caption']:.1f} / {chance['caption']:.1f}" if "caption" in recall else "-"
        lines.append(f"| {label} | {cells} | {sel} | {s['train_seconds']:.0f} |")
    oracle = next((s["oracle_rsum"] for s in results.values() if "oracle_rsum" in s), None)
    if oracle is not None:
        lines.append("| oracle bound of the split | " + " | " * 6 + f"{oracle:.1f} | | |")
    suites = {
        label.split(" (")[0].split(",")[0] + (" (leaky)" if "LEAKY" in label else ""): s["compositional"]
        for label, s in results.items()
        if "compositional" in s
    }
    if suites:
        lines += [
            "",
            "Compositional suite (accuracy %, chance 50):",
            "",
            "```",
            format_compositional_comparison(suites),
            "```",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("runs/comparison"))
    parser.add_argument("--steps", type=int, default=0, help="steps per model (0: the demo's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--only", nargs="*", help="subset of model labels (substring match)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides on top of the demo's recipe")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_flush_denormal(True)
    common = _common(args)
    data = prepare_data(demo_config(common).data)
    results_path = args.out_dir / "comparison.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for i, (label, overrides) in enumerate(MODELS.items()):
        if label in results or (args.only and not any(s in label for s in args.only)):
            continue
        cfg = demo_config([*common, f"name=m{i}", *overrides])
        run_dir = args.out_dir / f"m{i}"
        t0 = time.perf_counter()
        if (run_dir / "summary.json").is_file():  # trained, but its row was not recorded yet
            summary = json.loads((run_dir / "summary.json").read_text())
        elif (run_dir / "last.pt").is_file():  # interrupted: continue it
            summary = resume_run(run_dir)
        else:
            summary = train_run(cfg, data=data)
        summary["wall_seconds"] = time.perf_counter() - t0
        summary["compositional"], _ = evaluate_suite(run_dir)
        results[label] = summary
        atomic_write_text(results_path, json.dumps(results, indent=2))
    table = _table(results, common)
    atomic_write_text(args.out_dir / "comparison.md", table + "\n")
    print(table)


if __name__ == "__main__":
    main()
