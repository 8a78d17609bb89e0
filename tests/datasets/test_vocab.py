"""Word vocabulary: tokenisation, specials, encoding, padding, truncation and SCAN json round trips."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import torch

from patchword.data.tokenizers import WordVocab, tokenize

TEXTS = ["A red circle, left of a blue square.", "a RED square!", "two objects: a red circle"]


@pytest.fixture
def vocab() -> WordVocab:
    return WordVocab.build(TEXTS)


def test_tokenize_lowercases_and_drops_punctuation() -> None:
    assert tokenize("A large-red Circle, (top_left) 3x!") == [
        "a",
        "large",
        "red",
        "circle",
        "top",
        "left",
        "3x",
    ]
    assert tokenize(" ... ") == []


def test_treebank_split_keeps_punctuation_and_hyphens_as_nltk_word_tokenize() -> None:
    """The split of official SCAN / NAAF vocabularies: nltk.word_tokenize on a one-sentence caption."""
    nltk = pytest.importorskip("nltk")  # a dev dependency: never skipped in CI
    text = "A white-walled room, and the dog's bowl."
    want = nltk.tokenize.word_tokenize(text.lower(), preserve_line=True)
    assert tokenize(text, "treebank") == want
    assert want == ["a", "white-walled", "room", ",", "and", "the", "dog", "'s", "bowl", "."]
    assert tokenize(text) == ["a", "white", "walled", "room", "and", "the", "dog", "s", "bowl"]


def test_the_split_is_saved_with_the_vocabulary(tmp_path: Path) -> None:
    vocab = WordVocab(["a", "dog", ".", "'s"], split="treebank")
    assert vocab.encode("A dog's.") == [1, 4, 5, 7, 6, 2]
    vocab.save(tmp_path / "v.json")
    assert json.loads((tmp_path / "v.json").read_text())["split"] == "treebank"
    again = WordVocab.load(tmp_path / "v.json")
    assert again.split == "treebank" and again.encode("A dog's.") == vocab.encode("A dog's.")
    WordVocab(["a"]).save(tmp_path / "plain.json")  # the default rule writes SCAN's own keys only
    assert set(json.loads((tmp_path / "plain.json").read_text())) == {"word2idx", "idx2word", "idx"}
    payload = json.loads((tmp_path / "v.json").read_text()) | {"split": "spaces"}
    (tmp_path / "bad.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match="unknown word split 'spaces'"):
        WordVocab.load(tmp_path / "bad.json")


def test_specials_and_frequency_order(vocab: WordVocab) -> None:
    assert vocab.idx2word[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert (vocab.pad_id, vocab.start_id, vocab.end_id, vocab.unk_id) == (0, 1, 2, 3)
    # "a" x4, "red" x3, then circle/square x2 alphabetically, then the singletons alphabetically
    assert vocab.idx2word[4:] == ["a", "red", "circle", "square", "blue", "left", "objects", "of", "two"]
    assert len(vocab) == 13
    assert WordVocab.build(reversed(TEXTS)).idx2word == vocab.idx2word  # text order does not matter


def test_min_count(vocab: WordVocab) -> None:
    assert WordVocab.build(TEXTS, min_count=2).idx2word[4:] == ["a", "red", "circle", "square"]


def test_encode_decode(vocab: WordVocab) -> None:
    ids = vocab.encode("A red circle!")
    assert ids == [1, 4, 5, 6, 2]
    assert vocab.decode(ids) == "a red circle"
    assert vocab.decode(ids, skip_special=False) == "<start> a red circle <end>"
    assert vocab.encode("a purple circle") == [1, 4, 3, 6, 2]  # unknown word -> <unk>
    assert vocab.decode(vocab.encode("a purple circle")) == "a <unk> circle"


def test_batch_encode_pads_and_counts_specials(vocab: WordVocab) -> None:
    ids, lens = vocab.batch_encode(["a red circle", "square"])
    assert ids.dtype == lens.dtype == torch.long
    assert ids.tolist() == [[1, 4, 5, 6, 2], [1, 7, 2, 0, 0]]
    assert lens.tolist() == [5, 3]


def test_batch_encode_truncates_keeping_end(vocab: WordVocab) -> None:
    ids, lens = vocab.batch_encode(["a red circle left of a blue square", "red"], max_len=4)
    assert ids.tolist() == [[1, 4, 5, 2], [1, 5, 2, 0]]
    assert lens.tolist() == [4, 3]
    short, _ = vocab.batch_encode(["red"], max_len=10)
    assert short.shape == (1, 3)  # padded to the longest sequence, not to max_len


def test_empty_text_error_names_index(vocab: WordVocab) -> None:
    with pytest.raises(ValueError, match="text 1 is empty"):
        vocab.batch_encode(["a red circle", " ,. "])
    with pytest.raises(ValueError, match="text 2 is empty"):
        WordVocab.build(["a", "b", ""])
    with pytest.raises(ValueError, match="max_len"):
        vocab.batch_encode(["a"], max_len=2)
    with pytest.raises(ValueError, match="nothing to encode"):
        vocab.batch_encode([])


def test_save_load_round_trip_in_scan_format(vocab: WordVocab, tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    vocab.save(path)
    payload = json.loads(path.read_text())
    assert payload["word2idx"]["red"] == 5 and payload["idx2word"]["5"] == "red" and payload["idx"] == 13
    loaded = WordVocab.load(path)
    assert loaded.idx2word == vocab.idx2word and loaded.word2idx == vocab.word2idx
    assert loaded.encode("a red circle") == vocab.encode("a red circle")


def test_load_rejects_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"words": []}))
    with pytest.raises(ValueError, match="not a word2idx"):
        WordVocab.load(path)
    words = ["<start>", "<pad>", "<end>", "<unk>", "a"]
    path.write_text(
        json.dumps({"word2idx": {w: i for i, w in enumerate(words)}, "idx2word": dict(enumerate(words))})
    )
    with pytest.raises(ValueError, match="first ids"):
        WordVocab.load(path)
    path.write_text(json.dumps({"word2idx": {"<pad>": 0, "a": 1}, "idx2word": {"0": "<pad>", "1": "b"}}))
    with pytest.raises(ValueError, match="disagree"):
        WordVocab.load(path)


def test_unknown_words_are_the_ones_encoded_as_unk(vocab: WordVocab) -> None:
    known, unknown = vocab.known_and_unknown_words("A zebra, a DOG and a zebra!")
    assert (known, unknown) == (["a"], ["zebra", "dog", "and"])
    ids = vocab.encode("A zebra, a DOG and a zebra!")[1:-1]
    words = tokenize("A zebra, a DOG and a zebra!")
    assert unknown == list(dict.fromkeys(w for w, i in zip(words, ids, strict=True) if i == vocab.unk_id))
    assert known == list(dict.fromkeys(w for w, i in zip(words, ids, strict=True) if i != vocab.unk_id))


def test_bert_unknown_words_are_those_wordpiece_reads_as_a_single_unk() -> None:
    pytest.importorskip("transformers")
    from patchword.data.tokenizers import BertCaptionTokenizer

    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "circle", "z", "##z", "##q", "!"]
    tok = BertCaptionTokenizer({w: i for i, w in enumerate(pieces)})
    # "zzzq" splits into known pieces (z ##z ##z ##q): the model reads them, so it is known; "qz" cannot
    # start with a piece ("q" alone is not one), and "\N{SNOWMAN}" is no piece at all: both are one [UNK].
    known, unknown = tok.known_and_unknown_words("Red zzzq qz \N{SNOWMAN} circle! qz")
    assert (known, unknown) == (["red", "zzzq", "circle", "!"], ["qz", "\N{SNOWMAN}"])
    body = tok.encode("Red zzzq qz \N{SNOWMAN} circle! qz")[1:-1]
    assert body.count(tok.unk_id) == 3 and len(body) == 10


# BERT's _is_chinese_char blocks, as the unicode split's first version tested them one by one.
_CJK_BLOCKS = [
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
]


def _reference_unicode_words(text: str) -> list[str]:
    """The unicode split written out plainly: each character tested against every block."""
    words, word = [], ""
    for char in unicodedata.normalize("NFC", text.lower()):
        if any(low <= ord(char) <= high for low, high in _CJK_BLOCKS):
            words += [word, char] if word else [char]
            word = ""
        elif char.isalnum() or (word and unicodedata.category(char).startswith("M")):
            word += char
        elif word:
            words.append(word)
            word = ""
    return words + [word] if word else words


def test_the_unicode_split_matches_a_plain_per_block_reference() -> None:
    """Every block's first and last code point and its two neighbours outside it, inside and between
    Latin words, with combining marks, digits and a decomposed accent: the same tokens as the reference."""
    pieces = ["Café cafe\u0301 x\u0301y \u0301lead 42nd x_y हिन्दी ⅻ"]
    for low, high in _CJK_BLOCKS:
        pieces.append(f"a{chr(low)}b {chr(high)}\u0301c{chr(low - 1)}D{chr(high + 1)}7 {chr(low)}{chr(high)}")
    text = " ".join(pieces)
    tokens = tokenize(text, "unicode")
    assert tokens == _reference_unicode_words(text)
    for low, high in _CJK_BLOCKS:  # each end of each block is a word of its own (NFC maps compatibility ones)
        for code in (low, high):
            assert unicodedata.normalize("NFC", chr(code)) in tokens
    assert tokens[:8] == ["café", "café", "x\u0301y", "lead", "42nd", "x", "y", "हिन्दी"]
