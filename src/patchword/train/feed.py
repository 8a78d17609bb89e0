"""The training batches: every epoch's global batches and this process's shards of them, on the device.

Every process draws the same global batches (a permutation seeded by (seed, epoch), whatever the number of
processes) and loads its contiguous shard of each (:class:`~patchword.data.batches.ShardedBatches`).
Caption augmentation is seeded by (seed, step) and image augmentation by (seed, step, position in the
batch), so a resume that starts mid-epoch sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from patchword.data.batches import ShardBatch, ShardedBatches
from patchword.data.config import DataConfig
from patchword.data.pipeline import EncodedSplit, reads_files
from patchword.distributed import Distributed
from patchword.errors import USER_ERRORS
from patchword.runs.config import RunConfig
from patchword.train.augment import CaptionAugmenter
from patchword.train.step import usable_cpus

__all__ = ["caption_augmenter", "epoch_batches", "max_text_widths", "shard_block", "shard_loader"]


def caption_augmenter(cfg: RunConfig, split: EncodedSplit, tokenizer) -> CaptionAugmenter | None:
    """The official caption augmentation of ``split`` when the run has it (``data.size_augment``; unset:
    with the BERT tokenizer), else None."""
    augment = cfg.data.size_augment if cfg.data.size_augment is not None else cfg.data.tokenizer == "bert"
    if not augment:
        return None
    if tokenizer is None:
        raise ValueError("data.size_augment needs the tokenizer (Trainer(..., tokenizer=...))")
    return CaptionAugmenter(tokenizer, split, cfg.data.max_caption_len, cfg.data.max_dense_len, cfg.seed)


def epoch_batches(num_captions: int, batch_size: int, seed: int, epoch: int) -> list[torch.Tensor]:
    """The global batches of ``epoch``: caption indices, the same in every process, whatever their number.

    The number of processes plays no part, so that a run and its resume with any number of processes
    train the same batches: a batch of fewer captions than processes (an epoch's last, or each one of a
    training split that small) leaves some of them without rows, and each of those loads a stand-in row
    that the step drops (:func:`shard_block`)."""
    gen = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(num_captions, generator=gen)
    batches = list(perm.split(batch_size))
    # A one-caption batch has no negatives: fold it into the previous batch.
    if len(batches) > 1 and batches[-1].numel() < 2:
        batches[-2] = torch.cat([batches[-2], batches.pop()])
    return batches


def shard_block(dist: Distributed) -> Callable[[int], tuple[int, int]]:
    """``n -> [lo, hi)``: the rows of a global batch of ``n`` captions this process loads: its shard, or
    where the shard is empty (a batch of fewer captions than processes) a stand-in copy of the
    batch's last row, which the step drops after gathering (:class:`~patchword.train.step.ShardLoss`)."""

    def block(n: int) -> tuple[int, int]:
        lo, hi = dist.shard(n)
        return (lo, hi) if hi > lo else (n - 1, n)

    return block


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
        shard_block(dist),
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
        WorkerErrorsAsItems(shards) if workers else shards,
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
        if isinstance(batch, WorkerError):
            batch.reraise()
        yield batch.to(device)


@dataclass
class WorkerError:
    """A user error (a damaged image file, data.check_images=false) raised in a DataLoader worker, sent
    to the training process as an item. Raised in the worker, torch would re-raise it as its own type with
    a message of 30 lines ("Caught DataError in DataLoader worker process 0. Original Traceback..."),
    which the command line would print whole instead of the error's one line.

    Attributes:
        kind: the error's type; message: its text; pickled: the error itself when it pickles (its
            attributes too: an OSError's errno and path), else None; trace: the worker's traceback.
    """

    kind: type[BaseException]
    message: str
    pickled: bytes | None
    trace: str

    @classmethod
    def of(cls, err: BaseException) -> WorkerError:
        try:
            pickled = pickle.dumps(err)
            pickle.loads(pickled)  # some errors pickle but do not unpickle (ConfigError's two arguments)
        except Exception:
            pickled = None
        kind = type(err)
        try:
            pickle.dumps(kind)
        except Exception:  # a class defined where the training process cannot import it: its base
            kind = next(base for base in (*USER_ERRORS, OSError) if isinstance(err, base))
        return cls(kind, str(err), pickled, "".join(traceback.format_exception(err)))

    def reraise(self) -> None:
        """Raise the worker's error again: the same type and message."""
        if self.pickled is not None:
            err = pickle.loads(self.pickled)
        else:  # the type without its __init__, holding the message (str() gives it back)
            err = self.kind.__new__(self.kind)
            err.args = (self.message,)
        if hasattr(err, "add_note"):  # Python 3.11+: shown by a traceback (--verbose), not by str()
            err.add_note(f"raised in a DataLoader worker process:\n{self.trace}")
        raise err


class WorkerErrorsAsItems(torch.utils.data.Dataset):
    """``dataset``'s items, or a :class:`WorkerError` in place of one whose loading raised a user error
    (:data:`~patchword.errors.USER_ERRORS`, or an operating-system error such as a permission): the
    training process re-raises it as it was (:func:`shard_loader`). Other exceptions are bugs and keep
    torch's wrapping, with the worker's traceback."""

    def __init__(self, dataset: torch.utils.data.Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, k: int) -> ShardBatch | WorkerError:
        try:
            return self.dataset[k]
        except (*USER_ERRORS, OSError) as err:
            return WorkerError.of(err)
