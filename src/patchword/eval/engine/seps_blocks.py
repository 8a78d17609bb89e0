"""The blocks of texts and images the SEPS scoring engine (:mod:`patchword.eval.engine.seps`) works on:
per-text and per-image precomputations, the token sets of a block of pairs, and the cut of a
length-sorted text list into blocks."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from patchword.matching.aggregation import TokenAggregation
from patchword.matching.ops import l2norm, length_mask, masked_mean

__all__ = [
    "MIN_BUCKET",
    "ImageBlock",
    "ImagePart",
    "PackedTexts",
    "Selection",
    "Texts",
    "TokenSet",
    "length_blocks",
]

# Text blocks are cut where the length drops below this fraction of the block's longest text (once the
# block holds MIN_BUCKET texts), so that padding costs little.
BUCKET_SLACK = 0.85
MIN_BUCKET = 32


@dataclass
class Texts:
    """A block of T texts (captions or dense captions), padded to the block's longest."""

    words: torch.Tensor  # (T, L, C) L2-normalised tokens (padding rows are zero)
    valid: torch.Tensor  # (T, L) bool
    n_words: torch.Tensor  # (T,) float valid counts
    guide: torch.Tensor  # (T, C) L2-normalised mean of the raw tokens (selection guide)

    @classmethod
    def build(cls, tokens: torch.Tensor, lens: torch.Tensor, width: int | None = None) -> Texts:
        """(T, L, C) tokens and (T,) lengths; ``width``: the longest length, when the caller knows it on
        the host (reading it from device lengths would make the host wait)."""
        width = int(lens.max()) if width is None else width
        tokens = tokens[:, :width]
        valid = length_mask(lens, width)
        return cls(l2norm(tokens), valid, valid.sum(-1).to(tokens.dtype), l2norm(masked_mean(tokens, lens)))

    @property
    def size(self) -> int:
        return self.words.shape[0]

    @property
    def flat(self) -> torch.Tensor:
        """(T * L, C) view of the unit words."""
        return self.words.reshape(-1, self.words.shape[-1])


@dataclass
class PackedTexts:
    """Unit words and guides of many texts, computed once and packed without padding."""

    words: torch.Tensor  # (W + 1, C) unit words of every text back to back; the last row is zero
    offsets: torch.Tensor  # (N,) first row of each text
    lens: torch.Tensor  # (N,) valid counts
    guide: torch.Tensor  # (N, C)

    @classmethod
    def build(
        cls,
        tokens: torch.Tensor,
        lens: torch.Tensor,
        host_lens: torch.Tensor,
        device,
        dtype,
        chunk: int = 256,
    ) -> PackedTexts:
        """(N, L, C) tokens, their (N,) lengths on the tokens' device and the same on the host (widths
        and the packed layout are planned there: no value is read back from the device)."""
        words, guides = [], []
        for start in range(0, tokens.shape[0], chunk):
            stop = min(start + chunk, tokens.shape[0])
            width = int(host_lens[start:stop].max())
            block = Texts.build(
                tokens[start:stop].to(device=device, dtype=dtype), lens[start:stop].to(device), width
            )
            # the valid words, row-major (text by text, word by word), gathered at positions found on the
            # host (a boolean mask on the device would make the device report how many rows it selected)
            index = length_mask(host_lens[start:stop], width).reshape(-1).nonzero().squeeze(1)
            index = index.to(block.words.device, non_blocking=True)
            words.append(block.words.reshape(-1, block.words.shape[-1]).index_select(0, index))
            guides.append(block.guide)
        words.append(torch.zeros(1, tokens.shape[2], dtype=dtype, device=device))
        lens = lens.to(device)
        return cls(torch.cat(words), torch.cumsum(lens, 0) - lens, lens, torch.cat(guides))

    def block(self, cols: torch.Tensor, width: int | None = None) -> Texts:
        """The texts ``cols`` as a padded block (one row gather); ``width``: their longest length, when
        the caller knows it on the host."""
        lens = self.lens[cols]
        width = int(lens.max()) if width is None else width
        pos = torch.arange(width, device=lens.device)
        valid = pos[None] < lens[:, None]
        rows = torch.where(valid, self.offsets[cols, None] + pos[None], self.words.shape[0] - 1)
        words = self.words.index_select(0, rows.reshape(-1)).view(cols.numel(), width, -1)
        return Texts(words, valid, lens.to(self.words.dtype), self.guide[cols])


def astuple_shallow(obj) -> tuple:
    """A dataclass's fields as a tuple, without copying (``dataclasses.astuple`` deep-copies)."""
    return tuple(getattr(obj, f.name) for f in fields(obj))


@dataclass
class ImagePart:
    """An image-only aggregated token set added to every pair's (paper "guide" mode, image-tied dense)."""

    weights: torch.Tensor  # (B, N_c, N) normalised aggregation weights of each image's dense branch
    tokens: torch.Tensor  # (B, N_c, C) the aggregated tokens themselves, weights @ P
    fusion: torch.Tensor  # (B, N) their fusion weights


@dataclass
class Selection:
    """One selection branch of a block of pairs (B images x T texts)."""

    idx: torch.Tensor  # (B, T, K) kept patches (any order)
    keep: torch.Tensor  # (B, T, N) bool mask of the same
    net: TokenAggregation  # the aggregation net of the branch


@dataclass
class TokenSet:
    """The N_c + 1 image tokens of the block's pairs, CLS apart: aggregated tokens = sum over branches
    of the softmax-weighted kept patches (+ an image-only part), fusion token = fusion @ P."""

    branches: list[Selection]
    part: ImagePart | None
    fusion: torch.Tensor  # (B, T, N)

    @property
    def single(self) -> bool:
        """One branch and no part: the aggregation normaliser cancels under L2 normalisation."""
        return len(self.branches) == 1 and self.part is None


@dataclass
class ImageBlock:
    """Per-image tensors of an image block, computed once per image."""

    patches: torch.Tensor  # (B, N, C) raw
    unit: torch.Tensor  # (B, N, C)
    saliency: torch.Tensor | None  # (B, N); None when ``prior`` was given
    predicted: torch.Tensor | None  # (B, N) paper score predictor
    logits_t: dict[int, torch.Tensor]  # id(net) -> (B, N_c, N) aggregation logits, transposed
    exp_t: dict[int, torch.Tensor]  # id(net) -> (B, N_c, N) exp(logits - max over patches)
    stable: dict[int, list[bool]]  # id(net) -> per image: exp_t is safe to use
    gram_: torch.Tensor | None  # (B, N, N) Gram matrices, computed on first use (the "gram" form only)
    cls: torch.Tensor | None  # (B, C) unit CLS
    dense_relevance: torch.Tensor | None = None  # (B, 1, N) image-tied dense s_dt
    dense_const: torch.Tensor | None = None  # (B,) image-tied "branch"-mode dense score
    part: ImagePart | None = None  # image-tied "guide"-mode dense token sets (batched)
    # (B, N) image-only part of the selection scores, precomputed before index-time pruning
    prior: torch.Tensor | None = None

    @property
    def gram(self) -> torch.Tensor:
        if self.gram_ is None:
            self.gram_ = torch.bmm(self.patches, self.patches.transpose(1, 2))
        return self.gram_

    def select(self, j: int) -> ImageBlock:
        """Image j of the block as a block of one (views)."""
        return self.take(j, j + 1)

    def take(self, start: int, stop: int) -> ImageBlock:
        """Images ``start .. stop`` of the block as a block (views)."""

        def cut(x):
            return None if x is None else x[start:stop]

        return ImageBlock(
            patches=cut(self.patches),
            unit=cut(self.unit),
            saliency=cut(self.saliency),
            predicted=cut(self.predicted),
            logits_t={key: cut(x) for key, x in self.logits_t.items()},
            exp_t={key: cut(x) for key, x in self.exp_t.items()},
            stable={key: cut(x) for key, x in self.stable.items()},
            gram_=cut(self.gram_),
            cls=cut(self.cls),
            dense_relevance=cut(self.dense_relevance),
            dense_const=cut(self.dense_const),
            prior=cut(self.prior),
            part=None if self.part is None else ImagePart(*(cut(x) for x in astuple_shallow(self.part))),
        )


def length_blocks(
    lens_sorted: torch.Tensor,
    max_block: int,
    min_bucket: int = MIN_BUCKET,
    block_for_length: list[int] | None = None,
) -> list[tuple[int, int]]:
    """Split texts sorted by decreasing length into [start, stop) blocks of at most ``max_block``.

    A block also ends where the next text is shorter than ``BUCKET_SLACK`` times the block's first
    (longest) one, once it holds ``min_bucket`` texts: padding every caption to the longest of 5000
    would double the word-side work. ``block_for_length[L]``: the most texts a block whose longest text
    has L tokens may hold (shorter texts, larger blocks), instead of ``max_block``.
    """
    lens = lens_sorted.tolist()
    blocks, start = [], 0
    for i, length in enumerate(lens):
        size = i - start
        limit = max_block if block_for_length is None else block_for_length[lens[start]]
        if size >= limit or (size >= min_bucket and length < BUCKET_SLACK * lens[start]):
            blocks.append((start, i))
            start = i
    blocks.append((start, len(lens)))
    return blocks
