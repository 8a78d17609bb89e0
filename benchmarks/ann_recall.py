"""How much of the exact shortlist an approximate first stage finds (search above ``APPROXIMATE_ABOVE``).

    python benchmarks/ann_recall.py --sizes 200000 --queries 500 --out benchmarks/results/ann_recall.json

The database is unit vectors drawn around cluster centres (a mixture of Gaussians on the sphere, like real
global embeddings, which crowd around topics; uniform random vectors are every index's worst case), the
queries are drawn the same way. With ``--spread 1`` a cluster's ~N/1000 members are nearly equidistant
from a query of that cluster, so the exact top-100 is decided by small differences: a hard case. For each
size and setting: build time, the mean (and worst) share of the exact top-``shortlist`` the index returns
(what the fine stage re-ranks: an image missing from it cannot be found), the share of the exact top-10
inside it, and the time per query for one query at a time (a server) and for a batch. Settings: FAISS IVF
(:class:`patchword.eval.two_stage.GlobalIndex` ``faiss_ivf``, ``4 sqrt(N)`` lists, ``nprobe`` a fraction
of them) and HNSW (M 32, efConstruction 200, efSearch as given).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from patchword.bench.machine import machine_description
from patchword.eval.two_stage import GlobalIndex, ivf_lists


def clustered(n: int, dim: int, clusters: int, spread: float, generator: torch.Generator) -> torch.Tensor:
    """(n, dim) unit vectors, each a random centre plus Gaussian noise of norm ~``spread``."""
    centres = torch.nn.functional.normalize(torch.randn(clusters, dim, generator=generator), dim=1)
    which = torch.randint(clusters, (n,), generator=generator)
    noise = torch.randn(n, dim, generator=generator) * (spread / dim**0.5)
    return torch.nn.functional.normalize(centres[which] + noise, dim=1)


def timed(
    index: GlobalIndex, queries: torch.Tensor, k: int, singles: int
) -> tuple[torch.Tensor, float, float]:
    """(top-k ids, ms per query in one batch, ms per query one at a time over the first ``singles``)."""
    t0 = time.perf_counter()
    _, ids = index.search(queries, k)
    batch = (time.perf_counter() - t0) / queries.shape[0] * 1e3
    t0 = time.perf_counter()
    for i in range(singles):
        index.search(queries[i : i + 1], k)
    return ids, batch, (time.perf_counter() - t0) / max(singles, 1) * 1e3


def overlap(want: torch.Tensor, got: torch.Tensor, top: int) -> list[float]:
    return [len(set(a[:top].tolist()) & set(b.tolist())) / top for a, b in zip(want, got, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--singles", type=int, default=50, help="queries timed one at a time")
    parser.add_argument("--shortlist", type=int, default=100)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--spread", type=float, default=1.0, help="noise norm relative to the centres'")
    parser.add_argument("--nprobe-fractions", type=float, nargs="+", default=[1 / 32, 1 / 16, 1 / 8])
    parser.add_argument("--ef-search", type=int, nargs="*", default=[256, 1024], help="HNSW (none: skip)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    k = args.shortlist

    def record(size: int, setting: str, index: GlobalIndex, build: float, want, queries) -> None:
        got, batch_ms, single_ms = timed(index, queries, k, args.singles)
        found, top10 = overlap(want, got, k), overlap(want, got, 10)
        rows.append(
            {
                "images": size,
                "setting": setting,
                "shortlist_recall": 100 * sum(found) / len(found),
                "worst_query_recall": 100 * min(found),
                "top10_in_shortlist": 100 * sum(top10) / len(top10),
                "build_seconds": build,
                "batch_ms_per_query": batch_ms,
                "single_ms_per_query": single_ms,
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    for size in args.sizes:
        generator = torch.Generator().manual_seed(0)
        database = clustered(size, args.dim, args.clusters, args.spread, generator)
        queries = clustered(args.queries, args.dim, args.clusters, args.spread, generator)
        exact = GlobalIndex(database, backend="faiss_flat")
        want, _, _ = timed(exact, queries, k, 0)
        record(size, "exact (faiss flat)", exact, 0.0, want, queries)
        lists = ivf_lists(size)
        t0 = time.perf_counter()
        ivf = GlobalIndex(database, backend="faiss_ivf", nlist=lists)
        build = time.perf_counter() - t0
        for fraction in args.nprobe_fractions:
            ivf._nprobe = max(1, round(lists * fraction))
            record(size, f"IVF {lists} lists, nprobe {ivf._nprobe}", ivf, build, want, queries)
        if args.ef_search:
            t0 = time.perf_counter()
            graph = GlobalIndex(database, backend="faiss_hnsw")
            build = time.perf_counter() - t0
            for ef in args.ef_search:
                graph._ef_search = ef
                record(size, f"HNSW M 32, efSearch {ef}", graph, build, want, queries)
    columns = ("images", "setting", "shortlist_recall", "worst_query_recall", "top10_in_shortlist")
    columns += ("build_seconds", "single_ms_per_query", "batch_ms_per_query")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print(
            "| " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in columns) + " |"
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
