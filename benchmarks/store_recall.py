"""What each token store costs in recall: the same images indexed with ``--store float32|float16|int8|pq``,
every caption of the exported split searched through each index (``Searcher.search``, the code path of
``patchword search`` and ``serve``), text-to-image R@1/5/10 against the uncompressed index and against the
run's exhaustive evaluation, and the bytes per image of each index on disk; with ``--shortlists 100 50``
also what a shorter global shortlist (fewer images re-ranked: a faster search) costs, with
``--keep-patches 0.75`` what index-time patch pruning costs.

    patchword data export synthetic --split test --out /tmp/scenes --run runs/demo
    python benchmarks/store_recall.py --run runs/demo --export /tmp/scenes --work /tmp/stores
    python benchmarks/store_recall.py --run runs/demo --export /tmp/scenes --work /tmp/stores \
        --stores float32 --shortlists 100 50 25
    python benchmarks/store_recall.py --run runs/demo --export /tmp/scenes --work /tmp/stores \
        --stores float32 --keep-patches 1 0.875 0.75 0.625

Writes ``WORK/store_recall.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from patchword.bench.machine import machine_description
from patchword.cli.search import main_index
from patchword.search.query import Searcher

STORES = ("float32", "float16", "int8", "pq")


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def token_bytes(path: Path) -> int:
    """Bytes of the token shards and their codecs (what the store format changes): every file but the
    global vectors (``shards/NNNNN.global.npy``, an HNSW graph ``global.*.hnsw``) and the manifest."""

    def is_token_file(f: Path) -> bool:
        return ".global." not in f.name and not f.name.startswith("global") and f.name != "manifest.json"

    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and is_token_file(f))


def recall(searcher: Searcher, export: Path, split: str, limit: int | None) -> dict[str, float]:
    captions = (export / f"{split}_caps.txt").read_text().splitlines()
    ids = (export / f"{split}_ids.txt").read_text().splitlines()
    files = json.loads((export / "id_mapping.json").read_text())
    pairs = list(zip(captions, ids, strict=True))[:limit]
    hits = {1: 0, 5: 0, 10: 0}
    t0 = time.perf_counter()
    for caption, image_id in pairs:
        names = [Path(h.path).name for h in searcher.search(caption, k=10).hits]
        want = Path(files[image_id]).name
        for k in hits:
            hits[k] += want in names[:k]
    out = {f"t2i_r{k}": 100.0 * n / len(pairs) for k, n in hits.items()}
    return {**out, "queries": len(pairs), "search_seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--export", type=Path, required=True, help="a `patchword data export` directory")
    parser.add_argument("--work", type=Path, required=True, help="where the indexes are built")
    parser.add_argument("--split", default="test")
    parser.add_argument("--stores", nargs="+", default=list(STORES), choices=STORES)
    parser.add_argument("--shortlists", type=int, nargs="+", default=[100], help="images re-ranked per query")
    parser.add_argument(
        "--pq-bytes", type=int, nargs="+", default=[0], help="pq store: bytes per token (0: the default)"
    )
    parser.add_argument(
        "--keep-patches",
        type=float,
        nargs="+",
        default=[1.0],
        help="index-time patch pruning: fractions of each image's patches kept (1: none pruned)",
    )
    parser.add_argument("--limit", type=int, help="only the first N captions")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, dict] = {}
    variants = [
        (s, b, keep)
        for s in args.stores
        for b in (args.pq_bytes if s == "pq" else [0])
        for keep in args.keep_patches
    ]
    for store, pq_bytes, keep in variants:
        label = (f"{store}-{pq_bytes}" if pq_bytes else store) + (f", keep {keep}" if keep < 1 else "")
        out = args.work / f"index-{label.replace(', keep ', '-keep')}"
        t0 = time.perf_counter()
        if not (out / "manifest.json").is_file():
            argv = ["build", str(args.run), "--images", str(args.export / "images"), "--out", str(out)]
            argv += ["--store", store, "--dense", str(args.export / f"{args.split}.jsonl")]
            argv += ["--pq-bytes", str(pq_bytes)] if pq_bytes else []
            argv += ["--keep-patches", str(keep)] if keep < 1 else []
            if main_index(argv) != 0:
                raise SystemExit(f"index build --store {store} failed")
        build = time.perf_counter() - t0
        for shortlist in args.shortlists:
            searcher = Searcher.open(out, run_dir=args.run, shortlist=shortlist)
            n = len(searcher)
            name = label if shortlist == 100 else f"{label}, shortlist {shortlist}"
            results[name] = {
                **recall(searcher, args.export, args.split, args.limit),
                "shortlist": shortlist,
                "images": n,
                "bytes_per_image": directory_bytes(out) / n,
                "token_bytes_per_image": token_bytes(out) / n,
                "build_seconds": build,
            }
            print(name, json.dumps(results[name]), flush=True)
    summary = json.loads((args.run / "summary.json").read_text())
    record = {"run": str(args.run), "results": results, "machine": machine_description()}
    record["exhaustive"] = {k: summary[k] for k in ("t2i_r1", "t2i_r5", "t2i_r10")}
    (args.work / "store_recall.json").write_text(json.dumps(record, indent=2))
    base = results.get("float32")
    print("| store | bytes/image | t2i R@1 | R@5 | R@10 | R@10 vs float32 |")
    print("|---|---|---|---|---|---|")
    for store, r in results.items():
        delta = f"{r['t2i_r10'] - base['t2i_r10']:+.2f}" if base else ""
        cells = " | ".join(f"{r[f't2i_r{k}']:.2f}" for k in (1, 5, 10))
        print(f"| {store} | {r['bytes_per_image']:.0f} | {cells} | {delta} |")
    ex = record["exhaustive"]
    cells = " | ".join(f"{ex[f't2i_r{k}']:.2f}" for k in (1, 5, 10))
    print(f"| the run's exhaustive evaluation | | {cells} | |")


if __name__ == "__main__":
    main()
