"""The official train-time caption augmentation applied batch by batch, reproducibly.

SEPS/LAPS re-tokenise every training caption (and, in SEPS, every dense caption) with "size
augmentation": 20% of the words masked, replaced by random tokens or deleted
(:func:`patchword.encoders.size_augment`). The draws here come from a generator seeded by (seed, step),
so a resumed run sees exactly the augmentations an uninterrupted run would have seen.
"""

from __future__ import annotations

import torch

from patchword.data.pipeline import EncodedSplit

__all__ = ["CaptionAugmenter"]


class CaptionAugmenter:
    """Re-tokenises a batch's captions (and dense captions) with the tokenizer's augmentation.

    Args:
        tokenizer: a tokenizer whose ``batch_encode(texts, max_len, augment=True, generator=g)`` augments
            (:class:`~patchword.encoders.BertCaptionTokenizer`).
        split: the training split (its caption and dense-caption texts).
        max_caption_len, max_dense_len: the same caps as the pre-tokenised split.
        seed: the run's seed.
    """

    def __init__(self, tokenizer, split: EncodedSplit, max_caption_len: int, max_dense_len: int, seed: int):
        self.tokenizer, self.split = tokenizer, split
        self.max_caption_len, self.max_dense_len, self.seed = max_caption_len, max_dense_len, seed

    def generator(self, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + step)

    def __call__(
        self, cap_idx: torch.Tensor, img_idx: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(B,) caption and image indices -> augmented (ids, lens) of the captions and of the images'
        dense captions (None when the split has none)."""
        gen = self.generator(step)
        texts = [self.split.captions[i] for i in cap_idx.tolist()]
        ids, lens = self.tokenizer.batch_encode(texts, self.max_caption_len, augment=True, generator=gen)
        dense_ids = dense_lens = None
        if self.split.dense_ids is not None and self.split.dense_captions is not None:
            dense = [self.split.dense_captions[i] for i in img_idx.tolist()]
            dense_ids, dense_lens = self.tokenizer.batch_encode(
                dense, self.max_dense_len, augment=True, generator=gen
            )
        return ids, lens, dense_ids, dense_lens
