"""Time the parts of one demo training step (forward + backward, batch 128) on this machine.

    python benchmarks/profile_demo_step.py            # fp32
    python benchmarks/profile_demo_step.py --bf16     # under bfloat16 autocast

Prints seconds per call (best of 3 after a warm-up) for: the global step, the full paper-SEPS step, and
the image encoder, caption encoder, dense-caption encoder and SEPS head on their own.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from patchword.model import build_model
from patchword.recipes.demo import demo_config
from patchword.train.runner import prepare_data


def best_of(fn, repeats: int = 3) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bf16", action="store_true", help="run under bfloat16 autocast")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    cfg = demo_config()
    data = prepare_data(cfg.data)
    train = data.splits["train"]
    model = build_model(cfg.model, vocab_size=data.vocab_size)
    cap_idx = torch.randperm(len(train.cap_lens))[: args.batch]
    img_idx = train.txt2img[cap_idx]
    images = train.images.batch(img_idx, train=True)
    lens = train.cap_lens[cap_idx]
    ids = train.cap_ids[cap_idx, : int(lens.max())]
    dense_lens = train.dense_lens[img_idx]
    dense_ids = train.dense_ids[img_idx, : int(dense_lens.max())]
    img = model.encode_images(images).detach().requires_grad_()
    cap = model.encode_texts(ids, lens).detach().requires_grad_()
    dense = model.encode_texts(dense_ids, dense_lens).detach().requires_grad_()
    parts = {
        "global step": lambda: model.global_sims(images, ids, lens).sum().backward(),
        "full SEPS step": lambda: model(images, ids, lens, dense_ids, dense_lens).sims.sum().backward(),
        "image encoder": lambda: model.encode_images(images).sum().backward(),
        "caption encoder": lambda: model.encode_texts(ids, lens).sum().backward(),
        "dense-caption encoder": lambda: model.encode_texts(dense_ids, dense_lens).sum().backward(),
        "SEPS head": lambda: model.matcher(img, cap, lens, dense, dense_lens).sims.sum().backward(),
    }
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    print(
        f"{torch.get_num_threads()} threads, {'bf16 autocast' if args.bf16 else 'fp32'}, batch {args.batch}"
    )
    for name, fn in parts.items():
        with ctx:
            print(f"{name}: {best_of(fn):.3f} s")


if __name__ == "__main__":
    main()
