"""A query longer than the model reads, and one that is not text.

Old code judged the words of the whole query while the model read its first ``data.max_caption_len`` tokens:
"zzz " * 45 + "red circle" was answered with a warning that "the results rest on the other words of the
query", words that had been cut off, and truncation was never reported. And ``patchword search`` took bytes
that are not UTF-8 (a lone surrogate from the command line) and printed them back as invalid UTF-8."""

from __future__ import annotations

import json

import pytest

from conftest import one_error_line
from patchword.cli.search import main_search
from patchword.search.results import QueryError, check_query_text

pytestmark = pytest.mark.usefixtures("one_thread")


def test_words_past_what_the_model_reads_are_not_counted_as_read(env, searcher, capsys):
    max_tokens = env.run.config.data.max_caption_len
    read = max_tokens - 2  # between the start and end tokens, one token a word (the word vocabulary)
    query = "zzz " * (read + 7) + "red circle"  # 9 words past what the model reads
    with pytest.raises(QueryError) as err:
        searcher.search(query, k=3)
    assert str(err.value).startswith(
        f"the model knows none of the query's words ('zzz') in the {max_tokens} tokens it reads (its last 9 "
        "words were left out); rephrase it"
    )
    assert err.value.unknown_words == ["zzz"]
    assert main_search([str(env.index_dir), query]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"


def test_a_truncated_query_says_how_many_words_were_left_out(env, searcher, capsys):
    max_tokens = env.run.config.data.max_caption_len
    words = ("a red circle " * 30).split()
    result = searcher.search(" ".join(words), k=3)
    cut = len(words) - (max_tokens - 2)
    warning = (
        f"the query is longer than the {max_tokens} tokens the model reads (data.max_caption_len): its last "
        f"{cut} words were left out"
    )
    assert (result.dropped_words, result.unknown_words, result.warning) == (cut, [], warning)
    body = result.to_json()
    assert (body["dropped_words"], body["warning"]) == (cut, warning) and "unknown_words" not in body
    # the words counted as read are those the tokenizer keeps
    query = searcher.encode_query(" ".join(words))
    kept, _ = env.run.tokenize([" ".join(words[: max_tokens - 2])])
    assert query.ids.tolist() == kept.tolist()

    mixed = searcher.search("red circle " + "zzz " * 45, k=3)
    mixed_cut = 47 - (max_tokens - 2)
    assert mixed.unknown_words == ["zzz"] and mixed.dropped_words == mixed_cut
    assert mixed.warning == (
        "the model does not know 'zzz': it reads the unknown token in its place, which means nothing to the "
        "model but is scored with the query's other words; the query is longer than the "
        f"{max_tokens} tokens the model reads (data.max_caption_len): its last {mixed_cut} words were "
        "left out"
    )
    assert main_search([str(env.index_dir), " ".join(words), "-k", "3", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["dropped_words"] == cut
    assert captured.err.splitlines()[-1] == f"warning: {warning}"

    short = searcher.search("a red circle", k=3)
    assert short.dropped_words == 0 and "dropped_words" not in short.to_json() and short.warning is None


def test_a_query_that_is_not_utf8_is_refused_naming_it(env, capsys):
    query = "red \udcff circle"  # what Python makes of the bytes b"red \xff circle" on the command line
    with pytest.raises(QueryError, match=r"^the query is not valid UTF-8 text \(U\+DCFF at character 5"):
        check_query_text(query)
    assert main_search([str(env.index_dir), query, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_error_line(captured.err).startswith("error: the query is not valid UTF-8 text (U+DCFF")
