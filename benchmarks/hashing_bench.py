"""UCMFH hashing benchmarks: bit-width tables, Hamming-vs-float search speed, the BalancedInfoNCE study.

Usage (each writes ``<out>/hashing_<what>.md`` and ``.json``; the markdown is what docs/ quote)::

    python benchmarks/hashing_bench.py clip        # real CLIP ViT-L/14 Flickr30K pairs, 16-128 bits
    python benchmarks/hashing_bench.py synthetic   # synthetic multi-label set, 16-128 bits
    python benchmarks/hashing_bench.py speed       # 1M database codes: numpy popcount, FAISS, float cosine
    python benchmarks/hashing_bench.py loss        # InfoNCE vs BalancedInfoNCE: gradients, Adam runs, seeds
    python benchmarks/hashing_bench.py devcurve    # how the CLIP epoch budget was chosen (dev split of train)

Everything runs on CPU with ``--threads`` intra-op threads (1 by default: the numbers are per core).
Training runs go to a temporary directory that is deleted afterwards (checkpoints are large).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from patchword.checkpoint import seed_everything
from patchword.hashing import (
    HammingIndex,
    HashDataset,
    cosine_topk,
    hamming_topk,
    load_pairs,
    retrieval_report,
    split_dataset,
    synthetic_dataset,
)
from patchword.hashing.build import build_hashing_model
from patchword.hashing.config import HashRunConfig
from patchword.hashing.runner import train_hashing
from patchword.losses import BalancedInfoNCE, InfoNCE

ROOT = Path(__file__).resolve().parents[1]
CLIP_DIR = ROOT.parent / "shared" / "data" / "f30k_first1000_clipL14"
BITS = (16, 32, 64, 128)


# ------------------------------------------------------------------------------------------ data


def clip_data() -> HashDataset:
    """1000 real CLIP ViT-L/14 pairs: 500 held-out pairs = query = database (pair relevance), 500 train."""
    full = load_pairs(CLIP_DIR / "flickr30k_image_embeddings.npy", CLIP_DIR / "flickr30k_text_embeddings.npy")
    return split_dataset(full, num_query=500, num_train=500, seed=0)


def synth_data() -> HashDataset:
    return synthetic_dataset(num_train=2000, num_query=500, num_retrieval=4000, seed=0)


# ------------------------------------------------------------------------------------------ helpers


def metrics_of(q: np.ndarray, db: np.ndarray, ds: HashDataset, measure: str) -> dict[str, float]:
    rep = retrieval_report(
        q, db, ds.query.relevance, ds.retrieval.relevance, map_k=50, ks=(1, 5, 10), measure=measure
    )
    return {"map@50": rep["map"], **{f"r@{k}": v for k, v in rep["recall"].items()}}


def both_directions(q_img, q_txt, db_img, db_txt, ds, measure) -> dict[str, float]:
    out = {}
    for name, q, db in (("i2t", q_img, db_txt), ("t2i", q_txt, db_img)):
        out.update({f"{name}_{k}": v for k, v in metrics_of(q, db, ds, measure).items()})
    return out


def lsh_codes(x: np.ndarray, bits: int, seed: int = 0) -> np.ndarray:
    """Sign random projections (SimHash), one shared projection for both modalities."""
    proj = np.random.default_rng(seed).standard_normal((x.shape[1], bits)).astype(np.float32)
    return np.where(x @ proj >= 0, 1, -1).astype(np.int8)


def run_ucmfh(
    ds: HashDataset,
    *,
    bits: int,
    epochs: int,
    loss: str = "infonce",
    seed: int = 2023,
    fusion: str = "unimodal",
    optimizer: str = "adam",
    keep_model: bool = False,
    **train_kw,
):
    """Train one model in a temporary directory; returns (metrics dict, model or None)."""
    tmp = Path(tempfile.mkdtemp(prefix="pw_hash_"))
    try:
        cfg = HashRunConfig(output_dir=str(tmp), name="run")
        cfg.model = replace(cfg.model, bits=bits, fusion=fusion)
        cfg.train = replace(
            cfg.train, epochs=epochs, loss=loss, seed=seed, optimizer=optimizer, save_every=0, **train_kw
        )
        cfg.eval = replace(cfg.eval, ks=[1, 5, 10])
        start = time.perf_counter()
        summary = train_hashing(cfg, data=ds)
        summary["wall_s"] = time.perf_counter() - start
        model = None
        if keep_model:
            from patchword.checkpoint import load_checkpoint

            model = build_hashing_model(cfg.model, ds.image_dim, ds.text_dim)
            model.load_state_dict(load_checkpoint(tmp / "run" / "last.pt")["model"])
        return summary, model
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fmt(x: float) -> str:
    return f"{x:.3f}"


def header(title: str, args: argparse.Namespace) -> list[str]:
    return [
        f"### {title}",
        "",
        f"Machine: {platform.machine()} CPU, torch {torch.__version__}, numpy {np.__version__}, "
        f"{args.threads} intra-op thread(s). Command: `python benchmarks/hashing_bench.py {args.what}"
        + (f" --epochs {args.epochs}" if args.epochs else "")
        + (f" --data {args.data}" if getattr(args, "data", "both") != "both" else "")
        + (f" --seeds {args.seeds}" if args.what == "loss" and args.seeds != 3 else "")
        + (" --skip-grad" if getattr(args, "skip_grad", False) else "")
        + (f" --tag {args.tag}" if getattr(args, "tag", "") else "")
        + "`.",
        "",
    ]


# ------------------------------------------------------------------------------------------ tables


def bench_table(args: argparse.Namespace, which: str) -> tuple[list[str], dict]:
    ds = clip_data() if which == "clip" else synth_data()
    epochs = args.epochs or (200 if which == "clip" else 30)
    rows, raw = [], {}
    # Float upper bound: cosine on the raw features (meaningful across modalities only for CLIP).
    flt = both_directions(ds.query.image, ds.query.text, ds.retrieval.image, ds.retrieval.text, ds, "cosine")
    dim = ds.image_dim
    label = "float cosine" if which == "clip" else "float cosine of the raw features (unrelated spaces)"
    rows.append((f"{label} ({dim}-d float32, {dim * 32} bits)", "-", flt))
    raw["float"] = flt
    rng = np.random.default_rng(0)
    chance = both_directions(
        *(rng.choice(np.array([-1, 1], dtype=np.int8), size=(len(x), 64)) for x in (ds.query.image,) * 2),
        *(rng.choice(np.array([-1, 1], dtype=np.int8), size=(len(x), 64)) for x in (ds.retrieval.image,) * 2),
        ds,
        "hamming",
    )
    rows.append(("random codes (chance level)", 64, chance))
    raw["random_64"] = chance
    # Data-independent baseline. CLIP image and text embeddings sit in different cones (the "modality gap"),
    # so sign projections through the origin mostly encode the modality; centring each modality on its
    # training-split mean removes that. The plain version is shown once for contrast.
    mean_i, mean_t = ds.train.image.mean(0), ds.train.text.mean(0)
    for bits, centre in [(64, False)] + [(b, True) for b in BITS]:
        ci, ct = (mean_i, mean_t) if centre else (0.0, 0.0)
        lsh = both_directions(
            lsh_codes(ds.query.image - ci, bits),
            lsh_codes(ds.query.text - ct, bits),
            lsh_codes(ds.retrieval.image - ci, bits),
            lsh_codes(ds.retrieval.text - ct, bits),
            ds,
            "hamming",
        )
        name = "LSH, per-modality mean-centred" if centre else "LSH (sign random projection, not centred)"
        rows.append((name, bits, lsh))
        raw[f"lsh{'_centred' if centre else ''}_{bits}"] = lsh
    for bits in BITS:
        summary, _ = run_ucmfh(ds, bits=bits, epochs=epochs)
        rows.append(
            (f"UCMFH unimodal, InfoNCE, {epochs} ep ({summary['train_seconds']:.0f} s)", bits, summary)
        )
        raw[f"ucmfh_{bits}"] = summary
        print(bits, {k: v for k, v in summary.items() if "map" in k}, flush=True)
    summary, _ = run_ucmfh(ds, bits=64, epochs=epochs, fusion="official_fused")
    rows.append(("UCMFH **official_fused** (LEAKY: pair-encoded, batch attention)", 64, summary))
    raw["fused_64"] = summary
    if which == "synthetic":
        summary, _ = run_ucmfh(ds, bits=64, epochs=epochs, loss="hashnet")
        rows.append(("UCMFH unimodal, HashNet loss on codes (uses labels)", 64, summary))
        raw["hashnet_64"] = summary

    title = (
        "Real CLIP ViT-L/14 Flickr30K pairs (500 train / 500 query = database, pair relevance)"
        if which == "clip"
        else "Synthetic multi-label set (2000 train, 500 query, 4000 database, 24 labels)"
    )
    lines = header(title, args)
    if which == "clip":
        lines += [
            "| method | bits | I->T mAP@50 | I->T R@1 | R@5 | R@10 | T->I mAP@50 | T->I R@1 | R@5 | R@10 |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, bits, m in rows:
            lines.append(
                f"| {name} | {bits} | "
                + " | ".join(
                    fmt(m[f"{d}_{k}"]) for d in ("i2t", "t2i") for k in ("map@50", "r@1", "r@5", "r@10")
                )
                + " |"
            )
    else:
        lines += ["| method | bits | I->T mAP@50 | T->I mAP@50 |", "|---|---|---|---|"]
        for name, bits, m in rows:
            lines.append(f"| {name} | {bits} | {fmt(m['i2t_map@50'])} | {fmt(m['t2i_map@50'])} |")
    return lines, raw


def bench_devcurve(args: argparse.Namespace) -> tuple[list[str], dict]:
    """Epoch budget for the CLIP table, chosen without the test pairs: train on 400 of the 500 training
    pairs, evaluate on the other 100 (pair relevance) every 25 epochs."""
    from patchword.hashing.evaluate import evaluate_hashing
    from patchword.hashing.trainer import HashTrainer

    inner = split_dataset(clip_data().train, num_query=100, num_train=400, seed=1)
    cfg = HashRunConfig()
    cfg.train = replace(cfg.train, save_every=0)
    seed_everything(cfg.train.seed)
    model = build_hashing_model(cfg.model, inner.image_dim, inner.text_dim)
    lines = header(
        "CLIP epoch budget on a dev split of the training pairs (400 train / 100 dev), 64 bits", args
    )
    lines += ["| epochs | steps | dev I->T mAP@50 | dev T->I mAP@50 |", "|---|---|---|---|"]
    raw = []
    with tempfile.TemporaryDirectory(prefix="pw_hash_") as tmp:
        trainer = HashTrainer(cfg, model, inner, Path(tmp))
        for epochs in range(25, (args.epochs or 250) + 1, 25):
            trainer.tc.epochs = epochs
            trainer.fit()
            m = evaluate_hashing(model, inner, cfg.eval)
            raw.append({"epochs": epochs, "steps": trainer.step, **m})
            lines.append(f"| {epochs} | {trainer.step} | {fmt(m['i2t_map@50'])} | {fmt(m['t2i_map@50'])} |")
            print(lines[-1], flush=True)
    return lines, raw


# ------------------------------------------------------------------------------------------ speed


def timed(fn, repeats: int = 3) -> float:
    fn()  # warm-up (page faults, lazy init)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_speed(args: argparse.Namespace) -> tuple[list[str], dict]:
    n_db, n_q, k = args.db_size, args.queries, 50
    rng = np.random.default_rng(0)
    results, lines = {}, header(f"Exact search, {n_db:,} database items, {n_q} queries, top-{k}", args)
    lines += [
        "| method | bytes / item | database memory | time / query (ms) | queries / s |",
        "|---|---|---|---|---|",
    ]
    try:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        faiss = None
    for bits in BITS:
        db = np.packbits(rng.integers(0, 2, size=(n_db, bits), dtype=np.uint8).astype(bool), axis=1)
        q = np.packbits(rng.integers(0, 2, size=(n_q, bits), dtype=np.uint8).astype(bool), axis=1)
        t = timed(lambda db=db, q=q: hamming_topk(q, db, k))
        results[f"numpy_{bits}"] = t / n_q
        lines.append(
            f"| Hamming, numpy popcount, {bits} bits | {bits // 8} | {db.nbytes / 2**20:.0f} MiB | "
            f"{1000 * t / n_q:.2f} | {n_q / t:.0f} |"
        )
        if faiss is not None:
            index = HammingIndex(bits, backend="faiss")
            index.add(db)
            t = timed(lambda index=index, q=q: index.search(q, k))
            results[f"faiss_{bits}"] = t / n_q
            lines.append(
                f"| Hamming, FAISS IndexBinaryFlat, {bits} bits | {bits // 8} | "
                f"{db.nbytes / 2**20:.0f} MiB | "
                f"{1000 * t / n_q:.2f} | {n_q / t:.0f} |"
            )
        del db
    for dim in (64, 768):
        db = torch.from_numpy(rng.standard_normal((n_db, dim), dtype=np.float32))
        db = F.normalize(db, dim=1)
        q = torch.from_numpy(rng.standard_normal((n_q, dim), dtype=np.float32))
        t = timed(lambda db=db, q=q: cosine_topk(q, db, k), repeats=2)
        results[f"float_{dim}"] = t / n_q
        lines.append(
            f"| float32 cosine (matmul + topk), d={dim} | {4 * dim} | {db.numel() * 4 / 2**20:.0f} MiB | "
            f"{1000 * t / n_q:.2f} | {n_q / t:.0f} |"
        )
        del db
    lines += [
        "",
        "Random codes and Gaussian vectors (the distance distribution of real codes changes the numpy "
        "candidate count slightly, not the scan). Time = best of 3 (float: 2) repeats after a warm-up.",
    ]
    return lines, results


# ------------------------------------------------------------------------------------------ loss study


def grad_vector(model, ds: HashDataset, idx: torch.Tensor, loss_fn) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # same dropout masks for every loss
    out = model(torch.from_numpy(ds.train.image[idx]), torch.from_numpy(ds.train.text[idx]))
    (loss_fn(out.img_feat, out.txt_feat) + 0.5 * loss_fn(out.img_hash, out.txt_hash)).backward()
    # float64: a cosine of 29M-dimensional float32 vectors is off by ~1e-3 (it came out > 1)
    return torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])


def gradient_rows(model, ds, label: str) -> list[dict]:
    idx = torch.arange(128)
    g_bal = grad_vector(model, ds, idx, BalancedInfoNCE())
    g_i2t = grad_vector(model, ds, idx, InfoNCE(variant="i2t"))
    g_nt = grad_vector(model, ds, idx, InfoNCE())
    return [
        {
            "state": label,
            "cos_bal_i2t": float(F.cosine_similarity(g_bal, g_i2t, dim=0)),
            "norm_ratio_bal_i2t": float(g_bal.norm() / g_i2t.norm()),
            "cos_bal_ntxent": float(F.cosine_similarity(g_bal, g_nt, dim=0)),
            "norm_ratio_bal_ntxent": float(g_bal.norm() / g_nt.norm()),
        }
    ]


def bench_loss(args: argparse.Namespace) -> tuple[list[str], dict]:
    seeds = list(range(2023, 2023 + args.seeds))
    arms = ("infonce", "balanced", "infonce_i2t")
    raw: dict = {"grad": [], "runs": {}}
    lines = header("InfoNCE (official NT-Xent) vs BalancedInfoNCE vs plain one-directional InfoNCE", args)

    ds = clip_data()
    if not args.skip_grad:
        # 1. Gradients w.r.t. all model parameters on one batch of 128 real CLIP pairs (same dropout masks).
        seed_everything(0)
        model = build_hashing_model(HashRunConfig().model, ds.image_dim, ds.text_dim).train()
        raw["grad"] += gradient_rows(model, ds, "CLIP, at initialisation")
        _, trained = run_ucmfh(ds, bits=64, epochs=args.epochs or 50, keep_model=True)
        raw["grad"] += gradient_rows(
            trained.train(), ds, f"CLIP, after {args.epochs or 50} epochs of InfoNCE"
        )
        lines += [
            "Gradient of `L_f + 0.5 L_h` w.r.t. all 29M parameters, one batch of 128 CLIP pairs, 64 bits:",
            "",
            "| model state | cos(balanced, plain i2t) | norm ratio | cos(balanced, official NT-Xent) "
            "| norm ratio |",
            "|---|---|---|---|---|",
        ]
        for r in raw["grad"]:
            lines.append(
                f"| {r['state']} | {r['cos_bal_i2t']:.10f} | {r['norm_ratio_bal_i2t']:.2f} | "
                f"{r['cos_bal_ntxent']:.4f} | {r['norm_ratio_bal_ntxent']:.2f} |"
            )

    # 2. Training arms under Adam (official optimiser), several seeds, 64 bits, both data sets.
    lines += [
        "",
        "mAP@50 after training with Adam (betas 0.5/0.999, official lrs), 64 bits, mean +- std over "
        f"seeds {seeds}:",
        "",
        "| data | epochs | loss | I->T mAP@50 | T->I mAP@50 | per-seed mean of both |",
        "|---|---|---|---|---|---|",
    ]
    datasets = []
    if args.data in ("clip", "both"):
        datasets.append(("CLIP pairs", ds, args.epochs or 100))
    if args.data in ("synthetic", "both"):
        datasets.append(("synthetic", synth_data(), args.epochs or 30))
    for name, data, epochs in datasets:
        for arm in arms:
            res = [run_ucmfh(data, bits=64, epochs=epochs, loss=arm, seed=s)[0] for s in seeds]
            raw["runs"][f"{name}/{arm}"] = res
            i2t = [r["i2t_map@50"] for r in res]
            t2i = [r["t2i_map@50"] for r in res]
            both = [round((a + b) / 2, 3) for a, b in zip(i2t, t2i, strict=True)]
            sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
            lines.append(
                f"| {name} | {epochs} | {arm} | {statistics.mean(i2t):.3f} +- {sd(i2t):.3f} | "
                f"{statistics.mean(t2i):.3f} +- {sd(t2i):.3f} | {both} |"
            )
            print(name, arm, both, flush=True)
    return lines, raw


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["clip", "synthetic", "speed", "loss", "devcurve"])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=0, help="override the epoch budget (0 = defaults)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm in the loss study")
    parser.add_argument(
        "--data", choices=["clip", "synthetic", "both"], default="both", help="loss study data"
    )
    parser.add_argument(
        "--skip-grad", dest="skip_grad", action="store_true", help="loss study: no gradient part"
    )
    parser.add_argument("--tag", default="", help="suffix of the output file names")
    parser.add_argument("--db-size", dest="db_size", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if args.what in ("clip", "synthetic"):
        lines, raw = bench_table(args, args.what)
    elif args.what == "speed":
        lines, raw = bench_speed(args)
    elif args.what == "devcurve":
        lines, raw = bench_devcurve(args)
    else:
        lines, raw = bench_loss(args)
    lines += ["", f"Total benchmark wall time: {time.perf_counter() - start:.0f} s."]
    text = "\n".join(lines) + "\n"
    stem = f"hashing_{args.what}{'_' + args.tag if args.tag else ''}"
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(raw, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
