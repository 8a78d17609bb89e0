"""Benchmarks of exhaustive scoring and two-stage search: ``patchword bench scoring | two-stage | all``.

``main(argv)`` takes the arguments after ``bench`` (``main(["scoring", "--quick"])``).

* ``scoring``: pairs/s, achieved GFLOP/s and peak tensor memory of :func:`~patchword.eval.score_matrix`
  for SEPS (code and paper variants, caption- and image-tied dense text) and LAPS at ViT-224 shapes (196
  patches + CLS, C=512), with real caption lengths (BERT ids of the Flickr30K 1K test captions) and real
  dense lengths (SEPS LLaVA captions), against a per-caption reference loop written like the official
  code on the same inputs in the same process; the machine's fp32 matmul peak is measured in the same
  run; the 1000 x 5000 Flickr30K evaluation time is extrapolated from the measured throughput.
* ``two-stage``: recall and time of global-shortlist + fine re-ranking for several k against exhaustive
  scoring, on the synthetic test split with a trained model (``--run-dir``, or a quickly trained one).

Timings are the best of ``--repeats`` interleaved runs (other jobs may share the CPU: the minimum is
the least disturbed), and the speed-up is a ratio measured in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["main", "reference_scores", "matmul_peak_gflops", "run_scoring", "run_two_stage"]

_logger = logging.getLogger(__name__)

# ViT-B/16 at 224 px: 196 patches + CLS, projected to C = 512 (the official SEPS/LAPS setting).
VIT_PATCHES, VIT_DIM = 196, 512
F30K_IMAGES, F30K_CAPTIONS = 1000, 5000
COCO_IMAGES, COCO_CAPTIONS = 5000, 25000
MAX_DENSE_LEN = 128  # DataConfig.max_dense_len: the same cap in training and evaluation

SCORING_CONFIGS: dict[str, dict[str, Any]] = {
    # name: (matcher kwargs, dense text)  -- the first is the headline case
    "seps-code-caption": {"name": "seps", "variant": "code", "dense_pairing": "caption", "dense": True},
    "seps-code-image": {"name": "seps", "variant": "code", "dense_pairing": "image", "dense": True},
    "laps": {"name": "laps", "variant": "code", "dense_pairing": "image", "dense": False},
    "seps-paper-image": {"name": "seps", "variant": "paper", "dense_pairing": "image", "dense": True},
    "seps-paper-caption": {"name": "seps", "variant": "paper", "dense_pairing": "caption", "dense": True},
}


# ---------------------------------------------------------------------------------------------- machine
def machine_description() -> dict[str, Any]:
    """CPU model, cores, torch build and threads, load average (to spot contention)."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkl": torch.backends.mkl.is_available(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
    }


def matmul_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of a (size x size) @ (size x size) product: the machine's practical peak."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def count_flops(fn: Callable[[], Any]) -> float:
    """Matrix-multiply FLOPs ``fn`` executes (torch profiler counts of mm / bmm / addmm ...)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        fn()
    return float(sum(event.flops for event in prof.key_averages()))


# ---------------------------------------------------------------------------------------------- lengths
def _shared_data(path: str | None) -> Path | None:
    candidates = (
        [Path(path)]
        if path
        else [Path.cwd() / "../shared/data", Path(__file__).parents[3] / "../shared/data"]
    )
    for candidate in candidates:
        if (candidate / "f30k_1k_test").is_dir():
            return candidate.resolve()
    return None


def real_lengths(data: Path | None, bert_vocab: str | None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Token counts (specials included) of the Flickr30K 1K test captions (5000, image-major) and of the
    SEPS LLaVA dense captions of its 1000 images (capped at ``MAX_DENSE_LEN``), and where they came from.

    Captions: ``test_bert_caps.txt`` already holds their BERT ids. Dense captions: BERT WordPiece with
    ``bert_vocab`` when it loads (offline), otherwise basic tokens (words and punctuation) + 2.
    Without the data folder: a log-normal stand-in with the same medians (15 and 114 tokens).
    """
    if data is None:
        g = torch.Generator().manual_seed(0)
        caps = (15 * torch.exp(0.25 * torch.randn(F30K_CAPTIONS, generator=g))).round().clamp(5, 80).long()
        dense = (
            (114 * torch.exp(0.15 * torch.randn(F30K_IMAGES, generator=g))).round().clamp(40, MAX_DENSE_LEN)
        )
        return caps, dense.long(), "synthetic stand-in (../shared/data not found)"
    bert_caps = data / "f30k_1k_test" / "test_bert_caps.txt"
    caps = [len(line.split(",")) for line in bert_caps.read_text().splitlines() if line.strip()]
    source = f"captions: BERT ids of {bert_caps.name}"
    from patchword.data.captions import load_dense_jsonl

    texts = load_dense_jsonl(data / "seps_dense_llava" / "f30k_test.jsonl")
    counts = None
    if bert_vocab:
        try:
            from patchword.encoders import BertCaptionTokenizer

            tokenizer = BertCaptionTokenizer.from_pretrained(bert_vocab)
            counts = [len(tokenizer.encode(text)) for text in texts]
            source += f"; dense: BERT WordPiece ({bert_vocab})"
        except Exception as err:  # noqa: BLE001 - any failure means "no vocabulary here"
            _logger.info("no BERT vocabulary (%s): dense lengths from word counts", err)
    if counts is None:
        counts = [len(re.findall(r"\w+|[^\w\s]", text)) + 2 for text in texts]
        source += "; dense: words + punctuation + 2 (no BERT vocabulary available offline)"
    dense = torch.tensor(counts).clamp(max=MAX_DENSE_LEN)
    return torch.tensor(caps), dense, source + f", dense capped at {MAX_DENSE_LEN}"


# ---------------------------------------------------------------------------------------------- reference
def _token_sparse(patches: torch.Tensor, score: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Official TokenSparse: sort, gather the top K, softmax-fuse the rest: (B, K, C), (B, 1, C)."""
    c = patches.shape[-1]
    score_sort, order = torch.sort(score, dim=1, descending=True)
    select = torch.gather(patches, 1, order[:, :k, None].expand(-1, -1, c))
    rest = torch.gather(patches, 1, order[:, k:, None].expand(-1, -1, c))
    extra = (rest * F.softmax(score_sort[:, k:], dim=1)[..., None]).sum(dim=1, keepdim=True)
    return select, extra


def _aggregate(net, select: torch.Tensor) -> torch.Tensor:
    """Official TokenAggregation.forward on the gathered tokens: (B, K, C) -> (B, N_c, C)."""
    weight = F.softmax(net.weight(select).transpose(2, 1) * net.scale, dim=2)
    return torch.bmm(weight, select)


def _minmax(x: torch.Tensor) -> torch.Tensor:
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    return (x - lo) / (hi - lo + 1e-8)


def _hrpa_reference(matcher, tokens: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """Official ``mask_xattn_one_text`` (+ the paper's TopK-MLP terms): (B, M, C), (L, C) unit -> (B,)."""
    hrpa = matcher.hrpa
    attn = torch.einsum("lc,bmc->blm", words, tokens)
    if hrpa.leaky_slope is not None:
        attn = F.leaky_relu(attn, hrpa.leaky_slope)
    word_best, patch_best = attn.amax(dim=2), attn.amax(dim=1)
    sims = word_best.mean(dim=1) + patch_best.mean(dim=1)
    if hrpa.word_topk is not None:
        sims = sims + hrpa.word_topk(word_best) + hrpa.patch_topk(patch_best)
    return sims


@torch.no_grad()
def reference_scores(
    matcher,
    img: torch.Tensor,
    caps: torch.Tensor,
    lens: torch.Tensor,
    dense: torch.Tensor | None = None,
    dense_lens: torch.Tensor | None = None,
    dense_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """SEPS/LAPS scores the way the official code computes them: one caption at a time against all images.

    Per caption: text-guided scores, ``torch.sort``, gather of the kept patches, the aggregation MLP on the
    gathered tokens of every image, normalisation of [CLS, aggregated, fusion] and the cross attention
    (``lib/cross_net.py`` / ``lib/xttn.py``, reference/seps_laps.md 2.2-2.5). The paper variant uses the
    same loop with its scores (Eq. 3), dual aggregation and HRPA TopK-MLP terms. Dense text is tied to
    captions when ``dense_index`` is given (caption j uses dense row ``dense_index[j]``), to images
    otherwise (image v scored with its own dense text, one image at a time).

    Returns:
        (B_v, B_t) float32.
    """
    cfg = matcher.config
    k, beta = cfg.num_keep, cfg.beta
    paper = cfg.score_mode == "predictor"
    cls_tok = img[:, :1] if cfg.has_cls else None
    patches = img[:, int(cfg.has_cls) :]
    unit = F.normalize(patches, dim=-1)
    s_im = (F.normalize(patches.mean(dim=1, keepdim=True), dim=-1) * unit).sum(dim=-1)
    s_pred = matcher.scorer(patches) if paper else None
    use_dense = dense is not None and cfg.use_dense
    sims = torch.zeros(img.shape[0], caps.shape[0])

    def select(text: torch.Tensor, net, rows=slice(None)):
        score_t = (F.normalize(text.mean(dim=0), dim=-1) * unit[rows]).sum(dim=-1)
        if paper:
            score = (1 - 2 * beta) * s_pred[rows] + 2 * beta * (_minmax(score_t) + _minmax(s_im[rows]))
        else:
            score = s_im[rows] + score_t
        chosen, extra = _token_sparse(patches[rows], score, k)
        return _aggregate(net, chosen), extra

    def align(aggr, extra, words, rows=slice(None)):
        parts = ([cls_tok[rows]] if cls_tok is not None else []) + [aggr, extra]
        return _hrpa_reference(
            matcher, F.normalize(torch.cat(parts, dim=1), dim=-1), F.normalize(words, dim=-1)
        )

    aggr_dense = matcher.aggr_net_dense or matcher.aggr_net
    for i in range(caps.shape[0]):
        words = caps[i, : lens[i]]
        aggr, extra = select(words, matcher.aggr_net)
        if not use_dense:
            sims[:, i] = align(aggr, extra, words)
            continue
        per_image = [slice(v, v + 1) for v in range(img.shape[0])] if dense_index is None else [slice(None)]
        for rows in per_image:
            row = rows.start if dense_index is None else int(dense_index[i])
            text = dense[row, : dense_lens[row]]
            aggr_d, extra_d = select(text, aggr_dense, rows)
            if cfg.dense_mode == "guide":  # paper: one token set, aligned with the caption
                sims[rows, i] = align(aggr[rows] + aggr_d, 0.5 * (extra[rows] + extra_d), words, rows)
            else:  # official SEPS: its own branch, scores summed
                sims[rows, i] = align(aggr[rows], extra[rows], words, rows) + align(
                    aggr_d, extra_d, text, rows
                )
    return sims


# ---------------------------------------------------------------------------------------------- scoring
def _scoring_inputs(
    n_img: int,
    cap_lens: torch.Tensor,
    dense_lens: torch.Tensor,
    seed: int = 0,
    caption_images: int | None = None,
):
    """Random ViT-224-shaped tokens for the first ``n_img`` test images and their dense captions (real
    lengths), and the 5 captions (real lengths) of the first ``caption_images`` of them (default all);
    txt2img pairs caption j with image j // 5."""
    g = torch.Generator().manual_seed(seed)
    caps_per_image = cap_lens.numel() // dense_lens.numel()
    n_txt = caps_per_image * min(n_img, caption_images or n_img)
    lens = cap_lens[:n_txt].clone()
    dlens = dense_lens[:n_img].clone()
    img = torch.randn(n_img, VIT_PATCHES + 1, VIT_DIM, generator=g)
    caps = torch.randn(n_txt, int(lens.max()), VIT_DIM, generator=g)
    dense = torch.randn(n_img, int(dlens.max()), VIT_DIM, generator=g)
    return img, caps, lens, dense, dlens, torch.arange(n_txt) // caps_per_image


def _status_kb(field: str) -> int:
    """A ``/proc/self/status`` memory field in KiB (VmRSS: now, VmHWM: peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: ``5`` written to /proc/self/clear_refs)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _rss_probe(args: argparse.Namespace) -> None:
    """Hidden subcommand: score once in a fresh process and print the growth of its peak RSS (JSON)."""
    from patchword.eval import score_matrix
    from patchword.matching import build_matcher

    cfg = dict(SCORING_CONFIGS[args.config])
    cap_lens, dense_lens, _ = real_lengths(_shared_data(args.data), None)
    torch.manual_seed(0)
    matcher = build_matcher(
        cfg.pop("name"),
        embed_dim=VIT_DIM,
        num_patches=VIT_PATCHES,
        has_cls=True,
        variant=cfg["variant"],
        dense_pairing=cfg["dense_pairing"],
    ).eval()
    img, caps, lens, dense, dlens, t2i = _scoring_inputs(
        args.images, cap_lens, dense_lens, caption_images=args.caption_images
    )
    out = torch.empty(img.shape[0], caps.shape[0])
    small = _scoring_inputs(2, cap_lens, dense_lens)  # warm-up: thread pools, kernels, lazy imports
    score_matrix(matcher, *small[:5], txt2img=small[5], max_memory_mb=args.max_memory_mb)
    before = _status_kb("VmRSS")
    _reset_peak_rss()
    score_matrix(
        matcher, img, caps, lens, dense, dlens, txt2img=t2i, max_memory_mb=args.max_memory_mb, out=out
    )
    after = _status_kb("VmHWM")
    print(json.dumps({"rss_growth_mb": (after - before) / 1024}))


def _measure_rss(
    config: str, images: int, caption_images: int, budget_mb: float, data: str | None
) -> float | None:
    """Peak-RSS growth (MiB) of one score_matrix call in a fresh process (glibc returning big blocks to
    the OS: MALLOC_MMAP_THRESHOLD_ fixed so that freed tensors leave RSS)."""
    cmd = [
        sys.executable,
        "-m",
        "patchword.bench",
        "_rss",
        "--config",
        config,
        "--images",
        str(images),
        "--caption-images",
        str(caption_images),
        "--max-memory-mb",
        str(budget_mb),
    ]
    cmd += ["--data", data] if data else []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=1800)
        return float(json.loads(done.stdout.strip().splitlines()[-1])["rss_growth_mb"])
    except (subprocess.SubprocessError, ValueError, KeyError, IndexError) as err:
        _logger.warning("RSS probe failed: %s", err)
        return None


def run_scoring(
    *,
    images: int = 256,
    caption_images: int = 48,
    ref_captions: int = 10,
    repeats: int = 3,
    configs: list[str] | None = None,
    max_memory_mb: float = 1024,
    data: str | None = None,
    bert_vocab: str | None = "bert-base-uncased",
    rss: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Measure every scoring config; see the module docstring. Returns a JSON-able dict."""
    from patchword.eval import score_matrix
    from patchword.eval.engine import SEPSEngine, TensorMemoryMeter
    from patchword.matching import build_matcher

    configs = configs or list(SCORING_CONFIGS)
    cap_lens, dense_lens, source = real_lengths(_shared_data(data), bert_vocab)
    result: dict[str, Any] = {
        "machine": machine_description(),
        "lengths": {
            "source": source,
            "caption_mean": cap_lens.float().mean().item(),
            "caption_median": cap_lens.median().item(),
            "dense_mean": dense_lens.float().mean().item(),
            "dense_median": dense_lens.median().item(),
        },
        "setup": {
            "images": images,
            "captions": 5 * min(images, caption_images),
            "ref_captions": ref_captions,
            "repeats": repeats,
            "max_memory_mb": max_memory_mb,
            "dim": VIT_DIM,
            "patches": VIT_PATCHES,
        },
        "peak_gflops": matmul_peak_gflops(),
        "configs": {},
    }
    img, caps, lens, dense, dlens, t2i = _scoring_inputs(
        images, cap_lens, dense_lens, caption_images=caption_images
    )
    n_pairs = img.shape[0] * caps.shape[0]
    # FLOPs are counted (torch profiler) on a slice of the images: per pair they do not depend on it.
    n_count = min(images, 32)
    for name in configs:
        spec = dict(SCORING_CONFIGS[name])
        torch.manual_seed(0)
        matcher = build_matcher(
            spec["name"],
            embed_dim=VIT_DIM,
            num_patches=VIT_PATCHES,
            has_cls=True,
            variant=spec["variant"],
            dense_pairing=spec["dense_pairing"],
        ).eval()
        caption_tied = spec["dense_pairing"] == "caption"
        d_args = (dense, dlens) if spec["dense"] else (None, None)
        engine = SEPSEngine(matcher)

        def run_engine(matcher=matcher, d_args=d_args, caption_tied=caption_tied, engine=engine):
            return score_matrix(
                matcher,
                img,
                caps,
                lens,
                *d_args,
                txt2img=t2i if caption_tied else None,
                max_memory_mb=max_memory_mb,
                engine=engine,
                progress=progress,
            )

        ref_cols = torch.arange(ref_captions) * (caps.shape[0] // ref_captions)  # spread over lengths

        def run_reference(
            matcher=matcher, d_args=d_args, caption_tied=caption_tied, ref_cols=ref_cols, n=None
        ):
            index = t2i[ref_cols] if caption_tied and d_args[0] is not None else None
            rows = slice(n)
            dense_rows = d_args if caption_tied or d_args[0] is None else (d_args[0][rows], d_args[1][rows])
            return reference_scores(
                matcher, img[rows], caps[ref_cols], lens[ref_cols], *dense_rows, dense_index=index
            )

        def run_engine_count(matcher=matcher, d_args=d_args, caption_tied=caption_tied):
            rows = slice(n_count)
            dense_rows = d_args if caption_tied or d_args[0] is None else (d_args[0][rows], d_args[1][rows])
            return score_matrix(
                matcher,
                img[rows],
                caps,
                lens,
                *dense_rows,
                txt2img=t2i if caption_tied else None,
                max_memory_mb=max_memory_mb,
            )

        sims, ref = run_engine(), run_reference()  # warm-up, and the exactness check of this input
        engine_s, ref_s = math.inf, math.inf
        for _ in range(repeats):  # interleaved: both see the same machine state
            engine_s = min(engine_s, _best_time(run_engine, 1))
            ref_s = min(ref_s, _best_time(run_reference, 1))
        with TensorMemoryMeter() as meter:
            run_engine()
        engine_flops = count_flops(run_engine_count) / (n_count * caps.shape[0])
        ref_flops = count_flops(lambda run=run_reference: run(n=n_count)) / (n_count * ref_cols.numel())
        engine_pair_s, ref_pair_s = engine_s / n_pairs, ref_s / ref.numel()
        entry = {
            "max_abs_diff_vs_reference": (sims[:, ref_cols] - ref).abs().max().item(),
            "engine_us_per_pair": 1e6 * engine_pair_s,
            "reference_us_per_pair": 1e6 * ref_pair_s,
            "speedup": ref_pair_s / engine_pair_s,
            "engine_pairs_per_s": 1 / engine_pair_s,
            "engine_mflop_per_pair": engine_flops / 1e6,
            "reference_mflop_per_pair": ref_flops / 1e6,
            "engine_gflops": engine_flops / engine_pair_s / 1e9,
            "reference_gflops": ref_flops / ref_pair_s / 1e9,
            "engine_peak_tensor_mb": meter.peak_bytes / (1 << 20),
            "plan": {
                "image_block": engine.last_plan.image_block,
                "text_block": engine.last_plan.text_block,
                "dense_block": engine.last_plan.dense_block,
                **engine.last_plan.details,
            },
            "f30k_engine_s": F30K_IMAGES * F30K_CAPTIONS * engine_pair_s,
            "f30k_reference_s": F30K_IMAGES * F30K_CAPTIONS * ref_pair_s,
            "coco5k_engine_s": COCO_IMAGES * COCO_CAPTIONS * engine_pair_s,
        }
        if rss and name == configs[0]:
            entry["engine_rss_growth_mb"] = _measure_rss(name, images, caption_images, max_memory_mb, data)
        result["configs"][name] = entry
        _logger.info("%s: %s", name, {k: v for k, v in entry.items() if k != "plan"})
    result["peak_gflops_end"] = matmul_peak_gflops()
    result["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return result


def format_scoring(result: dict[str, Any]) -> str:
    """Markdown table of :func:`run_scoring` results."""
    peak = max(result["peak_gflops"], result.get("peak_gflops_end", 0.0))
    lines = [
        "| config | engine us/pair | reference us/pair | speed-up "
        "| GFLOP/s engine / reference (% of peak) | MFLOP/pair engine / reference | peak tensor MiB "
        "| F30K 1000x5000 engine / reference | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in result["configs"].items():
        gflops = (
            f"{e['engine_gflops']:.1f} / {e['reference_gflops']:.1f} ({100 * e['engine_gflops'] / peak:.0f}%)"
        )
        f30k = f"{_duration(e['f30k_engine_s'])} / {_duration(e['f30k_reference_s'])}"
        lines.append(
            f"| {name} | {e['engine_us_per_pair']:.1f} | {e['reference_us_per_pair']:.0f} | "
            f"**{e['speedup']:.1f}x** | {gflops} | "
            f"{e['engine_mflop_per_pair']:.1f} / {e['reference_mflop_per_pair']:.1f} | "
            f"{e['engine_peak_tensor_mb']:.0f} | {f30k} | {e['max_abs_diff_vs_reference']:.1e} |"
        )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# ---------------------------------------------------------------------------------------------- two-stage
def _quick_model(work_dir: Path, time_budget_s: float, steps: int = 0):
    """Train the demo recipe (paper SEPS, leak-free dense) briefly; returns the run directory."""
    from patchword.config import apply_overrides
    from patchword.demo import DEMO_OVERRIDES
    from patchword.train.config import RunConfig
    from patchword.train.run import train_run

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or threads)  # training uses every core; timing may use fewer
    cfg = apply_overrides(
        RunConfig(),
        [
            *DEMO_OVERRIDES,
            "name=bench-two-stage",
            f"output_dir={work_dir}",
            f"train.time_budget_s={0 if steps else time_budget_s}",
            f"train.max_steps={steps}",
            "progress=false",
        ],
    )
    try:
        train_run(cfg)
    finally:
        torch.set_num_threads(threads)
    return work_dir / cfg.name


def _load_run(run_dir: Path, checkpoint: str):
    from patchword.config import load_config
    from patchword.data.vocab import WordVocab
    from patchword.model import build_model
    from patchword.train.checkpoint import load_checkpoint
    from patchword.train.config import RunConfig
    from patchword.train.run import prepare_data

    cfg = load_config(RunConfig, run_dir / "config.yaml", [])
    if not (run_dir / checkpoint).is_file() and (run_dir / "last.pt").is_file():
        checkpoint = "last.pt"
    vocab = run_dir / "vocab.json"
    data = prepare_data(cfg.data, tokenizer=WordVocab.load(vocab) if vocab.is_file() else None)
    model = build_model(cfg.model, vocab_size=data.vocab_size)
    model.load_state_dict(load_checkpoint(run_dir / checkpoint)["model"])
    return cfg, data, model.eval()


def run_two_stage(
    *,
    run_dir: str | None = None,
    checkpoint: str = "best.pt",
    ks: tuple[int, ...] = (16, 64, 128, 256),
    alpha: float = 1.0,
    repeats: int = 2,
    train_seconds: float = 420,
    train_steps: int = 0,
    work_dir: str | None = None,
    max_memory_mb: float = 1024,
    backend: str = "exact",
) -> dict[str, Any]:
    """Exhaustive vs two-stage recall and time on the synthetic test split (see the module docstring)."""
    from patchword.eval import retrieval_metrics, score_matrix, two_stage_scores
    from patchword.eval.scoring import encode_image_tokens, encode_text_tokens

    if run_dir is None:
        base = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="patchword-bench-"))
        run_path = _quick_model(base, train_seconds, train_steps)
        budget = f"{train_steps} steps" if train_steps else f"{train_seconds:.0f} s"
        trained = f"demo recipe trained for {budget} in {run_path}"
    else:
        run_path = Path(run_dir)
        trained = f"run directory {run_path}"
    cfg, data, model = _load_run(run_path, checkpoint)
    split = data.splits["test"]
    with torch.no_grad():
        img = encode_image_tokens(model, split.images, progress=False)
        cap = encode_text_tokens(model, split.cap_ids, split.cap_lens, progress=False)
        dense = dense_lens = None
        if split.dense_ids is not None:
            dense = encode_text_tokens(model, split.dense_ids, split.dense_lens, progress=False)
            dense_lens = split.dense_lens
    args = (model.matcher, img, cap, split.cap_lens, dense, dense_lens)
    kw = {"txt2img": split.txt2img, "max_memory_mb": max_memory_mb}
    exhaustive = score_matrix(*args, **kw)
    exhaustive_s = _best_time(lambda: score_matrix(*args, **kw), repeats)
    base_metrics = retrieval_metrics(exhaustive, split.txt2img)
    rows = [
        {
            "method": "exhaustive",
            "k": None,
            "alpha": 0.0,
            "pairs": exhaustive.numel(),
            "seconds": exhaustive_s,
            **{key: base_metrics[key] for key in ("rsum", "i2t_r1", "t2i_r1")},
        }
    ]
    for k, a in [(k, 0.0) for k in ks] + ([(128, alpha)] if alpha else []):
        res = two_stage_scores(*args, k=k, alpha=a, backend=backend, **kw)
        seconds = _best_time(
            lambda k=k, a=a: two_stage_scores(*args, k=k, alpha=a, backend=backend, **kw), repeats
        )
        metrics = retrieval_metrics(res.sims, split.txt2img)
        rows.append(
            {
                "method": "two-stage",
                "k": k,
                "alpha": a,
                "pairs": res.pairs_scored,
                "seconds": seconds,
                "speedup": exhaustive_s / seconds,
                "rsum_delta": metrics["rsum"] - base_metrics["rsum"],
                **{key: metrics[key] for key in ("rsum", "i2t_r1", "t2i_r1")},
            }
        )
    return {
        "machine": machine_description(),
        "model": {
            "source": trained,
            "matcher": cfg.model.matcher,
            "variant": cfg.model.variant,
            "dense_pairing": cfg.model.dense_pairing,
            "embed_dim": cfg.model.embed_dim,
            "image_tokens": list(img.shape[1:]),
            "test_images": img.shape[0],
            "test_captions": cap.shape[0],
        },
        "backend": backend,
        "rows": rows,
    }


def format_two_stage(result: dict[str, Any]) -> str:
    lines = [
        "| method | k | alpha | pairs scored | seconds | speed-up | rSum | delta rSum | i2t R@1 | t2i R@1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['method']} | {r['k'] or 'all'} | {r['alpha']:g} | {r['pairs']:,} | {r['seconds']:.1f} | "
            f"{r.get('speedup', 1.0):.1f}x | {r['rsum']:.1f} | {r.get('rsum_delta', 0.0):+.1f} | "
            f"{r['i2t_r1']:.1f} | {r['t2i_r1']:.1f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="patchword bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("scoring", "all"):
        p = sub.add_parser(
            name,
            help="score_matrix throughput vs the per-caption reference loop"
            if name == "scoring"
            else "scoring, then two-stage",
        )
        p.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
        p.add_argument(
            "--images",
            type=int,
            default=256,
            help="images of the timed block; the reference loops over captions against all of them, "
            "as the official evaluation does with its 256-image shards",
        )
        p.add_argument("--caption-images", type=int, default=48, help="the 5 captions of this many images")
        p.add_argument("--ref-captions", type=int, default=10, help="captions the reference loop scores")
        p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (best is kept)")
        p.add_argument("--configs", default=",".join(SCORING_CONFIGS), help="comma-separated configs")
        p.add_argument("--max-memory-mb", type=float, default=1024)
        p.add_argument("--data", default=None, help="the shared data folder (default ../shared/data)")
        p.add_argument("--bert-vocab", default="bert-base-uncased", help="BERT vocabulary for dense lengths")
        p.add_argument("--no-rss", action="store_true", help="skip the fresh-process RSS measurement")
        p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
        p.add_argument("--json", type=Path, default=None, help="write the raw results here")
    for name in ("two-stage", "all"):
        p = (
            sub.choices[name]
            if name == "all"
            else sub.add_parser(name, help="two-stage search vs exhaustive")
        )
        if name == "two-stage":
            p.add_argument("--quick", action="store_true")
            p.add_argument("--max-memory-mb", type=float, default=1024)
            p.add_argument("--threads", type=int, default=0)
            p.add_argument("--json", type=Path, default=None)
        p.add_argument(
            "--run-dir", default=None, help="a trained run (default: train the demo recipe briefly)"
        )
        p.add_argument("--checkpoint", default="best.pt")
        p.add_argument("--ks", default="16,64,128,256")
        p.add_argument("--alpha", type=float, default=1.0, help="also run k=128 with alpha*global + fine")
        p.add_argument("--train-seconds", type=float, default=420, help="training time of the quick model")
        p.add_argument(
            "--train-steps", type=int, default=0, help="train this many steps instead (reproducible)"
        )
        p.add_argument("--work-dir", default=None, help="where the quick model is trained")
        p.add_argument("--backend", default="exact", choices=["exact", "faiss_flat", "faiss_hnsw"])
        p.add_argument("--two-stage-repeats", type=int, default=2)
    probe = sub.add_parser("_rss")  # internal: one run in a fresh process
    probe.add_argument("--config", required=True)
    probe.add_argument("--images", type=int, required=True)
    probe.add_argument("--caption-images", type=int, required=True)
    probe.add_argument("--max-memory-mb", type=float, required=True)
    probe.add_argument("--data", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``patchword bench {scoring,two-stage,all} [options]``: markdown tables (JSON too with --json)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.what == "_rss":
        _rss_probe(args)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    results: dict[str, Any] = {
        "command": "patchword bench " + " ".join(argv if argv is not None else sys.argv[1:])
    }
    if args.what in ("scoring", "all"):
        quick = args.quick
        scoring = run_scoring(
            images=16 if quick else args.images,
            caption_images=8 if quick else args.caption_images,
            ref_captions=3 if quick else args.ref_captions,
            repeats=1 if quick else args.repeats,
            configs=[c for c in args.configs.split(",") if c],
            max_memory_mb=args.max_memory_mb,
            data=args.data,
            bert_vocab=args.bert_vocab,
            rss=not (quick or args.no_rss),
        )
        results["scoring"] = scoring
        print(format_scoring(scoring))
    if args.what in ("two-stage", "all"):
        quick = args.quick
        two = run_two_stage(
            run_dir=args.run_dir,
            checkpoint=args.checkpoint,
            ks=tuple(int(k) for k in args.ks.split(",")),
            alpha=args.alpha,
            repeats=1 if quick else args.two_stage_repeats,
            train_seconds=30 if quick else args.train_seconds,
            train_steps=args.train_steps,
            work_dir=args.work_dir,
            max_memory_mb=args.max_memory_mb,
            backend=args.backend,
        )
        results["two_stage"] = two
        print(format_two_stage(two))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
