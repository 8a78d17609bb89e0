"""How much of the exact shortlist the HNSW first stage finds (search above ``APPROXIMATE_ABOVE`` images).

    python benchmarks/hnsw_recall.py --sizes 200000 --dim 512 --queries 1000 --shortlist 100

The database is unit vectors drawn around cluster centres (a mixture of Gaussians on the sphere, like real
global embeddings, which crowd around topics; uniform random vectors are HNSW's worst case and nothing like
them), the queries are drawn the same way. For each size: graph build time, the mean share of the exact
top-``shortlist`` that the graph returns (what the fine stage then re-ranks; an image missing from it cannot
be found), and the time per query of both. Uses :class:`patchword.eval.two_stage.GlobalIndex` with the
settings search uses (M 32, efConstruction 200, efSearch max(256, k)).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from patchword.bench.machine import machine_description
from patchword.eval.two_stage import GlobalIndex


def clustered(n: int, dim: int, clusters: int, spread: float, generator: torch.Generator) -> torch.Tensor:
    """(n, dim) unit vectors, each a random centre plus Gaussian noise of norm ~``spread``."""
    centres = torch.nn.functional.normalize(torch.randn(clusters, dim, generator=generator), dim=1)
    which = torch.randint(clusters, (n,), generator=generator)
    noise = torch.randn(n, dim, generator=generator) * (spread / dim**0.5)
    return torch.nn.functional.normalize(centres[which] + noise, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--shortlist", type=int, default=100)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--spread", type=float, default=1.0, help="noise norm relative to the centres'")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes:
        generator = torch.Generator().manual_seed(0)
        database = clustered(size, args.dim, args.clusters, args.spread, generator)
        queries = clustered(args.queries, args.dim, args.clusters, args.spread, generator)
        exact = GlobalIndex(database, backend="faiss_flat")
        t0 = time.perf_counter()
        graph = GlobalIndex(database, backend="faiss_hnsw")
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, want = exact.search(queries, args.shortlist)
        exact_ms = (time.perf_counter() - t0) / args.queries * 1e3
        t0 = time.perf_counter()
        _, got = graph.search(queries, args.shortlist)
        graph_ms = (time.perf_counter() - t0) / args.queries * 1e3
        found = [
            len(set(a.tolist()) & set(b.tolist())) / args.shortlist for a, b in zip(want, got, strict=True)
        ]
        top1 = float((want[:, 0] == got[:, 0]).float().mean())
        rows.append(
            {
                "images": size,
                "dim": args.dim,
                "shortlist": args.shortlist,
                "shortlist_recall": 100 * sum(found) / len(found),
                "worst_query_recall": 100 * min(found),
                "top1_equal": 100 * top1,
                "build_seconds": build,
                "exact_ms_per_query": exact_ms,
                "hnsw_ms_per_query": graph_ms,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    columns = ("images", "shortlist_recall", "worst_query_recall", "top1_equal", "build_seconds")
    columns += ("exact_ms_per_query", "hnsw_ms_per_query")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print(
            "| " + " | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in columns) + " |"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"rows": rows, "args": vars(args) | {"out": str(args.out)}, "machine": machine_description()},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
