"""Tokenisation, in one place: captions and dense captions -> padded id tensors.

* :class:`WordVocab` (:mod:`.word`): the SCAN / VSE++ word vocabulary built from the training text, for the
  from-scratch and GRU text encoders;
* :class:`BertCaptionTokenizer` (:mod:`.bert`): BERT WordPiece exactly as the official SEPS/LAPS code, with
  its train-time "size augmentation" (:func:`size_augment`).

Both satisfy :class:`TextTokenizer`, all the training and evaluation pipeline needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from patchword.data.tokenizers.bert import BertCaptionTokenizer, size_augment
from patchword.data.tokenizers.word import END, PAD, START, UNK, NoWordsError, WordVocab, tokenize

__all__ = [
    "TextTokenizer",
    "WordVocab",
    "NoWordsError",
    "BertCaptionTokenizer",
    "size_augment",
    "tokenize",
    "PAD",
    "START",
    "END",
    "UNK",
]


class TextTokenizer(Protocol):
    """What training, evaluation and search need from a tokenizer (``WordVocab`` and
    ``BertCaptionTokenizer`` both fit; both are also callable as :meth:`batch_encode`, as open_clip's
    tokenizers are)."""

    #: the file, directory or hub id the vocabulary was read from, None when it was not read from one
    source: str | None

    def batch_encode(
        self, texts: Sequence[str], max_len: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (ids (B, L) long padded with 0, lens (B,) long counting the special tokens)."""
        ...

    def known_and_unknown_words(self, text: str) -> tuple[list[str], list[str]]:
        """The words of ``text`` the tokenizer reads and those it can only encode as its unknown token
        (each once, in order of appearance); search uses it to refuse or flag such queries."""
        ...
