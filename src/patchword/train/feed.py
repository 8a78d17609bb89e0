"""The training batches: every epoch's global batches and this process's shards of them, on the device.

Every process draws the same global batches (a permutation seeded by (seed, epoch), whatever the number of
processes) and loads its contiguous shard of each (:class:`~patchword.data.batches.ShardedBatches`).
Caption augmentation is seeded by (seed, step) and image augmentation by (seed, step, position in the
batch), so a resume that starts mid-epoch sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from patchword.data.batches import ShardBatch, ShardedBatches
from patchword.data.config import DataConfig
from patchword.data.pipeline import EncodedSplit, reads_files
from patchword.distributed import Distributed
from patchword.runs.config import RunConfig
from patchword.train.augment import CaptionAugmenter
from patchword.train.step import usable_cpus

__all__ = ["caption_augmenter", "epoch_batches", "max_text_widths", "shard_loader"]


def caption_augmenter(cfg: RunConfig, split: EncodedSplit, tokenizer) -> CaptionAugmenter | None:
    """The official caption augmentation of ``split`` when the run has it (``data.size_augment``; unset:
    with the BERT tokenizer), else None."""
    augment = cfg.data.size_augment if cfg.data.size_augment is not None else cfg.data.tokenizer == "bert"
    if not augment:
        return None
    if tokenizer is None:
        raise ValueError("data.size_augment needs the tokenizer (Trainer(..., tokenizer=...))")
    return CaptionAugmenter(tokenizer, split, cfg.data.max_caption_len, cfg.data.max_dense_len, cfg.seed)


def epoch_batches(
    num_captions: int, batch_size: int, seed: int, epoch: int, world_size: int
) -> list[torch.Tensor]:
    """The global batches of ``epoch``: caption indices, the same in every process, whatever their number
    (``world_size``)."""
    gen = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(num_captions, generator=gen)
    batches = list(perm.split(batch_size))
    # A one-caption batch has no negatives (and one smaller than the number of processes leaves one
    # without samples): fold it into the previous batch.
    if len(batches) > 1 and batches[-1].numel() < max(2, world_size):
        batches[-2] = torch.cat([batches[-2], batches.pop()])
    return batches


def max_text_widths(data: DataConfig, text_encoder: nn.Module) -> tuple[int, int]:
    """The widest ``train.text_width_multiple`` may pad (captions, dense captions): the data's caps,
    and no more positions than the text encoder has (a GRU has no limit)."""
    limit = getattr(text_encoder, "max_len", None)
    caps = (data.max_caption_len, data.max_dense_len)
    return caps if not isinstance(limit, int) else (min(caps[0], limit), min(caps[1], limit))


def shard_loader(
    cfg: RunConfig,
    split: EncodedSplit,
    batches: list[torch.Tensor],
    dist: Distributed,
    device: torch.device,
    *,
    augmenter: CaptionAugmenter | None,
    epoch: int,
    first: int,
    first_step: int,
    max_widths: tuple[int, int],
) -> Iterator[ShardBatch]:
    """This process's shards of ``epoch``'s ``batches`` from batch ``first`` on (trained at step
    ``first_step``: a resume starts mid-epoch), on ``device``; image files are decoded by
    ``data.num_workers`` worker processes into pinned memory."""
    shards = ShardedBatches(
        split,
        batches,
        dist.shard,
        first=first,
        first_step=first_step,
        seed=cfg.seed,
        text=augmenter,
        mask_false_negatives=cfg.train.mask_false_negatives,
        width_multiple=cfg.train.width_multiple(),
        max_widths=max_widths,
    )
    workers = min(cfg.data.num_workers, usable_cpus()) if reads_files(split.images) else 0
    pin = device.type == "cuda"
    loader = torch.utils.data.DataLoader(
        shards,
        batch_size=None,
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=2 if workers else None,
        # A generator of its own: a DataLoader draws its base seed from the global RNG when it starts
        # iterating, which happens at each epoch start and again at a resume. Drawn from the global RNG,
        # that shifts the in-model random stream (Gumbel noise, dropout) of a resumed run by one draw.
        generator=torch.Generator().manual_seed(cfg.seed * 100003 + epoch),
    )
    for batch in loader:
        yield batch.to(device)
