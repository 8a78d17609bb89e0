"""A search query as the run's model reads it (:meth:`patchword.search.query.Searcher.encode_query`): the
part of the text within the model's caption length, the words it knows, the query's tokens and global
embedding; and the names of a tokenizer's tokens (an explanation's words)."""

from __future__ import annotations

import torch

from patchword.runs import LoadedRun
from patchword.search.results import Query, QueryError, check_query_text, left_out, quote_words

__all__ = ["encode_query", "read_part", "token_namer"]


@torch.no_grad()
def encode_query(run: LoadedRun, text: str) -> Query:
    """Tokenise and encode ``text`` with ``run``'s model (truncated to the run's ``data.max_caption_len``
    tokens); the global embedding is its matcher's ``global_text``.

    A query whose every word the tokenizer can only encode as its unknown token is refused: the model
    would rank images for ``<unk>`` alone and answer with confident nonsense. What "unknown" means is
    the tokenizer's ``known_and_unknown_words``: for a word vocabulary, not in the vocabulary; for
    BERT, a word WordPiece turns into ``[UNK]`` as a whole. Some unknown words are allowed and listed
    in ``Query.unknown_words``. Words are judged on the part of the query the model reads: words past
    its ``max_caption_len`` tokens are left out, counted in ``Query.dropped_words`` (and a word the
    limit falls inside is ``Query.cut_word``).

    Raises:
        QueryError: empty, control characters (:func:`~patchword.search.results.check_query_text`), no word
            at all, or no word the model knows among those it reads (naming the words).
    """
    if not isinstance(text, str) or not text.strip():
        raise QueryError("the query is empty")
    check_query_text(text)
    read, dropped, cut_word = read_part(run, text.strip())
    known, unknown = run.tokenizer.known_and_unknown_words(read)
    if unknown and not known:
        max_tokens = run.config.data.max_caption_len
        cut = (
            f" in the {max_tokens} tokens it reads ({left_out(dropped, cut_word)})"
            if dropped or cut_word is not None
            else ""
        )
        raise QueryError(
            f"the model knows none of the query's words ({quote_words(unknown)}){cut}; rephrase it with "
            "words of its vocabulary (for a model trained from scratch: words of its training captions)",
            unknown_words=unknown,
        )
    try:
        ids, lens = run.tokenize([text.strip()])
    except ValueError as err:
        # NoWordsError's message labels the text by its position in a batch ("text 0"), meaningless for
        # the one query: its reason says what was missing.
        reason = getattr(err, "reason", None) or str(err)
        raise QueryError(f"the query has no words the model can read ({reason}): {text.strip()!r}") from err
    # Host lengths: the encoder and the matcher check them there (no read of the device), and the ids go up
    # without waiting for the device's queue.
    tokens = run.model.encode_texts(ids.to(run.device, non_blocking=True), lens)
    global_embedding = run.model.matcher.global_text(tokens, lens).float().cpu()
    max_tokens = run.config.data.max_caption_len
    return Query(
        text, ids, lens, tokens.float().cpu(), global_embedding, unknown, dropped, max_tokens, cut_word
    )


def read_part(run: LoadedRun, text: str) -> tuple[str, int, str | None]:
    """The part of ``text`` ``run``'s model reads whole (the whitespace-separated words whose tokens fit in
    ``data.max_caption_len``, specials included), how many words are left out after it, and the word
    the limit falls inside (the model reads its first tokens: it is neither read whole nor left out), or
    None. A first word longer than the limit alone is kept in the part, and is that word."""
    max_tokens = run.config.data.max_caption_len

    def tokens(part: str) -> int:
        try:
            return int(run.tokenizer.batch_encode([part])[1][0])
        except ValueError:  # no word at all (punctuation): nothing that could be cut
            return 0

    if max_tokens is None or tokens(text) <= max_tokens:
        return text, 0, None
    words = text.split()
    low, high = 1, len(words) - 1  # the first word is kept; the whole text does not fit
    while low < high:  # the most words that fit (a longer prefix never takes fewer tokens)
        middle = (low + high + 1) // 2
        fits = tokens(" ".join(words[:middle])) <= max_tokens
        low, high = (middle, high) if fits else (low, middle - 1)
    read = " ".join(words[:low])
    used = tokens(read)
    if used > max_tokens:  # the first word alone is longer than the limit
        return read, len(words) - 1, words[0]
    if used < max_tokens:  # room left: the truncation keeps the next word's first tokens
        return read, len(words) - low - 1, words[low]
    return read, len(words) - low, None


def token_namer(tokenizer: object):
    """``id -> token text`` for the run's tokenizer (word vocabularies and BERT WordPiece; ``[id]`` else)."""
    words = getattr(tokenizer, "idx2word", None)
    if words is not None:
        return lambda i: words[i] if 0 <= i < len(words) else f"[{i}]"
    vocab = getattr(tokenizer, "vocab", None)
    if isinstance(vocab, dict):
        inverse = {v: k for k, v in vocab.items()}
        return lambda i: inverse.get(i, f"[{i}]")
    return lambda i: f"[{i}]"
