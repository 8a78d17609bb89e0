"""Does patch selection find the objects? Recall of the object patches among the kept patches.

A selection matcher (SEPS / LAPS) keeps K of the N patches of each (image, caption) pair and reports its
choice as ``MatcherOutput.decisions``: one (B_v, B_t, N) or (B_v, 1, N) mask per selection branch. On the
synthetic scenes the generator knows which patches each object covers
(:func:`patchword.data.synthetic.split_object_patches`), so two numbers say whether the selection looks at
the objects:

* ``selection_object_recall``: the share of object patches that are kept (%);
* ``selection_chance``: the share of all patches that are kept (%), which is the expected object recall of
  a selection that ignores the image (K random patches of N keep K/N of the object patches on average);
* ``selection_lift``: their ratio (1 = no better than chance).

Shares are pooled over all pairs (object patches kept / object patches), so a pair counts by its number of
object patches, and chance is exactly what a random K-of-N selection scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from patchword.progress import progress_bar

__all__ = [
    "SelectionCounts",
    "selection_metrics",
    "selection_branch_names",
    "evaluate_selection",
    "synthetic_selection_report",
]


def selection_branch_names(matcher, n: int) -> tuple[str, ...]:
    """Names of a matcher's ``n`` selection branches (``Matcher.selection_branches``, SEPS's names without
    a matcher; ``branch{i}`` for branches left unnamed)."""
    declared = tuple(matcher.selection_branches) if matcher is not None else ("caption", "dense")
    return declared[:n] + tuple(f"branch{i}" for i in range(len(declared), n))


@dataclass
class SelectionCounts:
    """Pooled patch counts of one selection branch (add blocks of pairs, then read the metrics)."""

    kept_object: int = 0  # object patches kept
    object: int = 0  # object patches
    kept: int = 0  # patches kept
    total: int = 0  # patches

    def add(self, decision: torch.Tensor | np.ndarray, object_mask: torch.Tensor | np.ndarray) -> None:
        """Count a block: ``decision`` (..., N) kept mask (> 0.5 is kept), ``object_mask`` (..., N) bool,
        broadcast against each other (e.g. (B_v, B_t, N) decisions with (B_v, 1, N) masks)."""
        keep, obj = torch.broadcast_tensors(
            torch.as_tensor(decision) > 0.5, torch.as_tensor(object_mask).bool()
        )
        self.kept_object += int((keep & obj).sum())
        self.object += int(obj.sum())
        self.kept += int(keep.sum())
        self.total += keep.numel()

    def metrics(self) -> dict[str, float]:
        """``selection_object_recall`` and ``selection_chance`` (%) and ``selection_lift`` (ratio)."""
        if self.object == 0:
            raise ValueError("no object patches were counted: selection recall is undefined")
        recall = 100.0 * self.kept_object / self.object
        chance = 100.0 * self.kept / self.total
        return {
            "selection_object_recall": recall,
            "selection_chance": chance,
            "selection_lift": recall / chance if chance > 0 else float("nan"),
        }


def selection_metrics(
    decisions: Sequence[torch.Tensor | np.ndarray],
    object_masks: torch.Tensor | np.ndarray,
    names: Sequence[str] | None = None,
) -> dict[str, dict[str, float]]:
    """Selection quality of each branch.

    Args:
        decisions: one kept mask per branch, (..., N) (bool or {0, 1} floats; > 0.5 is kept), e.g. a
            matcher's (B_v, B_t, N) decisions, or (P, N) for P pairs.
        object_masks: (..., N) bool, the patches covered by objects, broadcastable against every decision
            (e.g. (B_v, 1, N) for the images of (B_v, B_t, N) decisions, or (P, N) for P pairs).
        names: branch names (default ``caption``, ``dense``, as :func:`selection_branch_names`).
    Returns:
        ``{branch: {"selection_object_recall", "selection_chance", "selection_lift"}}``.
    """
    names = tuple(names) if names is not None else selection_branch_names(None, len(decisions))
    if len(names) != len(decisions):
        raise ValueError(f"{len(decisions)} decision masks but {len(names)} branch names")
    out = {}
    for name, decision in zip(names, decisions, strict=True):
        counts = SelectionCounts()
        counts.add(decision, object_masks)
        out[name] = counts.metrics()
    return out


@torch.no_grad()
def evaluate_selection(
    model,
    split,
    object_masks: np.ndarray | torch.Tensor,
    *,
    image_block: int = 16,
    device: torch.device | str = "cpu",
    progress: bool | None = None,
) -> dict[str, dict[str, float]]:
    """Selection quality of ``model``'s matcher on the (image, ground-truth caption) pairs of ``split``.

    Each block of images is scored against its own captions (and, when the matcher consumes dense text,
    each image's own dense caption, whichever way the matcher pairs it), in eval mode; the decisions of
    the ground-truth pairs are pooled per branch.

    Args:
        model: a :class:`~patchword.model.RetrievalModel` whose matcher selects patches.
        split: an ``EncodedSplit`` (images, tokenised captions and dense captions, ``txt2img``).
        object_masks: (N_img, N) bool, the patches each image's objects cover, N = the matcher's patch
            count (e.g. ``split_object_patches(...).any(1)``).
        image_block: images per matcher call (pairs scored per call: image_block x its captions).
    Returns:
        ``{branch: metrics}`` as :func:`selection_metrics`; empty when the matcher selects no patches.
    """
    masks = torch.as_tensor(np.asarray(object_masks, bool))
    if masks.dim() != 2 or masks.shape[0] != split.num_images:
        raise ValueError(
            f"object_masks must have shape ({split.num_images}, N_patches), got {tuple(masks.shape)}"
        )
    matcher = model.matcher
    use_dense = split.dense_ids is not None and matcher.consumes_dense
    caption_tied = matcher.dense_pairing == "caption"
    txt2img = split.txt2img
    counts: list[SelectionCounts] | None = None
    was_training = model.training
    model.eval()
    try:
        with progress_bar(split.num_images, "selection quality", progress, unit="image") as bar:
            for i0 in range(0, split.num_images, image_block):
                rows = torch.arange(i0, min(i0 + image_block, split.num_images))
                cols = ((txt2img >= i0) & (txt2img < i0 + len(rows))).nonzero().squeeze(1)
                img = model.encode_images(split.images.batch(rows, train=False).to(device, non_blocking=True))
                # Lengths stay on the host: the encoder and the matcher check them there and upload them
                # (a device copy was read back by both, several waits per block); widths are host numbers.
                cap_lens = split.cap_lens[cols]
                width = int(cap_lens.max())
                cap = model.encode_texts(split.cap_ids[cols, :width].to(device, non_blocking=True), cap_lens)
                dense = dense_lens = None
                if use_dense:
                    owners = txt2img[cols] if caption_tied else rows
                    dense_lens = split.dense_lens[owners]
                    ids = split.dense_ids[owners, : int(dense_lens.max())].to(device, non_blocking=True)
                    dense = model.encode_texts(ids, dense_lens)
                decisions = matcher(img, cap, cap_lens, dense, dense_lens).decisions
                if not decisions:
                    return {}
                if counts is None:
                    counts = [SelectionCounts() for _ in decisions]
                if decisions[0].shape[-1] != masks.shape[1]:
                    raise ValueError(
                        f"the matcher selects among {decisions[0].shape[-1]} patches but object_masks has "
                        f"{masks.shape[1]}: make the masks on the encoder's patch grid"
                    )
                # The ground-truth pair of caption j is (its image's row in the block, j).
                own = (txt2img[cols] - i0).to(decisions[0].device, non_blocking=True)
                for branch, decision in zip(counts, decisions, strict=True):
                    pairs = torch.arange(len(cols), device=own.device) if decision.shape[1] > 1 else 0
                    branch.add(decision[own, pairs].cpu(), masks[txt2img[cols]])
                bar.update(len(rows))
    finally:
        model.train(was_training)
    if counts is None:
        return {}
    names = selection_branch_names(matcher, len(counts))
    return {name: branch.metrics() for name, branch in zip(names, counts, strict=True)}


def synthetic_selection_report(model, split, data_config, split_name: str, *, device="cpu", progress=None):
    """Selection quality on a synthetic split, flattened for a metrics file:
    ``{"selection_object_recall": {branch: %}, "selection_chance": {branch: %}}`` (empty when the matcher
    selects nothing or the image encoder does not see the generator's pixels on a square patch grid).

    The object masks come from the generator's own geometry (:mod:`patchword.data.synthetic.geometry`).
    """
    import math

    from patchword.data.synthetic import SyntheticScenes, split_object_patches

    encoder = model.image_encoder
    n = encoder.num_patches
    grid = math.isqrt(n)
    syn = data_config.synthetic_config()
    if model.matcher.selection_ratio is None or grid * grid != n or encoder.image_size != syn.image_size:
        return {}
    scenes = SyntheticScenes.load_or_generate(syn, cache_dir=data_config.cache_dir or None)[split_name].scenes
    masks = split_object_patches(scenes, syn, split_name, grid).any(1)
    per_branch = evaluate_selection(model, split, masks, device=device, progress=progress)
    return {
        key: {branch: metrics[key] for branch, metrics in per_branch.items()}
        for key in ("selection_object_recall", "selection_chance")
    }
