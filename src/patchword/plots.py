"""Figures for a run: the training curve and retrieved images with their kept patches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("plots need matplotlib: pip install 'patchword[plots]'") from err

__all__ = ["plot_training_curve", "plot_retrievals"]


def plot_training_curve(metrics_jsonl: str | Path, out: str | Path) -> None:
    """Training loss and dev rSum against optimiser steps."""
    records = [json.loads(line) for line in Path(metrics_jsonl).read_text().splitlines() if line.strip()]
    train = [r for r in records if r["split"] == "train"]
    dev = [r for r in records if r["split"] == "dev"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], color="tab:blue", label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (summed hinge)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot([r["step"] for r in dev], [r["rsum"] for r in dev], "o-", color="tab:red", label="dev rSum")
    ax2.set_ylabel("dev rSum", color="tab:red")
    ax.set_title("patchword demo: SEPS (paper variant) on synthetic scenes")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


@torch.no_grad()
def plot_retrievals(
    cfg, data, run_dir: Path, out: str | Path, n_queries: int = 3, gallery: int = 200
) -> None:
    """For ``n_queries`` test captions: the top image among the first ``gallery`` test images, with the
    patches the model kept for that caption (dropped patches dimmed)."""
    from patchword.eval.protocol import score_split
    from patchword.model import build_model
    from patchword.train.checkpoint import load_checkpoint

    model = build_model(cfg.model, vocab_size=data.vocab_size)
    model.load_state_dict(load_checkpoint(run_dir / "best.pt")["model"])
    model.eval()
    split = data.splits["test"].first_images(gallery)
    raw_images = data.raw["test"].images
    sims = score_split(model, split, cfg.eval)
    queries = np.linspace(0, split.num_captions - 1, n_queries).round().astype(int)
    side = int(round(model.image_encoder.num_patches**0.5))
    fig, axes = plt.subplots(1, n_queries, figsize=(4 * n_queries, 4.6))
    for ax, q in zip(np.atleast_1d(axes), queries, strict=True):
        best = int(sims[:, q].argmax())
        keep = _kept_patches(model, split, int(q), best)
        image = raw_images[best]
        cell = image.shape[0] // side
        ax.imshow(image)
        dropped = np.kron(1 - keep.reshape(side, side), np.ones((cell, cell)))
        # kept patches are masked out of the overlay, so only dropped ones are dimmed
        ax.imshow(np.ma.masked_equal(dropped, 0), cmap="gray_r", alpha=0.5, vmin=0, vmax=1)
        hit = "correct" if best == int(split.txt2img[q]) else "wrong image"
        ax.set_title(f"{split.captions[q]}\n(top-1 of {split.num_images}: {hit})", fontsize=8, wrap=True)
        ax.axis("off")
    fig.suptitle("retrieved image per caption; dimmed patches were dropped by patch selection", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _kept_patches(model, split, caption: int, image: int) -> np.ndarray:
    """(N,) 0/1 mask of the patches the matcher keeps for (image, caption); all ones without selection."""
    tokens = model.encode_images(split.images.batch(torch.tensor([image]), train=False))
    lens = split.cap_lens[caption : caption + 1]
    cap = model.encode_texts(split.cap_ids[caption : caption + 1, : int(lens)], lens)
    dense = (None, None)
    if split.dense_ids is not None:
        dl = split.dense_lens[image : image + 1]
        dense = (model.encode_texts(split.dense_ids[image : image + 1, : int(dl)], dl), dl)
    out = model.matcher(tokens, cap, lens, *dense)
    if not out.decisions:
        return np.ones(model.image_encoder.num_patches)
    return out.decisions[0][0, 0].float().numpy()
