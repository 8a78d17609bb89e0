"""How long one batch query of the synthetic scenes' fits oracle takes (the false-negative mask of a batch).

:class:`patchword.data.synthetic.FitsOracle` answers a B x B query of captions against images in one
vectorised kernel call (``tests/datasets/test_synthetic.py`` checks that it is one call and equals the full
matrix); what that call costs depends on the machine, so it is measured here rather than asserted in the tests
(it was a `< 20 ms` verdict there until issue 36). Command:

    .venv/bin/python benchmarks/fits_oracle_speed.py [--batch 128] [--images 1000] [--repeats 20] [--json F]

Prints the median, minimum and maximum seconds of ``--repeats`` queries of ``--batch`` random captions
against ``--batch`` random images of a ``--images``-image test split (seeded), after one warm-up query.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from patchword.data.synthetic import SyntheticConfig, generate_split  # noqa: E402


def measure(batch: int, images: int, repeats: int, seed: int = 2) -> dict:
    split = generate_split(SyntheticConfig(num_test=images), "test")
    oracle = split.oracle
    n_captions, n_images = oracle.shape
    rng = np.random.default_rng(seed)
    cap, img = rng.integers(0, n_captions, batch), rng.integers(0, n_images, batch)
    oracle(cap, img)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        oracle(cap, img)
        times.append(time.perf_counter() - start)
    return {
        "batch": batch,
        "images": n_images,
        "captions": n_captions,
        "repeats": repeats,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "machine": platform.processor() or platform.machine(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = measure(args.batch, args.images, args.repeats)
    print(
        f"{args.batch} x {args.batch} fits query on {result['images']} images / {result['captions']} "
        f"captions: median {result['median_s'] * 1e3:.2f} ms (min {result['min_s'] * 1e3:.2f}, "
        f"max {result['max_s'] * 1e3:.2f}, {args.repeats} repeats)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
