"""Word-level vocabulary for from-scratch text encoders (the SCAN / VSE++ convention).

Texts are lowercased and split into words by the vocabulary's rule (``split``, saved with it):

* ``alnum`` (patchword's default): on every non-alphanumeric character, so punctuation disappears;
* ``treebank``: nltk's Treebank word tokenizer (``NLTKWordTokenizer``, what SCAN / NAAF's
  ``nltk.word_tokenize`` applies to each sentence), so ``.``, ``,`` and ``'s`` are tokens and hyphenated
  words stay whole: the vocabularies of official SCAN / NAAF checkpoints (``patchword import``). Needs the
  optional ``nltk`` package; the sentence splitting before it (punkt, a data download) is left out, which
  changes nothing for one-sentence captions. A vocabulary file that records no split (SCAN's own) is read
  with ``treebank`` when one of its words is not an alphanumeric run (``.``, ``'s``, ``t-shirt``);
* ``unicode`` (``data.word_split=unicode``): ``alnum`` made consistent for any script: the text is NFC
  normalised (a decomposed ``cafe\u0301`` and a precomposed ``café`` are one word), combining marks
  (Hindi's vowel signs, accents) stay inside their word, and each CJK ideograph is a word of its own (a
  Chinese caption is not one word). ``alnum`` keeps its old behaviour, so existing vocabularies encode as
  before.

Encoded
sequences are wrapped as ``<start> w1 ... wn <end>``; their lengths include both specials, like BERT's
[CLS] / [SEP], so a word-level and a BERT text encoder report comparable token counts. The JSON format
is SCAN's (``{"word2idx": ..., "idx2word": ..., "idx": n}``), so SCAN's precomputed vocabularies load as is.
"""

from __future__ import annotations

import copy
import json
import logging
import numbers
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

__all__ = ["SPLITS", "WordVocab", "NoWordsError", "tokenize", "PAD", "START", "END", "UNK"]

_logger = logging.getLogger(__name__)

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)  # their ids are their positions: <pad> = 0 is also the padding value

_WORD = re.compile(r"[^\W_]+")  # maximal runs of letters and digits (any script)
SPLITS = ("alnum", "treebank", "unicode")
# CJK ideographs (BERT's _is_chinese_char blocks): scripts written without spaces between words. One
# compiled character class tests a character against all eight blocks in one call.
_CJK = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f]"
)


def _treebank():
    try:
        from nltk.tokenize.destructive import NLTKWordTokenizer
    except ImportError as err:
        from patchword.errors import MissingExtraError

        raise MissingExtraError(
            "the treebank word split (the vocabulary of an official SCAN / NAAF checkpoint) needs nltk: "
            "pip install 'patchword[nltk]'"
        ) from err
    return NLTKWordTokenizer()


def _unicode_words(text: str) -> list[str]:
    """The ``unicode`` split: NFC-normalised runs of letters, digits and the combining marks inside them,
    each CJK ideograph a word of its own."""
    words: list[str] = []
    word: list[str] = []
    for char in unicodedata.normalize("NFC", text.lower()):
        if _CJK.match(char):
            words.extend(["".join(word), char] if word else [char])
            word = []
        elif char.isalnum() or (word and unicodedata.category(char).startswith("M")):
            word.append(char)
        elif word:
            words.append("".join(word))
            word = []
    if word:
        words.append("".join(word))
    return words


def tokenize(text: str, split: str = "alnum") -> list[str]:
    """Lowercased words of ``text``: alphanumeric runs (``alnum``), nltk's Treebank tokens (``treebank``),
    NFC-normalised runs with their combining marks and CJK ideographs one by one (``unicode``)."""
    if split == "alnum":
        return _WORD.findall(text.lower())
    if split == "treebank":
        return _treebank().tokenize(text.lower())
    if split == "unicode":
        return _unicode_words(text)
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


class NoWordsError(ValueError):
    """A text the tokenizer finds no word (or token) in.

    Attributes:
        index: its position in the texts encoded; text: the text; reason: what was found missing.
    """

    def __init__(self, message: str, index: int | None, text: str, reason: str) -> None:
        super().__init__(message)
        self.index, self.text, self.reason = index, text, reason


def _words(text: str, index: int, split: str = "alnum") -> list[str]:
    words = tokenize(text, split)
    if not words:
        reason = f"no words: the {split} word split finds none"
        raise NoWordsError(f"text {index} is empty (no words): {text!r}", index, text, reason)
    return words


def refuse_one_text(texts: object) -> None:
    """``batch_encode`` takes a list of captions: one ``str`` (a sequence of characters) would be encoded
    character by character, one caption per character, without a word; an item that is no ``str`` (a
    missing caption read as None, bytes) is named by its index before a tokenizer fails on it somewhere
    inside.

    Raises:
        TypeError: ``texts`` is one str, or one of its items is no str.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of captions, got one str: pass [text]")
    for i, text in enumerate(texts):  # type: ignore[arg-type]
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str (a caption), got {type(text).__name__}: {text!r:.80}")


def _checked_max_len(max_len: object, least: int, holds: str) -> int | None:
    """A tokenizer's default truncation: None, or an int of at least ``least`` (room for ``holds``)."""
    if max_len is None:
        return None
    if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral):
        raise TypeError(f"max_len must be an int or None, got {max_len!r}")
    if max_len < least:
        raise ValueError(f"max_len must be >= {least} ({holds}), got {max_len}")
    return int(max_len)


class WordVocab:
    """Word <-> id map with the specials ``<pad>`` = 0, ``<start>`` = 1, ``<end>`` = 2, ``<unk>`` = 3.

    Args:
        words: the non-special words, in id order (ids start at 4).
        split: how texts are cut into words (:data:`SPLITS`), saved with the vocabulary.
        max_len: the truncation :meth:`batch_encode` applies when its call gives none (a model's caption
            length, see :meth:`with_max_len`); None: no limit. Not saved with the vocabulary.

    Attributes:
        source: the file :meth:`load` read it from (what a warning about the vocabulary names); None for
            one built from texts.

    Calling it is :meth:`batch_encode`: ``vocab(["a red dog"])`` -> (ids (1, L), lens (1,)).
    """

    pad_id, start_id, end_id, unk_id = range(len(SPECIALS))

    def __init__(
        self, words: Iterable[str] = (), split: str = "alnum", *, max_len: int | None = None
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.max_len = _checked_max_len(max_len, 3, "<start>, one word, <end>")
        self.split = split
        self.source: str | None = None
        self.idx2word: list[str] = list(SPECIALS)
        self.word2idx: dict[str, int] = {w: i for i, w in enumerate(SPECIALS)}
        for word in words:
            if word not in self.word2idx:
                self.word2idx[word] = len(self.idx2word)
                self.idx2word.append(word)

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1, split: str = "alnum") -> WordVocab:
        """Vocabulary of the words (by the ``split`` rule) occurring at least ``min_count`` times in
        ``texts``.

        Ids follow decreasing frequency (ties alphabetically), so the result does not depend on text order.
        """
        counts = Counter(w for i, text in enumerate(texts) for w in _words(text, i, split))
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(kept, split=split)

    def __len__(self) -> int:
        return len(self.idx2word)

    def __contains__(self, word: str) -> bool:
        return word in self.word2idx

    def known_and_unknown_words(self, text: str) -> tuple[list[str], list[str]]:
        """The words of ``text`` in this vocabulary and those not in it (each once, in order of appearance);
        an unknown word encodes as ``<unk>``, which tells the model nothing about it."""
        words = list(dict.fromkeys(tokenize(text, self.split)))
        return [w for w in words if w in self.word2idx], [w for w in words if w not in self.word2idx]

    def encode(self, text: str, index: int = 0) -> list[int]:
        """``[<start>, w1, ..., wn, <end>]`` ids of ``text``; unknown words become ``<unk>``.

        ``index`` only names the text in the error raised when it has no words.
        """
        ids = [self.word2idx.get(w, self.unk_id) for w in _words(text, index, self.split)]
        return [self.start_id, *ids, self.end_id]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Words of ``ids`` joined by spaces; drops <pad>, <start> and <end> if ``skip_special``."""
        words = [self.idx2word[int(i)] for i in ids]
        if skip_special:
            words = [w for w in words if w not in SPECIALS or w == UNK]
        return " ".join(words)

    def batch_encode(
        self, texts: Sequence[str], max_len: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode and right-pad a batch.

        Args:
            texts: B texts.
            max_len: longest sequence kept, specials included (>= 3); longer texts lose their last
                words but keep ``<end>``, so the encoder still sees where the text stops. None: the
                vocabulary's ``max_len`` (None there too: no limit).
        Returns:
            ids: (B, L) int64, padded with ``<pad>`` = 0, L = the longest (truncated) sequence.
            lens: (B,) int64 sequence lengths, both specials included.

        Raises:
            TypeError: ``texts`` is one str (pass ``[text]``).
        """
        refuse_one_text(texts)
        if max_len is None:
            max_len = self.max_len
        if max_len is not None and max_len < 3:
            raise ValueError(f"max_len must be >= 3 (<start>, one word, <end>), got {max_len}")
        if not texts:
            raise ValueError("texts is empty: nothing to encode")
        seqs = [self.encode(t, i) for i, t in enumerate(texts)]
        if max_len is not None:
            seqs = [s if len(s) <= max_len else [*s[: max_len - 1], self.end_id] for s in seqs]
        lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
        ids = torch.full((len(seqs), int(lens.max())), self.pad_id, dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        return ids, lens

    def __call__(self, texts: Sequence[str], *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`batch_encode` (open_clip's tokenizers are called on a list of texts)."""
        return self.batch_encode(texts, *args, **kwargs)

    def with_max_len(self, max_len: int | None) -> WordVocab:
        """A copy (sharing the word maps) whose :meth:`batch_encode` truncates to ``max_len`` ids when a
        call gives no ``max_len``: the tokenizer of a model that reads at most that many
        (``data.max_caption_len``). This one is left as it is."""
        out = copy.copy(self)
        out.max_len = _checked_max_len(max_len, 3, "<start>, one word, <end>")
        return out

    # -- persistence (SCAN json format) ----------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as SCAN-style JSON (atomically: a run's later evaluations depend on it)."""
        from patchword.fileio import atomic_write_text

        payload = {
            "word2idx": self.word2idx,
            "idx2word": {str(i): w for i, w in enumerate(self.idx2word)},
            "idx": len(self),
        }
        if self.split != "alnum":  # a key SCAN's own loader ignores; absent: the default rule
            payload["split"] = self.split
        atomic_write_text(path, json.dumps(payload, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike, *, max_len: int | None = None) -> WordVocab:
        """Read a SCAN-style JSON vocabulary (ids must be 0..n-1 with the four specials first); its
        ``split`` key, when present, is the word rule; without one, ``alnum``, or ``treebank`` when a word
        has punctuation in it (SCAN's own vocabularies, logged). ``max_len``: the default truncation of
        :meth:`batch_encode` (None: none)."""
        from patchword.errors import DataError

        payload = _read_json(path)
        try:
            idx2word = {int(i): w for i, w in payload["idx2word"].items()}
            word2idx = {w: int(i) for w, i in payload["word2idx"].items()}
        except (KeyError, AttributeError, TypeError, ValueError) as err:
            raise DataError(f"{path}: not a word2idx / idx2word vocabulary json ({err})") from err
        words = [idx2word.get(i) for i in range(len(idx2word))]
        # before word2idx is looked up: a list would be unhashable there (a missing id is None, reported next)
        not_words = [i for i, w in enumerate(words) if w is not None and not isinstance(w, str)]
        if not_words:
            bad = not_words[0]
            raise DataError(f"{path}: idx2word[{bad}] is {words[bad]!r}, not a word (a string)")
        if (
            None in words
            or any(word2idx.get(w) != i for i, w in enumerate(words))
            or len(word2idx) != len(words)
        ):
            raise DataError(f"{path}: word2idx and idx2word disagree or ids are not 0..{len(words) - 1}")
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"{path}: the first ids must be {SPECIALS}, got {tuple(words[: len(SPECIALS)])}")
        split = payload.get("split")
        if split is None:
            split = _unrecorded_split(path, words[len(SPECIALS) :])
        if split not in SPLITS:
            raise DataError(f"{path}: unknown word split {split!r} (known: {', '.join(SPLITS)})")
        vocab = cls(words[len(SPECIALS) :], split=split, max_len=max_len)
        vocab.source = os.fspath(path)
        return vocab

    def __repr__(self) -> str:
        return f"WordVocab({len(self)} words, split={self.split})"


def _unrecorded_split(path: str | os.PathLike, words: Sequence[str]) -> str:
    """The word split of a vocabulary that records none: ``alnum`` (patchword's own, which never makes a
    word of punctuation), or ``treebank`` when a word is not one alphanumeric run (``.``, ``'s``,
    ``t-shirt``): SCAN / NAAF's own vocabularies, built with nltk's word_tokenize, whose punctuation and
    hyphenated words the ``alnum`` split would never produce (every caption would lose them as ``<unk>``)."""
    other = next((w for w in words if not _WORD.fullmatch(w)), None)
    if other is None:
        return "alnum"
    _logger.info(
        "%s records no word split and holds words such as %r that the alnum split never makes: read with "
        "the treebank split (nltk's word_tokenize, as SCAN's vocabularies were built)",
        path,
        other,
    )
    return "treebank"


def _read_json(path: str | os.PathLike):
    """The parsed JSON of a vocabulary file; text that is not UTF-8 or not JSON is a
    :class:`~patchword.errors.DataError` naming the file and where it breaks (json's own message names
    neither the file nor, for bad bytes, what kind of file was expected)."""
    from patchword.errors import DataError

    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")  # a byte order mark opening the file is not JSON
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); a vocabulary is "
            "SCAN-style JSON"
        ) from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}: not valid JSON: {err.msg} (line {err.lineno} column {err.colno}); a vocabulary is "
            "SCAN-style JSON"
        ) from err
