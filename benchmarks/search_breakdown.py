"""Where one search's time goes: query encoding, first stage, reading + decoding the shortlist, scoring.

    python benchmarks/search_breakdown.py --index /work/scale/index-1000000 --run /work/scale/run

In-process (no HTTP), one query at a time, ``--queries`` different queries after ``--warmup`` ones; the
shortlisted rows are read from the shards as a server reads them (memory-mapped: a row not in the page
cache is a disk read). Prints the median of each part and writes them with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from patchword.bench.machine import machine_description
from patchword.eval.engine.core import engine_for, prepare_inputs
from patchword.search.query import Searcher

WORDS = "a an the red blue green large small dog cat man woman child car tree street water grass".split()  # noqa: SIM905


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--shortlist", type=int, default=None, help="images re-ranked (default: search's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    options = {} if args.shortlist is None else {"shortlist": args.shortlist}
    searcher = Searcher.open(args.index, run_dir=args.run, **options)
    index, fine = searcher.index, searcher.fine
    parts: dict[str, list[float]] = {k: [] for k in ("encode", "shortlist", "read", "score", "total")}
    rng = np.random.default_rng(0)
    for q in range(args.warmup + args.queries):
        text = " ".join(rng.choice(WORDS, 5))
        t0 = time.perf_counter()
        query = searcher.encode_query(text)
        t1 = time.perf_counter()
        _, ids = searcher.global_index.search(query.global_embedding, searcher.shortlist)
        ids = ids[0]
        t2 = time.perf_counter()
        index.prefetch(ids)  # as Searcher.rerank reads them
        img = index.image_tokens(ids)
        dense = index.dense_tokens(ids) if searcher.use_dense else None
        scores = index.dense_scores(ids) if searcher.use_dense else None
        prior = index.patch_priors(ids)  # an index pruned at build time
        t3 = time.perf_counter()
        inputs = prepare_inputs(
            fine,
            img,
            query.tokens,
            query.lens,
            *(dense if dense is not None else (None, None)),
            None,
            image_constants=scores,
            patch_prior=prior,
        )
        out = torch.empty(img.shape[0], 1)
        engine = engine_for(fine)
        engine.workers = 1  # as Searcher.rerank
        engine.score(inputs, out, budget=searcher.budget, device="cpu", progress=False)
        t4 = time.perf_counter()
        if q >= args.warmup:
            for name, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0), strict=True):
                parts[name].append(value * 1e3)
    medians = {name: statistics.median(values) for name, values in parts.items()}
    record = {
        "index": str(args.index),
        "images": len(index),
        "backend": searcher.backend,
        "shortlist": searcher.shortlist,
        "dense": index.dense_store if searcher.use_dense else None,
        "median_ms": medians,
        "machine": machine_description(),
    }
    print(json.dumps(record, indent=2))
    if args.out:
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
