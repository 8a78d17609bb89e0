"""The official SEPS/LAPS caption tokenisation for BERT, and its train-time "size augmentation".

The official code splits a caption with ``tokenizer.basic_tokenizer.tokenize`` (which lower-cases and
splits punctuation), applies WordPiece to every basic token and wraps the result as ``[CLS] ... [SEP]``.
:class:`BertCaptionTokenizer` does exactly that with the same transformers classes, from a
``vocab.txt``.

The vocabulary is read directly rather than through ``BertTokenizer.from_pretrained``: in
transformers 5.x that call silently returns a 5-token tokenizer when it finds no vocabulary file.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from patchword.data.tokenizers.word import NoWordsError, _checked_max_len, refuse_one_text
from patchword.errors import MissingFileError
from patchword.hub import hub_load_errors, require_transformers, resolve_pretrained

__all__ = ["BertCaptionTokenizer", "RandomSource", "size_augment"]

logger = logging.getLogger(__name__)

RandomSource = np.random.Generator | torch.Generator | None
"""Random source of the augmentation: numpy, torch, or None for torch's global generator."""

_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Actions of the size augmentation, one per basic token.
_KEEP, _MASK, _RANDOM, _DELETE = range(4)


# --------------------------------------------------------------------------------------------------
# Size augmentation
# --------------------------------------------------------------------------------------------------


def _uniform(n: int, generator: RandomSource) -> np.ndarray:
    if isinstance(generator, np.random.Generator):
        return generator.random(n)
    return torch.rand(n, generator=generator, dtype=torch.float64).numpy()


def _integers(high: int, n: int, generator: RandomSource) -> np.ndarray:
    if isinstance(generator, np.random.Generator):
        return generator.integers(high, size=n)
    return torch.randint(high, (n,), generator=generator).numpy()


def _draw_actions(
    num_words: int, generator: RandomSource, prob: float, mask_share: float, random_share: float
) -> np.ndarray:
    """One action per word, with the official single uniform draw per word."""
    u = _uniform(num_words, generator)
    v = u / prob  # official: ``prob /= 0.2`` reuses the same draw to pick the action
    hit = u < prob
    actions = np.full(num_words, _KEEP)
    actions[hit] = _DELETE
    actions[hit & (v < mask_share + random_share)] = _RANDOM
    actions[hit & (v < mask_share)] = _MASK
    return actions


def size_augment(
    words: Sequence[Sequence[int]],
    *,
    mask_id: int,
    random_ids: np.ndarray,
    generator: RandomSource = None,
    prob: float = 0.2,
    mask_share: float = 0.5,
    random_share: float = 0.1,
) -> list[int]:
    """The official train-time caption augmentation ("size augmentation").

    Each basic token (word) is, with probability ``prob``, masked (share ``mask_share``), replaced by
    random vocabulary tokens (share ``random_share``) or deleted (the rest); the action applies to all
    of the word's WordPiece sub-tokens, and a replaced word gets one random token per sub-token. With
    the defaults a word is masked with probability 0.10, randomised 0.02 and deleted 0.08.

    Args:
        words: WordPiece ids of each basic token of one caption, without [CLS]/[SEP].
        mask_id: id of ``[MASK]``.
        random_ids: (V,) ids to draw replacements from, computed once per vocabulary.
        generator: numpy or torch generator; None uses torch's global generator.
        prob: probability that a word is augmented at all.
        mask_share: share of augmented words that are masked.
        random_share: share of augmented words that are replaced by random tokens.

    Returns:
        The augmented ids, flattened, without [CLS]/[SEP]; possibly empty.
    """
    actions = _draw_actions(len(words), generator, prob, mask_share, random_share)
    num_random = sum(len(w) for w, a in zip(words, actions, strict=True) if a == _RANDOM)
    replacements = iter(random_ids[_integers(len(random_ids), num_random, generator)].tolist())
    out: list[int] = []
    for pieces, action in zip(words, actions, strict=True):
        if action == _KEEP:
            out.extend(pieces)
        elif action == _MASK:
            out.extend([mask_id] * len(pieces))
        elif action == _RANDOM:
            out.extend(next(replacements) for _ in pieces)
    return out


# --------------------------------------------------------------------------------------------------
# Vocabulary loading
# --------------------------------------------------------------------------------------------------


def _read_vocab_txt(path: Path) -> dict[str, int]:
    """One token per line, the id being the line number (BERT's vocab.txt)."""
    with path.open(encoding="utf-8") as f:
        return {line.rstrip("\n"): i for i, line in enumerate(f)}


def _read_tokenizer_json(path: Path) -> dict[str, int]:
    """The WordPiece vocabulary of a ``tokenizers`` file (what transformers 5.x save_pretrained writes)."""
    model = json.loads(path.read_text(encoding="utf-8")).get("model", {})
    if model.get("type") != "WordPiece":
        raise ValueError(f"'{path}' is not a WordPiece tokenizer (model type {model.get('type')!r})")
    return dict(model["vocab"])


def _read_do_lower_case(path: Path) -> bool | None:
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("do_lower_case")
    return None if value is None else bool(value)


def _load_local(directory: Path) -> tuple[dict[str, int], bool | None]:
    if (directory / "vocab.txt").is_file():
        vocab = _read_vocab_txt(directory / "vocab.txt")
    elif (directory / "tokenizer.json").is_file():
        vocab = _read_tokenizer_json(directory / "tokenizer.json")
    else:
        raise MissingFileError(f"tokenizer directory '{directory}' has neither vocab.txt nor tokenizer.json")
    return vocab, _read_do_lower_case(directory / "tokenizer_config.json")


def _load_hub(name: str, local_files_only: bool) -> tuple[dict[str, int], bool | None]:
    cached_file = require_transformers().utils.cached_file
    with hub_load_errors(name, local_files_only, what="vocabulary (vocab.txt)"):
        vocab_file = cached_file(name, "vocab.txt", local_files_only=local_files_only)
    try:
        config_file = cached_file(name, "tokenizer_config.json", local_files_only=local_files_only)
    except OSError:  # optional file: fall back to the uncased default
        config_file = None
    do_lower_case = _read_do_lower_case(Path(config_file)) if config_file else None
    return _read_vocab_txt(Path(vocab_file)), do_lower_case


def _bert_tokenization_module():
    """The module holding BasicTokenizer/WordpieceTokenizer (moved to a legacy module in transformers 5)."""
    require_transformers()
    try:
        from transformers.models.bert import tokenization_bert_legacy as module
    except ImportError:  # transformers 4.x
        from transformers.models.bert import tokenization_bert as module
    return module


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------


class BertCaptionTokenizer:
    """BERT caption tokenisation exactly as in the official SEPS/LAPS code.

    Args:
        vocab: token -> id; must map ``[PAD]`` to 0 and contain [UNK], [CLS], [SEP] and [MASK].
        do_lower_case: lower-case and strip accents before splitting (True for uncased BERT).
        max_len: the truncation :meth:`batch_encode` applies when its call gives none (a model's caption
            length, see :meth:`with_max_len`); None: no limit.

    Attributes:
        vocab_size: one more than the largest id.
        pad_id, unk_id, cls_id, sep_id, mask_id: ids of the special tokens.
        max_len: the default truncation (None: none).
        source: the file, directory or hub id :meth:`from_pretrained` read the vocabulary from (what a warning
            about the vocabulary names); None for one built from a mapping.

    Calling it is :meth:`batch_encode`: ``tok(["a red dog"])`` -> (ids (1, L), lens (1,)).
    """

    def __init__(
        self, vocab: Mapping[str, int], *, do_lower_case: bool = True, max_len: int | None = None
    ) -> None:
        self.max_len = _checked_max_len(max_len, 2, "[CLS] and [SEP]")
        self.source: str | None = None
        missing = [t for t in _SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise ValueError(f"vocabulary lacks the special token(s) {missing}")
        if vocab["[PAD]"] != 0:
            raise ValueError(f"[PAD] must have id 0 (padding id of the encoders), got {vocab['[PAD]']}")
        bert = _bert_tokenization_module()
        self.vocab = dict(vocab)
        self.vocab_size = max(self.vocab.values()) + 1
        self.do_lower_case = do_lower_case
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self.vocab[t] for t in _SPECIAL_TOKENS
        )
        # No never_split: the official code calls basic_tokenizer.tokenize(text) without it.
        self._basic = bert.BasicTokenizer(do_lower_case=do_lower_case)
        self._wordpiece = bert.WordpieceTokenizer(vocab=self.vocab, unk_token="[UNK]")
        # Replacement pool of the augmentation, built once (the official code rebuilt a 30k-entry list
        # for every replaced token). Special tokens are left out: a random [PAD] would read as padding.
        special = {self.vocab[t] for t in _SPECIAL_TOKENS}
        self.random_ids = np.array(sorted(set(self.vocab.values()) - special), dtype=np.int64)
        # Captions repeat words constantly; WordPiece per distinct word is the expensive part.
        self._word_ids = functools.lru_cache(maxsize=1 << 16)(self._word_ids_uncached)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        local_files_only: bool = True,
        do_lower_case: bool | None = None,
        max_len: int | None = None,
    ) -> BertCaptionTokenizer:
        """Load the vocabulary of a BERT tokenizer.

        Args:
            name_or_path: a ``vocab.txt`` file, a local directory holding ``vocab.txt`` or
                ``tokenizer.json``, or a hub id such as ``"bert-base-uncased"``.
            local_files_only: never download a hub id's vocabulary.
            do_lower_case: None reads it from ``tokenizer_config.json`` and defaults to True.
            max_len: the default truncation of :meth:`batch_encode` (None: none).
        """
        path = Path(name_or_path).expanduser()
        if path.is_file():
            vocab, stored_lower = _read_vocab_txt(path), None
        else:
            source = resolve_pretrained(name_or_path, required_file=None)
            if Path(source).is_dir():
                vocab, stored_lower = _load_local(Path(source))
            else:
                vocab, stored_lower = _load_hub(source, local_files_only)
        lower = do_lower_case if do_lower_case is not None else stored_lower
        tokenizer = cls(vocab, do_lower_case=True if lower is None else lower, max_len=max_len)
        tokenizer.source = os.fspath(name_or_path)
        return tokenizer

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the vocabulary as :meth:`from_pretrained` reads it back: ``vocab.txt`` (a token per line, the
        line number its id) and ``tokenizer_config.json`` (the casing), each atomically, into ``directory``
        (created; files of the same names there are replaced)."""
        from patchword.fileio import atomic_write_text

        by_id = {i: token for token, i in self.vocab.items()}
        # an id no token has (a tokenizer.json may skip some) keeps its line: every other id stays the same
        lines = [by_id.get(i, f"[unused_id_{i}]") for i in range(self.vocab_size)]
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / "vocab.txt", "".join(f"{line}\n" for line in lines))
        atomic_write_text(
            directory / "tokenizer_config.json", json.dumps({"do_lower_case": bool(self.do_lower_case)})
        )

    def with_max_len(self, max_len: int | None) -> BertCaptionTokenizer:
        """A copy (sharing the vocabulary) whose :meth:`batch_encode` truncates to ``max_len`` ids when a
        call gives no ``max_len``: the tokenizer of a model that reads at most that many
        (``data.max_caption_len``). This one is left as it is."""
        out = copy.copy(self)
        out.max_len = _checked_max_len(max_len, 2, "[CLS] and [SEP]")
        return out

    def _word_ids_uncached(self, word: str) -> tuple[int, ...]:
        return tuple(self.vocab.get(p, self.unk_id) for p in self._wordpiece.tokenize(word))

    def basic_tokens(self, text: str) -> list[str]:
        """BERT's basic tokens of ``text`` (words and punctuation, before WordPiece); empty exactly when
        :meth:`batch_encode` finds no word in it (WordPiece gives every basic token an id, [UNK] included)."""
        return self._basic.tokenize(text)

    def words(self, text: str) -> list[tuple[int, ...]]:
        """WordPiece ids of every basic token of ``text`` (no [CLS]/[SEP])."""
        return [self._word_ids(w) for w in self._basic.tokenize(text)]

    def known_and_unknown_words(self, text: str) -> tuple[list[str], list[str]]:
        """The basic tokens (words, punctuation) of ``text`` that WordPiece reads and those it does not (each
        once, in order of appearance).

        A word is unknown when all its ids are ``[UNK]``: WordPiece maps a whole word to one ``[UNK]`` when
        it cannot be split into vocabulary pieces, which for BERT's vocabulary (every letter is a piece)
        happens only for characters it lacks (many emoji, rare scripts). A made-up word that splits into
        known pieces (``zzzqqq`` -> ``zz ##z ##q ##q ##q``) is known: the model reads its pieces.
        """
        words = list(dict.fromkeys(self._basic.tokenize(text)))
        unknown = [w for w in words if all(i == self.unk_id for i in self._word_ids(w))]
        return [w for w in words if w not in unknown], unknown

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``, flattened, without [CLS]/[SEP]."""
        return [p for w in self._basic.tokenize(text) for p in self._wordpiece.tokenize(w)]

    def encode(self, text: str, *, augment: bool = False, generator: RandomSource = None) -> list[int]:
        """``[CLS] wordpieces [SEP]`` ids of one caption.

        Args:
            text: the caption.
            augment: apply :func:`size_augment` (training only, as in the official code).
            generator: random source of the augmentation.

        Raises:
            ValueError: the caption has no tokens.
        """
        return self._encode(text, augment, generator, index=None)

    def _encode(self, text: str, augment: bool, generator: RandomSource, index: int | None) -> list[int]:
        words = self.words(text)
        if not words:
            which = "caption" if index is None else f"caption {index}"
            reason = "no tokens after BERT's basic tokenisation"
            raise NoWordsError(f"{which} is empty ({reason}): {text!r}", index, text, reason)
        if augment:
            body = size_augment(words, mask_id=self.mask_id, random_ids=self.random_ids, generator=generator)
        else:
            body = [i for w in words for i in w]
        return [self.cls_id, *body, self.sep_id]

    def batch_encode(
        self,
        texts: Sequence[str],
        max_len: int | None = None,
        *,
        augment: bool = False,
        generator: RandomSource = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode and pad a batch of captions.

        Args:
            texts: B captions.
            max_len: truncate longer captions to this many ids, keeping [SEP] last; None: the
                tokenizer's ``max_len`` (None there too: no limit).
            augment: apply :func:`size_augment` to every caption.
            generator: random source of the augmentation, consumed caption by caption.

        Returns:
            ids (B, L) int64 padded with 0, and lens (B,) int64 valid lengths including [CLS]/[SEP],
            with L the longest length in the batch.

        Raises:
            ValueError: a caption is empty (the message gives its index), or max_len < 2.
            TypeError: ``texts`` is one str (pass ``[text]``).
        """
        refuse_one_text(texts)
        if max_len is None:
            max_len = self.max_len
        if max_len is not None and max_len < 2:
            raise ValueError(f"max_len must be at least 2 to hold [CLS] and [SEP], got {max_len}")
        if len(texts) == 0:
            raise ValueError("texts is empty")
        encoded = [self._encode(t, augment, generator, index=i) for i, t in enumerate(texts)]
        if max_len is not None:
            truncated = sum(len(e) > max_len for e in encoded)
            if truncated:
                logger.debug("truncated %d of %d captions to %d tokens", truncated, len(encoded), max_len)
            encoded = [e if len(e) <= max_len else [*e[: max_len - 1], self.sep_id] for e in encoded]
        lens = torch.tensor([len(e) for e in encoded], dtype=torch.long)
        ids = torch.full((len(encoded), int(lens.max())), self.pad_id, dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, : len(e)] = torch.tensor(e, dtype=torch.long)
        return ids, lens

    def __call__(self, texts: Sequence[str], *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`batch_encode` (open_clip's tokenizers are called on a list of texts)."""
        return self.batch_encode(texts, *args, **kwargs)
