"""Do an image encoder's patch tokens localise? Linear probes and patch-word grounding on synthetic scenes.

    python benchmarks/patch_probe.py --encoders synthetic-64 [--scenes simple|cluttered] [--out x.json]
    python benchmarks/patch_probe.py --encoders DIR            # a `patchword pretrain --out DIR`
    python benchmarks/patch_probe.py --random                 # the same tiny encoders, randomly initialised

For a trained run, `patchword eval RUN --suite patches` prints the same for the run's own encoders. What the
numbers mean: `patchword.eval.patch_probe`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from patchword.bench.machine import machine_description
from patchword.config import apply_overrides
from patchword.data.tokenizers.word import WordVocab
from patchword.eval.patch_probe import format_probe_table, synthetic_patch_probe
from patchword.model import build_model
from patchword.pretrained import resolve_pretrained_dir
from patchword.runs.config import RunConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoders", default="synthetic-64", help="shipped name or pretrain directory")
    parser.add_argument("--random", action="store_true", help="randomly initialised encoders (seed 0)")
    parser.add_argument("--scenes", default="simple", choices=("simple", "cluttered"))
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-test", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    directory = resolve_pretrained_dir(args.encoders)
    meta = json.loads((directory / "config.json").read_text())
    overrides = [
        f"model.embed_dim={meta['architecture']['embed_dim']}",
        f"data.synthetic_scenes={args.scenes}",
    ]
    if not args.random:
        overrides.append(f"model.tiny_pretrained={directory}")
    cfg = apply_overrides(RunConfig(), overrides)
    vocab = WordVocab.load(directory / "vocab.json")
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab_size=len(vocab))
    start = time.perf_counter()
    result = synthetic_patch_probe(
        model, cfg.data.synthetic_config(), vocab, num_train=args.num_train, num_test=args.num_test
    )
    result.update(
        encoders="random init" if args.random else str(args.encoders),
        scenes=args.scenes,
        seconds=round(time.perf_counter() - start, 1),
        machine=machine_description(),
    )
    print(format_probe_table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
