"""Figures for a run: the training curve, and retrieved images with the patches the model kept and where one
word of the caption looked (application code: matplotlib is the optional ``plots`` extra)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from patchword.errors import MissingExtraError
from patchword.experiments.fields import NUMBER, check_fields
from patchword.fileio import atomic_write
from patchword.readers import read_json_lines

try:
    from matplotlib.figure import Figure
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError("plots need matplotlib: pip install 'patchword[plots]'") from err

__all__ = [
    "CURVE_FIELDS",
    "curve_records",
    "dev_label",
    "plot_training_curve",
    "plot_retrievals",
    "save_figure",
]

#: What a training curve reads from each record of ``metrics.jsonl``, by its ``split``.
CURVE_FIELDS = {"train": {"step": NUMBER, "loss": NUMBER}, "dev": {"step": NUMBER, "rsum": NUMBER}}

# Words the heat map is not shown for: they carry no content to localise.
_FUNCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "and",
        "is",
        "are",
        "with",
        "there",
        "one",
        "two",
        "three",
        "four",
    ]
)


def curve_records(metrics_jsonl: str | Path) -> tuple[list[dict], list[dict]]:
    """The training and dev records of a metrics log, each checked to hold its step and its loss (rSum):
    a record without one is a DataError naming the file, the record and the field."""
    path = Path(metrics_jsonl)
    found: dict[str, list[dict]] = {"train": [], "dev": []}
    for i, record in enumerate(read_json_lines(path, "metrics log"), start=1):
        split = record.get("split")
        if split in CURVE_FIELDS:
            fields = CURVE_FIELDS[split]
            check_fields(record, fields, f"{path}: record {i} ({split})", required=fields, not_null=fields)
            found[split].append(record)
    return found["train"], found["dev"]


def dev_label(dev: list[dict]) -> str:
    """What the dev curve of records ``dev`` shows: ``dev rSum (300 images)``, the images the validations
    scored (``train.eval_max_images`` may cut the dev split: rSum on fewer images is higher than the whole
    split's), or ``dev rSum`` where the records do not say it (written before they did) or differ."""
    images = {r.get("images") for r in dev}
    return f"dev rSum ({images.pop()} images)" if len(images) == 1 and None not in images else "dev rSum"


def plot_training_curve(metrics_jsonl: str | Path, out: str | Path, title: str = "") -> None:
    """Training loss and dev rSum against optimiser steps."""
    train, dev = curve_records(metrics_jsonl)
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], color="tab:blue", label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss", color="tab:blue")
    ax2 = ax.twinx()
    label = dev_label(dev)
    ax2.plot([r["step"] for r in dev], [r["rsum"] for r in dev], "o-", color="tab:red", label=label)
    ax2.set_ylabel(label, color="tab:red")
    ax.set_title(title or "patchword: training loss and dev rSum")
    fig.tight_layout()
    save_figure(fig, out)


def _content_word(words) -> int:
    """Index of the first content word (not a special, not a function word) of an explanation."""
    for i, w in enumerate(words):
        if not w.special and w.text.lower() not in _FUNCTION_WORDS and w.heat.abs().sum() > 0:
            return i
    return next((i for i, w in enumerate(words) if not w.special), 0)


@torch.no_grad()
def plot_retrievals(
    run, split, raw_images: np.ndarray, out: str | Path, n_queries: int = 3, gallery: int = 200
) -> None:
    """For ``n_queries`` test captions: the top image among the first ``gallery`` test images, the patches
    each selection branch kept (the rest dimmed) and the heat map of one content word (its HRPA cosine
    split over the patches it came from, :func:`patchword.search.explain.explain_pair`).

    Args:
        run: a :class:`~patchword.runs.LoadedRun`.
        split: the run's encoded test split; ``raw_images``: its (N, H, W, 3) uint8 pixels.
    """
    from patchword.eval.protocol import score_split
    from patchword.search.explain import explain_pair
    from patchword.search.query import token_namer

    model, device = run.model, run.device
    split = split.first_images(gallery)
    # the figure's scores in float32 wherever the run is loaded (tf32 exists on CUDA only)
    eval_cfg = dataclasses.replace(run.config.eval, precision="fp32")
    sims = score_split(model, split, eval_cfg, device=device, progress=False)
    queries = np.linspace(0, split.num_captions - 1, n_queries).round().astype(int)
    side = int(round(model.image_encoder.num_patches**0.5))
    name_of = token_namer(run.tokenizer)
    fig = Figure(figsize=(4.2 * n_queries, 8.4))
    for col, q in enumerate(queries):
        best = int(sims[:, q].argmax())
        img = model.encode_images(split.images.batch(torch.tensor([best]), train=False).to(device))[0]
        lens = split.cap_lens[q : q + 1]
        cap = model.encode_texts(split.cap_ids[q : q + 1, : int(lens)].to(device), lens.to(device))[0]
        dense = (None, None)
        if split.dense_ids is not None and model.matcher.consumes_dense:
            dl = split.dense_lens[best : best + 1]
            dense = (
                model.encode_texts(split.dense_ids[best : best + 1, : int(dl)].to(device), dl.to(device))[0],
                int(dl),
            )
        names = [name_of(int(t)) for t in split.cap_ids[q, : int(lens)]]
        exp = explain_pair(model.matcher, img, cap, int(lens), *dense, token_strings=names, grid=(side, side))
        image = raw_images[best]
        cell = image.shape[0] // side
        hit = "correct" if best == int(split.txt2img[q]) else "another image"
        ax = fig.add_subplot(2, n_queries, col + 1)
        ax.imshow(image)
        if exp.branches:
            kept = exp.branches[0].kept.reshape(side, side).numpy()
            dropped = np.kron(1 - kept, np.ones((cell, cell)))
            ax.imshow(np.ma.masked_equal(dropped, 0), cmap="gray_r", alpha=0.55, vmin=0, vmax=1)
        ax.set_title(f"{split.captions[q]}\n(top-1 of {split.num_images}: {hit}); kept patches", fontsize=8)
        ax.axis("off")
        w = exp.words[_content_word(exp.words)]
        heat = np.kron(w.heat.reshape(side, side).numpy(), np.ones((cell, cell)))
        ax = fig.add_subplot(2, n_queries, n_queries + col + 1)
        ax.imshow(image)
        ax.imshow(heat, cmap="magma", alpha=0.6)
        ax.set_title(f'where "{w.text}" matched (best token: {w.best_token})', fontsize=8)
        ax.axis("off")
    fig.suptitle(
        "top: retrieved image, dimmed patches were dropped by patch selection; "
        "bottom: one word's HRPA cosine split over the patches",
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, out)


def save_figure(fig, out: str | Path) -> None:
    """Write a matplotlib figure as PNG atomically (a kill or a full disk leaves the previous file)."""
    atomic_write(out, lambda fh: fig.savefig(fh, format="png", dpi=110))
