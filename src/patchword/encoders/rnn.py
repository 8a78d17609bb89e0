"""Word embedding + (Bi)GRU text encoder of SCAN / NAAF / VSE-infinity, with optional local GloVe vectors.

Official recipe (reference/naaf_scan_vse.md 1.1-1.2): ``nn.Embedding(vocab, 300)`` initialised
U(-0.1, 0.1) (SCAN) or loaded from GloVe 840B vectors (NAAF's default), a GRU(300 -> 1024) over packed
sequences and, with ``--bi_gru``, the forward and backward halves *averaged* (not concatenated). The
official encoders then L2-normalise each word; here the matchers do that.

GloVe: NAAF sets ``self.glove.requires_grad = False`` on the *module*, which does nothing, so its "frozen"
GloVe vectors are fine-tuned. ``freeze_embeddings=True`` here really freezes them (the weight's
``requires_grad`` is False, so the optimiser never updates it and weight decay never touches it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from patchword._validation import check_lengths
from patchword.encoders.base import EncoderBase
from patchword.readers import require_file

__all__ = ["GRUTextConfig", "BiGRUTextEncoder", "load_glove"]

_logger = logging.getLogger(__name__)

# Tensor files (a (V, word_dim) tensor aligned with the vocabulary ids, as NAAF's glove_*.pkl); anything
# else is read as GloVe text, one "word v_1 ... v_K" line per word.
_TENSOR_SUFFIXES = (".pt", ".pth", ".pkl", ".bin")


@dataclass
class GRUTextConfig:
    """Hyper-parameters of :class:`BiGRUTextEncoder`."""

    vocab_size: int = 0  # number of token ids (set from the tokenizer by build_model); id 0 is padding
    word_dim: int = 300  # word embedding width (GloVe 840B: 300)
    embed_dim: int = 1024  # GRU hidden size = output width (set from the model's embed_dim)
    num_layers: int = 1  # stacked GRU layers (official 1)
    bidirectional: bool = True  # SCAN --bi_gru: run both directions and average them
    glove_path: str = ""  # local GloVe vectors: a text file or a (V, word_dim) tensor file ("" = random)
    freeze_embeddings: bool = False  # keep the word embeddings fixed (a real freeze)
    dropout: float = 0.0  # dropout on the word embeddings (official: none)


def load_glove(
    path: str | os.PathLike, words: Sequence[str] | None, num_embeddings: int, dim: int
) -> torch.Tensor:
    """Word vectors for a vocabulary from a local file.

    Args:
        path: a GloVe text file (``word v_1 ... v_dim`` per line; the word may contain spaces, as in
            GloVe 840B, so the last ``dim`` fields are the vector) or a tensor file (``.pt``/``.pth``/
            ``.pkl``/``.bin``) holding a (num_embeddings, dim) tensor aligned with the vocabulary ids.
        words: the vocabulary, ``words[i]`` = the word of id i (needed for text files).
        num_embeddings: vocabulary size.
        dim: embedding width.

    Returns:
        (num_embeddings, dim) float32. For a text file, words it lacks keep U(-0.1, 0.1) vectors (drawn
        from the global torch generator, so seeding makes them reproducible); the coverage is logged.

    Raises:
        MissingFileError: no file at ``path`` (a :class:`FileNotFoundError`).
        ValueError: wrong tensor shape, a text line with the wrong number of values, or no words given.
    """
    path = Path(path)
    require_file(path, "GloVe file")
    if path.suffix in _TENSOR_SUFFIXES:
        weight = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (num_embeddings, dim):
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ValueError(
                f"{path}: expected a ({num_embeddings}, {dim}) tensor of word vectors, got {got}"
            )
        return weight.float()
    if words is None:
        raise ValueError(f"{path} is a GloVe text file: the vocabulary words are needed to align it")
    if len(words) != num_embeddings:
        raise ValueError(f"{len(words)} vocabulary words for {num_embeddings} embeddings")
    index = {w: i for i, w in enumerate(words)}
    weight = torch.empty(num_embeddings, dim).uniform_(-0.1, 0.1)
    found = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, 1):
            fields = line.rstrip("\n").rstrip(" ").split(" ")
            if len(fields) < dim + 1:
                if line.strip():
                    raise ValueError(
                        f"{path}:{line_no}: expected a word and {dim} values, got {len(fields)} fields"
                    )
                continue
            word = " ".join(fields[:-dim])
            row = index.get(word)
            if row is None:
                continue
            try:
                weight[row] = torch.tensor([float(v) for v in fields[-dim:]])
            except ValueError as err:
                raise ValueError(f"{path}:{line_no}: {err}") from err
            found += 1
    _logger.info("GloVe %s: vectors for %d of %d vocabulary words", path, found, num_embeddings)
    return weight


class BiGRUTextEncoder(EncoderBase):
    """(B, L) word ids and (B,) lengths -> (B, L, embed_dim) GRU states (directions averaged).

    Args:
        cfg: hyper-parameters (``vocab_size`` must be set).
        words: vocabulary words by id; needed only for a GloVe text file.
    """

    def __init__(self, cfg: GRUTextConfig, words: Sequence[str] | None = None) -> None:
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("GRUTextConfig.vocab_size must be set (the tokenizer's vocabulary size)")
        if cfg.num_layers < 1 or cfg.word_dim < 1 or cfg.embed_dim < 1:
            raise ValueError("num_layers, word_dim and embed_dim must be >= 1")
        self.cfg = cfg
        self.embed_dim = cfg.embed_dim
        self.vocab_size = cfg.vocab_size
        self.embed = nn.Embedding(cfg.vocab_size, cfg.word_dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.rnn = nn.GRU(
            cfg.word_dim, cfg.embed_dim, cfg.num_layers, batch_first=True, bidirectional=cfg.bidirectional
        )
        self.proj = nn.Identity()
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)  # SCAN's init_weights
        if cfg.glove_path:
            with torch.no_grad():
                self.embed.weight.copy_(load_glove(cfg.glove_path, words, cfg.vocab_size, cfg.word_dim))
        if cfg.freeze_embeddings:
            self.embed.weight.requires_grad_(False)

    def forward(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Encode word ids.

        Args:
            ids: (B, L) int64 ids, padded with 0.
            lens: (B,) valid lengths, 1 <= lens <= L.

        Returns:
            (B, L, embed_dim) GRU outputs (mean of both directions when bidirectional); padding
            positions are zero vectors.
        """
        if ids.dim() != 2 or ids.is_floating_point():
            raise ValueError(f"ids must be a (B, L) integer tensor, got {tuple(ids.shape)} {ids.dtype}")
        length = ids.shape[1]
        lens = torch.as_tensor(lens)
        # Packing reads the lengths on the host (one copy, the only wait): checked there, at no extra wait.
        host_lens = check_lengths(lens.cpu(), "lens", size=ids.shape[0], max_len=length)
        # The captions are sorted longest first here rather than by pack_padded_sequence(enforce_sorted=
        # False), which uploads its host sort order and reads the inverse back (two more waits on a GPU):
        # the same stable sort of the lengths on each side gives the same order with no copy.
        host_lens, host_order = torch.sort(host_lens, descending=True, stable=True)
        if lens.device == ids.device:
            order = torch.sort(lens, descending=True, stable=True).indices
        else:
            order = host_order.to(ids.device)
        x = self.drop(self.embed(ids)).index_select(0, order)
        # Packed sequences: each caption's backward direction starts at its own last word, as in SCAN.
        packed = pack_padded_sequence(x, host_lens, batch_first=True, enforce_sorted=True)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=length)
        restore = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        out = out.index_select(0, restore)
        if self.cfg.bidirectional:
            half = out.shape[-1] // 2
            out = (out[..., :half] + out[..., half:]) / 2
        return out
