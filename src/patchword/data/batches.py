"""Training batches: one process's shard of each global batch of an epoch, built on the CPU from an
:class:`~patchword.data.pipeline.EncodedSplit` (text sliced or augmented, images decoded with their own
seeds), the same in every process and DataLoader worker and after a resume."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from patchword.data.pipeline import EncodedSplit, load_images, train_image_seeds

__all__ = ["BatchText", "ShardBatch", "ShardedBatches", "pad_width"]


@dataclass
class ShardBatch:
    """One process's shard of a global training batch of B captions (b of them here), CPU or device.

    With one process the shard is the whole batch (b = B).
    """

    images: torch.Tensor  # (b, 3, H, W) images or (b, R, D) regions of this shard's captions
    ids: torch.Tensor  # (b, L) caption ids, padded to the longest caption of the *global* batch (or
    # further, to a multiple: ShardedBatches' width_multiple)
    lens: torch.Tensor  # (b,)
    lens_all: torch.Tensor  # (B,) every caption's length
    img_ids: torch.Tensor  # (B,) image index of every sample: pairs sharing an image are not negatives
    ignore: torch.Tensor | None = None  # (B, B) bool: known false negatives
    dense_ids: torch.Tensor | None = None  # (b, L_d) dense caption of each of this shard's images
    dense_lens: torch.Tensor | None = None  # (b,)
    dense_lens_all: torch.Tensor | None = None  # (B,)

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ShardBatch:
        """The batch with ``fn`` applied to every tensor."""
        return ShardBatch(**{f.name: _map_optional(fn, getattr(self, f.name)) for f in fields(self)})

    def pin_memory(self) -> ShardBatch:  # DataLoader(pin_memory=True) calls it
        return self.map(torch.Tensor.pin_memory)

    def to(self, device: torch.device) -> ShardBatch:
        return self.map(lambda t: t.to(device, non_blocking=True))


def _map_optional(fn, value):
    return None if value is None else fn(value)


#: ``text(cap_idx, img_idx, step) -> (ids, lens, dense_ids, dense_lens)`` of a whole global batch
#: (the train-time caption augmentation, the trainer's ``CaptionAugmenter``).
BatchText = Callable[[torch.Tensor, torch.Tensor, int], tuple]


class ShardedBatches(torch.utils.data.Dataset):
    """This process's shards of the global batches ``first, first + 1, ...`` of one epoch, built on the
    CPU: item k is the :class:`ShardBatch` of batch ``first + k``, trained at step ``first_step + k``.

    Everything a shard holds is a function of (seed, step, position in the global batch): the text of
    the whole batch is built (and augmented) in order, then sliced, and every image's augmentation has
    its own seed (:func:`train_image_seeds`), so the shards of all processes together are exactly the
    batch a single process would load, in any DataLoader worker.

    Args:
        split: the training split.
        batches: the epoch's global batches, caption indices (the same in every process).
        shard: ``batch_size -> (lo, hi)``, this process's block of a global batch.
        first, first_step: the first batch to load and its step (a resumed run starts mid-epoch).
        seed: the run's seed (image augmentation).
        text: the caption augmentation of a global batch, or None for the pre-tokenised text.
        mask_false_negatives: include the dataset's (B, B) false-negative mask when it has one.
        width_multiple: pad the caption and dense-caption ids of a global batch to a multiple of this many
            positions (:func:`pad_width`; 1: to the batch's longest row), at most ``max_widths``.
        max_widths: (captions, dense captions): the widest the padding may make them (``data.max_caption_len``
            and ``data.max_dense_len``), None for no cap; never narrower than the batch's longest row.
    """

    def __init__(
        self,
        split: EncodedSplit,
        batches: Sequence[torch.Tensor],
        shard: Callable[[int], tuple[int, int]],
        *,
        first: int = 0,
        first_step: int = 0,
        seed: int = 0,
        text: BatchText | None = None,
        mask_false_negatives: bool = True,
        width_multiple: int = 1,
        max_widths: tuple[int, int] | None = None,
    ) -> None:
        self.split, self.batches, self.shard = split, list(batches), shard
        self.first, self.first_step, self.seed, self.text = first, first_step, seed, text
        self.mask = mask_false_negatives and split.fits is not None
        self.width_multiple, self.max_widths = width_multiple, max_widths

    def __len__(self) -> int:
        return len(self.batches) - self.first

    def __getitem__(self, k: int) -> ShardBatch:
        data, step = self.split, self.first_step + k
        cap_idx = self.batches[self.first + k]
        img_idx = data.txt2img[cap_idx]
        # The text of the whole global batch (trimmed to its longest row, as one process would), then
        # this shard's rows: the caption augmentation draws over the global batch in order.
        if self.text is not None:
            ids, lens, dense_ids, dense_lens = self.text(cap_idx, img_idx, step)
        else:
            lens = data.cap_lens[cap_idx]
            ids = data.cap_ids[cap_idx, : int(lens.max())]
            dense_ids = dense_lens = None
            if data.dense_ids is not None:
                dense_lens = data.dense_lens[img_idx]
                dense_ids = data.dense_ids[img_idx, : int(dense_lens.max())]
        caps = self.max_widths or (None, None)
        ids = pad_width(ids, self.width_multiple, caps[0])
        if dense_ids is not None:
            dense_ids = pad_width(dense_ids, self.width_multiple, caps[1])
        ignore = None
        if self.mask:
            fits = data.fits(cap_idx.numpy(), img_idx.numpy())  # (B_t, B_v)
            ignore = torch.from_numpy(np.ascontiguousarray(fits.T))
        lo, hi = self.shard(cap_idx.numel())
        seeds = train_image_seeds(self.seed, step, range(lo, hi))
        return ShardBatch(
            images=load_images(data.images, img_idx[lo:hi], train=True, seeds=seeds),
            ids=ids[lo:hi],
            lens=lens[lo:hi],
            lens_all=lens,
            img_ids=img_idx,
            ignore=ignore,
            dense_ids=None if dense_ids is None else dense_ids[lo:hi],
            dense_lens=None if dense_lens is None else dense_lens[lo:hi],
            dense_lens_all=dense_lens,
        )


def pad_width(ids: torch.Tensor, multiple: int, cap: int | None = None) -> torch.Tensor:
    """``ids`` (B, L) padded with id 0 to the next multiple of ``multiple`` positions, at most ``cap``
    (None: no cap) and never narrower than L: a compiled training step then meets a handful of text
    widths instead of one per longest caption, and records a CUDA graph for each (PyTorch's advice for
    graphs of many input sizes). The lengths are unchanged; every encoder and matcher ignores positions
    past them."""
    width = ids.shape[1]
    target = -(-width // multiple) * multiple
    if cap is not None:
        target = min(target, max(cap, width))
    return ids if target == width else torch.nn.functional.pad(ids, (0, target - width))
