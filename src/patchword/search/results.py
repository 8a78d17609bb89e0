"""What one search is asked and what it answers: the checks of a query's text (:class:`QueryError`), the
encoded :class:`Query`, and the :class:`SearchResult` of :class:`SearchHit` with its warnings (the
``/api/search`` body). :class:`~patchword.search.query.Searcher` turns the one into the other.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

import torch

from patchword.errors import DataError

__all__ = [
    "QueryError",
    "Query",
    "check_query_text",
    "left_out",
    "quote_words",
    "truncation_warning",
    "SearchHit",
    "SearchResult",
    "unknown_words_warning",
]


class QueryError(DataError):
    """A query the model cannot read: empty, with control characters, no word at all, or no word the
    model's vocabulary knows (``unknown_words`` then names them)."""

    def __init__(self, message: str, unknown_words: list[str] | None = None) -> None:
        super().__init__(message)
        self.unknown_words = list(unknown_words or [])


def check_query_text(text: str, what: str = "the query") -> None:
    """Refuse a query holding control characters (C0 such as newline, tab, CR or NUL; DEL; C1): a query is
    one line of text, and a control character in it is a pasting or encoding accident (or an attempt to
    forge log lines), never something a caption means. Accents, CJK, emoji and other printable text pass.

    A lone surrogate (``U+DC80``-``U+DCFF``: how Python decodes command-line bytes that are not UTF-8) is
    refused too: it is not text, and printing it back would write invalid UTF-8.

    Raises:
        QueryError: naming the first control characters (or surrogates) by code point (``U+000A``) and
            position.
    """
    surrogates = [(i, c) for i, c in enumerate(text) if unicodedata.category(c) == "Cs"]
    if surrogates:
        raise QueryError(
            f"{what} is not valid UTF-8 text ({_named(surrogates)}: bytes the text's encoding cannot decode)"
        )
    found = [(i, c) for i, c in enumerate(text) if unicodedata.category(c) == "Cc"]
    if found:
        raise QueryError(
            f"{what} contains control characters ({_named(found)}): a query is one line of printable text"
        )


def _named(found: list[tuple[int, str]]) -> str:
    """The first three ``(position, character)`` by code point and position (``U+000A at character 4``):
    printing the characters themselves would break the one-line error they go into."""
    named = ", ".join(f"U+{ord(c):04X} at character {i + 1}" for i, c in found[:3])
    return named + (f" and {len(found) - 3} more" if len(found) > 3 else "")


def quote_words(words: list[str]) -> str:
    """``'a', 'b'``: words named in a message."""
    return ", ".join(repr(w) for w in words)


def unknown_words_warning(words: list[str]) -> str:
    """The warning a result carries when some query words are unknown: they are encoded as the unknown
    token, which tells the model nothing about them but is scored like the query's other words (an
    explanation lists it)."""
    place = "its place" if len(words) == 1 else "their place"
    return (
        f"the model does not know {quote_words(words)}: it reads the unknown token in {place}, which means "
        "nothing to the model but is scored with the query's other words"
    )


def left_out(dropped: int, cut_word: str | None = None) -> str:
    """What of a query the model does not read: its last ``dropped`` (whitespace-separated) words and, when
    the limit falls inside a word, ``cut_word``, the word it reads the first tokens of only."""
    if cut_word is None:
        return f"its last {dropped} words were left out"
    if not dropped:
        return f"its last word, {cut_word!r}, is read in part"
    return f"{cut_word!r} is read in part and the {dropped} words after it were left out"


def truncation_warning(dropped: int, max_tokens: int, cut_word: str | None = None) -> str:
    """The warning a result carries when the query is longer than the model reads (:func:`left_out`)."""
    return (
        f"the query is longer than the {max_tokens} tokens the model reads (data.max_caption_len): "
        + left_out(dropped, cut_word)
    )


@dataclass
class Query:
    """An encoded query: (1, L) ids, (1,) length, (1, L, C) tokens and (1, C) global embedding;
    ``unknown_words``: the words the tokenizer encoded as unknown tokens, of those the model reads;
    ``dropped_words``: the words (whitespace-separated) past the ``max_tokens`` tokens the model reads;
    ``cut_word``: the word the limit falls inside (its first tokens are read), or None."""

    text: str
    ids: torch.Tensor
    lens: torch.Tensor
    tokens: torch.Tensor
    global_embedding: torch.Tensor
    unknown_words: list[str] = field(default_factory=list)
    dropped_words: int = 0
    max_tokens: int | None = None
    cut_word: str | None = None


@dataclass(frozen=True)
class SearchHit:
    """One result: 1-based ``rank``, index ``id``, ``path`` relative to the indexed folder, the final
    ``score`` (fine + alpha * global) and the first-stage ``global_score``."""

    rank: int
    id: int
    path: str
    score: float
    global_score: float


@dataclass
class SearchResult:
    """Results of one query, best first; ``timings`` in seconds (``encode``, ``shortlist``, ``rerank``,
    ``total``); ``shortlist`` images were re-ranked; ``unknown_words``: query words the model does not
    know (searched without them); ``dropped_words``: words past the ``max_tokens`` tokens the model reads
    (searched without them); ``cut_word``: the word the limit falls inside (read in part), or None."""

    query: str
    hits: list[SearchHit]
    shortlist: int
    timings: dict[str, float] = field(default_factory=dict)
    unknown_words: list[str] = field(default_factory=list)
    dropped_words: int = 0
    max_tokens: int | None = None
    cut_word: str | None = None

    @property
    def warning(self) -> str | None:
        """What the user should know about the result (unknown words, words left out), or None."""
        notes = [unknown_words_warning(self.unknown_words)] if self.unknown_words else []
        if self.dropped_words or self.cut_word is not None:
            notes.append(truncation_warning(self.dropped_words, int(self.max_tokens or 0), self.cut_word))
        return "; ".join(notes) or None

    def to_json(self) -> dict[str, Any]:
        """The ``/api/search`` body: ``{"query", "results": [{"id", "path", "score", "global_score"}], "ms",
        "shortlist"}``, plus ``"warning"`` when some query words are unknown (``"unknown_words"`` names them)
        or left out (``"dropped_words"`` counts them; ``"cut_word"``: the word read in part)."""
        body: dict[str, Any] = {
            "query": self.query,
            "results": [
                {"id": h.id, "path": h.path, "score": h.score, "global_score": h.global_score}
                for h in self.hits
            ],
            "ms": round(1000.0 * self.timings.get("total", 0.0), 3),
            "shortlist": self.shortlist,
        }
        warning = self.warning
        if warning:
            body["warning"] = warning
        if self.unknown_words:
            body["unknown_words"] = list(self.unknown_words)
        if self.dropped_words or self.cut_word is not None:
            body["dropped_words"] = self.dropped_words
        if self.cut_word is not None:
            body["cut_word"] = self.cut_word
        return body
