"""densify throughput: images/s of the tiny model on CPU, and of real-size LLaVA shapes on a GPU.

Usage (each writes ``<out>/densify_<what>.md`` and ``.json``; the markdown is what docs/ quote)::

    # CPU, the tiny-random smoke-test model, end to end through densify() (file writes and fsync included)
    python benchmarks/densify_bench.py tiny-cpu --images 64 --batch-sizes 1 8 32 --max-new-tokens 32

    # GPU, random-init LLaVA-1.5-7B shapes (CLIP ViT-L/14-336 + Llama-7B, 576 image tokens) in bf16
    python benchmarks/densify_bench.py llava --arch llava-1.5-7b --batch-sizes 1 8 32 --max-new-tokens 128
    python benchmarks/densify_bench.py llava --arch llava-1.5-13b ...   # SEPS used a 13B LLaVA

The ``llava`` mode builds the model from its config with random weights directly on the GPU (no
download) and a word-level tokenizer of the same vocabulary size, so prompt length (576 image tokens plus
the SEPS prompt), weights, KV cache and decoding cost are those of the real model; only the words are
nonsense. Every image generates exactly ``--max-new-tokens`` tokens (end of text is suppressed until
then): SEPS's LLaVA descriptions average ~100 words, about 130 Llama tokens, hence the default 128.
Reported per batch size: images/s and generated tokens/s of ``generate`` (the processor runs before the
clock starts, as densify overlaps it with generation on a background thread), the processor's own images/s
on the CPU, and peak GPU memory (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from patchword.densify import GenerationSettings, densify, images_from_synthetic, load_vlm, read_records
from patchword.densify.vlm import VisionLanguageModel

ROOT = Path(__file__).resolve().parents[1]

# Real-size LLaVA-1.5 shapes (the llava-hf configs): vision tower, projector and language model.
ARCHS = {
    "llava-1.5-7b": {"hidden": 4096, "intermediate": 11008, "layers": 32, "heads": 32},
    "llava-1.5-13b": {"hidden": 5120, "intermediate": 13824, "layers": 40, "heads": 40},
}
VOCAB = 32064  # llava-hf's Llama vocabulary, <image> at 32000
IMAGE_TOKEN = 32000


# --------------------------------------------------------------------------------------------------------
# tiny model, CPU, end to end
# --------------------------------------------------------------------------------------------------------


def bench_tiny_cpu(args: argparse.Namespace) -> list[dict]:
    from patchword.data.synthetic import SyntheticConfig

    torch.set_num_threads(args.threads)
    images = images_from_synthetic("test", SyntheticConfig(num_test=args.images))
    vlm = load_vlm("tiny-random", device=torch.device("cpu"), precision="fp32")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up: first-call costs (allocations, lazy imports) are not part of steady throughput
        densify(images, vlm, Path(tmp) / "warmup.jsonl", settings, batch_size=8, progress=False)
        for batch in args.batch_sizes:
            result = densify(
                images, vlm, Path(tmp) / f"b{batch}.jsonl", settings, batch_size=batch, progress=False
            )
            tokens = sum(r.metadata["new_tokens"] for r in read_records(result.out)[0])
            rows.append(
                {
                    "batch_size": batch,
                    "images": result.generated,
                    "seconds": round(result.generate_seconds, 3),
                    "images_per_s": round(result.generated / result.generate_seconds, 2),
                    "tokens_per_s": round(tokens / result.generate_seconds, 1),
                }
            )
            print(rows[-1], flush=True)
    return rows


# --------------------------------------------------------------------------------------------------------
# real-size LLaVA shapes, GPU
# --------------------------------------------------------------------------------------------------------


def _big_tokenizer():
    from patchword.densify.tiny import word_level_tokenizer

    tokens = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, IMAGE_TOKEN)] + ["<image>", "<pad>"]
    tokens += [f"x{i}" for i in range(len(tokens), VOCAB)]
    return word_level_tokenizer(tokens)


def build_llava(arch: str, device: torch.device, dtype: torch.dtype):
    """Random-init LLaVA-1.5 of real size on ``device`` and a processor with its vocabulary size."""
    import transformers
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    shape = ARCHS[arch]
    vision = CLIPVisionConfig(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        image_size=336,
        patch_size=14,
        projection_dim=768,
    )
    text = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["heads"],
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        pad_token_id=IMAGE_TOKEN + 1,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=576,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = LlavaForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(previous)
    image_cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    processor = LlavaProcessor(
        image_processor=image_cls(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
        tokenizer=_big_tokenizer(),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return model, processor


def bench_llava(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    start = time.perf_counter()
    model, processor = build_llava(args.arch, device, dtype)
    build_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    vlm = VisionLanguageModel(model, processor, args.arch + "-random", device, args.precision)
    # exactly max_new_tokens per image, as if every description were that long
    vlm.model.generation_config.min_new_tokens = args.max_new_tokens
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    prompt = vlm.prompt_text(settings.prompt)  # no chat template: the LLaVA-1.5 format
    rng = np.random.default_rng(0)
    pool = [
        Image.fromarray(rng.integers(0, 256, size=(375, 500, 3), dtype=np.uint8))
        for _ in range(max(args.batch_sizes))
    ]
    rows = []
    print(f"{args.arch}: {params / 1e9:.2f}B parameters, built in {build_s:.0f} s", flush=True)
    for batch in args.batch_sizes:
        t0 = time.perf_counter()
        inputs = vlm.prepare(pool[:batch], prompt)
        prep_s = time.perf_counter() - t0
        vlm.generate(inputs, settings)  # warm-up (kernels, allocator)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = vlm.generate(inputs, settings)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        assert all(g.new_tokens == args.max_new_tokens for g in out)
        best = min(times)
        rows.append(
            {
                "arch": args.arch,
                "precision": args.precision,
                "batch_size": batch,
                "prompt_tokens": int(inputs["input_ids"].shape[1]),
                "new_tokens": args.max_new_tokens,
                "seconds_per_batch": round(best, 3),
                "seconds_spread": [round(t, 3) for t in times],
                "images_per_s": round(batch / best, 3),
                "tokens_per_s": round(batch * args.max_new_tokens / best, 1),
                "processor_images_per_s_cpu": round(batch / prep_s, 1),
                "peak_gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


# --------------------------------------------------------------------------------------------------------


def _environment(args: argparse.Namespace) -> dict:
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    import transformers

    env["transformers"] = transformers.__version__
    if args.mode == "llava" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    return env


def _markdown(mode: str, rows: list[dict], env: dict) -> str:
    lines = [f"densify benchmark `{mode}` ({', '.join(f'{k} {v}' for k, v in env.items())})", ""]
    if mode == "tiny-cpu":
        lines += ["| batch | images | s | images/s | tokens/s |", "|---|---|---|---|---|"]
        keys = ("batch_size", "images", "seconds", "images_per_s", "tokens_per_s")
        lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    else:
        lines += [
            "| arch | batch | prompt tokens | new tokens | s/batch | images/s | tokens/s | peak GiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        keys = (
            "batch_size",
            "prompt_tokens",
            "new_tokens",
            "seconds_per_batch",
            "images_per_s",
            "tokens_per_s",
        )
        lines += [
            f"| {r['arch']} {r['precision']} | "
            + " | ".join(str(r[k]) for k in keys)
            + f" | {r['peak_gpu_gib']} |"
            for r in rows
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    tiny = sub.add_parser("tiny-cpu", help="tiny-random on the CPU, end to end")
    tiny.add_argument("--images", type=int, default=64)
    tiny.add_argument("--threads", type=int, default=2)
    llava = sub.add_parser("llava", help="real-size random-init LLaVA shapes on a GPU")
    llava.add_argument("--arch", choices=sorted(ARCHS), default="llava-1.5-7b")
    llava.add_argument("--device", default="cuda")
    llava.add_argument("--precision", choices=["bf16", "fp16"], default="bf16")
    llava.add_argument(
        "--repeats", type=int, default=3, help="timed generate calls per batch size (best kept)"
    )
    for p in (tiny, llava):
        p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
        p.add_argument("--max-new-tokens", type=int, default=32 if p is tiny else 128)
        p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    rows = bench_tiny_cpu(args) if args.mode == "tiny-cpu" else bench_llava(args)
    env = _environment(args)
    name = "densify_tiny_cpu" if args.mode == "tiny-cpu" else f"densify_{args.arch}_{args.precision}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(_markdown(args.mode, rows, env))
    print(_markdown(args.mode, rows, env))


if __name__ == "__main__":
    main()
