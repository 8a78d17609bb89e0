"""Search at real scale: an index of N images at ViT-B/16 shapes served from one machine.

The model is SEPS (code variant) on ViT-B/16-224 + BERT-base, randomly initialised (no download; a made-up
30522-word BERT vocabulary): what a user imports. The index holds N synthetic entries at its shapes — 197
image tokens and 120 dense-caption tokens of 512 dimensions per image, in the product-quantised store
(64 bytes per token; with ``--dense-store scores`` one float per image instead of the dense tokens; with
``--keep-patches F`` only that fraction of the 196 patches, as ``index build --keep-patches``) —
written directly from random codes: the sizes, the memory and the serving latency
are those of a real index of that size; the build figure is the writing of the shards only (a real build
is bounded by the image encoder, measured at 10k-100k in docs/benchmarks.md "Search at scale").

    python benchmarks/scale_search.py --work /work/scale --sizes 1000000 --out benchmarks/results

Per size: bytes per image on disk, the shard-writing rate, the IVF first stage's build (time, recall of the
exact shortlist of 100 on 200 queries drawn like the database), then `patchword serve` in a child process
under 1 and 32 concurrent clients (p50 / p95 latency, requests/s, failures, the server's peak RSS).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import SERVE_CMD, _child, _peak_rss_mib, _wait_ready, load  # noqa: E402

IMAGE_TOKENS, DENSE_TOKENS, DIM, PQ_M = 197, 120, 512, 64
WORDS = [
    "a",
    "an",
    "the",
    "red",
    "blue",
    "green",
    "large",
    "small",
    "dog",
    "cat",
    "man",
    "woman",
    "child",
    "car",
    "tree",
    "street",
    "water",
    "grass",
]


def clustered(n: int, dim: int, generator: torch.Generator, clusters: int = 1000) -> torch.Tensor:
    """(n, dim) unit vectors around ``clusters`` fixed centres (the same centres on every call)."""
    centres = torch.nn.functional.normalize(
        torch.randn(clusters, dim, generator=torch.Generator().manual_seed(12345)), dim=1
    )
    which = torch.randint(clusters, (n,), generator=generator)
    noise = torch.randn(n, dim, generator=generator) / dim**0.5
    return torch.nn.functional.normalize(centres[which] + noise, dim=1)


def make_run(run_dir: Path) -> None:
    """A run directory of the random-init ViT-B/16 + BERT-base SEPS (what `patchword import` would write)."""
    from patchword.checkpoint import atomic_save
    from patchword.config import apply_overrides, save_config
    from patchword.factory import create_model
    from patchword.runs import save_backbones
    from patchword.runs.config import RunConfig

    if (run_dir / "best.pt").is_file():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += WORDS + [f"w{i}" for i in range(30522 - len(vocab) - len(WORDS))]
    (run_dir / "bert_vocab").mkdir(exist_ok=True)
    (run_dir / "bert_vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (run_dir / "bert_vocab" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    cfg = apply_overrides(
        RunConfig(),
        [
            "model.name=seps-vit-b16-code",
            "data.dataset=laps",
            "data.tokenizer=bert",
            "data.bert_vocab=bert_vocab",
            "data.max_caption_len=32",
            f"data.max_dense_len={DENSE_TOKENS}",
            "name=scale",
        ],
    )
    torch.manual_seed(0)
    model = create_model(cfg.model, pretrained=False)
    save_config(cfg, run_dir / "config.yaml")
    save_backbones(model, run_dir)
    atomic_save({"model": model.state_dict(), "step": 0, "metrics": {}}, run_dir / "best.pt")


def write_index(
    run_dir: Path,
    index_dir: Path,
    size: int,
    shard_size: int = 8192,
    seed: int = 0,
    dense_store: str = "tokens",
    pq_bytes: int = PQ_M,
    keep_patches: float = 1.0,
) -> dict:
    """N synthetic entries in the pq store: clustered unit global embeddings (like real ones, which crowd
    around topics; benchmarks/ann_recall.py), random codes."""
    from patchword.runs import load_run
    from patchword.search.codecs import TokenCodec
    from patchword.search.identity import model_identity
    from patchword.search.manifest import Entry, Manifest
    from patchword.search.shards import save_npy_atomic, shard_files

    if (index_dir / "bench_build.json").is_file():
        return json.loads((index_dir / "bench_build.json").read_text())
    shutil.rmtree(index_dir, ignore_errors=True)
    (index_dir / "shards").mkdir(parents=True)
    run = load_run(run_dir)
    pruning = None
    if keep_patches < 1:  # what `index build --keep-patches` records and stores
        from patchword.eval.engine.core import engine_for
        from patchword.search.pruning import pruning_record

        pruning = pruning_record(engine_for(run.model.matcher), keep_patches)
    kept = pruning["kept"] if pruning else IMAGE_TOKENS - 1
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    centroids = rng.standard_normal((pq_bytes, 256, DIM // pq_bytes)).astype(np.float32) * 0.1
    codec = TokenCodec("pq", centroids)
    codec.save(index_dir)
    manifest = Manifest(
        model=model_identity(run),
        images_root=str(index_dir / "images"),
        dtype="pq",
        dense={"file": "synthetic", "max_len": DENSE_TOKENS, "store": dense_store},
        codec=codec.describe(),
        pruning=pruning,
    )
    start = time.perf_counter()
    for shard_id, first in enumerate(range(0, size, shard_size)):
        rows = min(shard_size, size - first)
        files = shard_files(index_dir, shard_id)
        glob = clustered(rows, DIM, generator).numpy()
        save_npy_atomic(files["global"], glob)
        save_npy_atomic(files["tokens"], rng.integers(0, 256, (rows, 1 + kept, pq_bytes), dtype=np.uint8))
        if pruning:  # kept patches' grid positions (sorted) and selection priors
            ids = np.sort(rng.permuted(np.tile(np.arange(IMAGE_TOKENS - 1), (rows, 1)), axis=1)[:, :kept], 1)
            save_npy_atomic(files["patch_ids"], ids.astype(np.int16))
            save_npy_atomic(files["patch_prior"], rng.uniform(-0.2, 0.6, (rows, kept)).astype(np.float32))
        if dense_store == "scores":  # the dense branch's score per image (index build --dense-store scores)
            save_npy_atomic(files["dense_score"], rng.standard_normal(rows).astype(np.float32))
        else:
            save_npy_atomic(
                files["dense"], rng.integers(0, 256, (rows, DENSE_TOKENS, pq_bytes), dtype=np.uint8)
            )
            save_npy_atomic(files["dense_lens"], np.full(rows, DENSE_TOKENS, np.int32))
        manifest.shards.append({"id": shard_id, "rows": rows})
        manifest.entries += [Entry(f"{first + r:07d}.jpg", 0, 0, "JPEG", shard_id, r) for r in range(rows)]
    manifest.next_shard = len(manifest.shards)
    manifest.state = "complete"
    manifest.write(index_dir)
    seconds = time.perf_counter() - start
    disk = sum(p.stat().st_size for p in (index_dir / "shards").iterdir())
    record = {
        "images": size,
        "write_seconds": seconds,
        "images_per_s": size / seconds,
        "bytes_per_image": disk / size,
    }
    (index_dir / "bench_build.json").write_text(json.dumps(record, indent=2))
    return record


def first_stage(index_dir: Path, queries: int = 200, k: int = 100) -> dict:
    """Build (once) the IVF first stage the server will load, and its recall of the exact top-k."""
    from patchword.eval.two_stage import GlobalIndex
    from patchword.search.first_stage import first_stage_file
    from patchword.search.store import SearchIndex

    index = SearchIndex.open(index_dir)
    db = index.global_embeddings()
    path = first_stage_file(index_dir, index.manifest, "faiss_ivf")  # where Searcher looks for it
    start = time.perf_counter()
    if path.is_file():
        ivf, built = GlobalIndex.load(path, "faiss_ivf"), None
    else:
        ivf = GlobalIndex(db, backend="faiss_ivf")
        ivf.save(path)
        built = time.perf_counter() - start
    generator = torch.Generator().manual_seed(1)
    q = clustered(queries, db.shape[1], generator)  # queries from the database's distribution
    _, approx = ivf.search(q, k)
    _, exact = GlobalIndex(db, backend="faiss_flat").search(q, k)
    found = [len(set(a.tolist()) & set(e.tolist())) / k for a, e in zip(approx, exact, strict=True)]
    top10 = [len(set(a.tolist()) & set(e[:10].tolist())) / 10 for a, e in zip(approx, exact, strict=True)]
    return {
        "ivf_lists": int(ivf._index.nlist),
        "ivf_build_seconds": built,
        "ivf_recall_at_100": float(np.mean(found)),
        "ivf_top10_in_100": float(np.mean(top10)),
    }


def serve(
    run_dir: Path,
    index_dir: Path,
    clients: list[int],
    requests: int,
    workers: int = 2,
    shortlist: int | None = None,
) -> tuple[list[dict], float | None]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = ["--port", str(port), "--workers", str(workers)]
    options += ["--shortlist", str(shortlist)] if shortlist else []
    cmd = _child(SERVE_CMD, str(index_dir), "--run", str(run_dir), *options)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, timeout=1800)
        queries = [" ".join(np.random.default_rng(i).choice(WORDS, 5)) for i in range(500)]
        results = [load("127.0.0.1", port, queries, c, max(requests, 4 * c), 10) for c in clients]
        return results, _peak_rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--dense-store", choices=("tokens", "scores"), default="tokens")
    parser.add_argument(
        "--serve-workers", type=int, default=2, help="serve --workers (torch threads: CPUs // workers)"
    )
    parser.add_argument("--shortlist", type=int, default=None, help="serve --shortlist (default: 100)")
    parser.add_argument(
        "--pq-bytes", type=int, default=PQ_M, help="pq bytes per token (index build --pq-bytes)"
    )
    parser.add_argument(
        "--keep-patches", type=float, default=1.0, help="index build --keep-patches (1: every patch)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from patchword.bench.machine import machine_description

    run_dir = args.work / "run"
    make_run(run_dir)
    rows = []
    for size in args.sizes:
        pq = "" if args.pq_bytes == PQ_M else f"-pq{args.pq_bytes}"
        pq += "" if args.keep_patches == 1 else f"-keep{args.keep_patches}"
        index_dir = args.work / f"index-{size}-{args.dense_store}{pq}"
        built = write_index(
            run_dir,
            index_dir,
            size,
            dense_store=args.dense_store,
            pq_bytes=args.pq_bytes,
            keep_patches=args.keep_patches,
        )
        row = {"size": size, "dense_store": args.dense_store, "pq_bytes": args.pq_bytes, **built}
        row["keep_patches"] = args.keep_patches
        row.update(first_stage(index_dir))
        row["serve_workers"], row["shortlist"] = args.serve_workers, args.shortlist or 100
        row["load"], row["serve_peak_rss_mib"] = serve(
            run_dir, index_dir, args.clients, args.requests, args.serve_workers, args.shortlist
        )
        rows.append(row)
        print(json.dumps(row, indent=2), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        suffix = "" if args.serve_workers == 2 else f"_workers{args.serve_workers}"
        suffix += f"_shortlist{args.shortlist}" if args.shortlist else ""
        suffix += f"_pq{args.pq_bytes}" if args.pq_bytes != PQ_M else ""
        suffix += f"_keep{args.keep_patches}" if args.keep_patches != 1 else ""
        (args.out / f"scale_search_{args.dense_store}{suffix}.json").write_text(
            json.dumps({"machine": machine_description(), "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
