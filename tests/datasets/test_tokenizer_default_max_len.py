"""A tokenizer can carry a model's caption length: ``max_len`` set at construction (or on a copy with
``with_max_len``) is the truncation ``batch_encode`` applies when a call gives none, so a tokenizer handed
out with a model (``create_model_and_transforms``) encodes as the run's ``data.max_caption_len`` does."""

from __future__ import annotations

import pytest
import torch

from patchword.data.tokenizers import WordVocab

LONG = " ".join(["a red circle left of a blue square"] * 6)  # 48 words


def test_a_word_vocabulary_truncates_to_its_default_max_len(tmp_path):
    plain = WordVocab.build([LONG])
    want = plain.batch_encode([LONG, "a red circle"], max_len=10)
    capped = plain.with_max_len(10)
    assert torch.equal(capped.batch_encode([LONG, "a red circle"])[0], want[0])
    assert torch.equal(capped.batch_encode([LONG, "a red circle"])[1], want[1])
    assert capped.batch_encode([LONG])[0][0, -1].item() == capped.end_id  # <end> kept last
    # the copy's default, not the original's: the original still encodes everything
    assert plain.max_len is None and plain.batch_encode([LONG])[1].tolist() == [50]
    # an explicit max_len still wins
    assert capped.batch_encode([LONG], max_len=20)[1].tolist() == [20]
    assert capped.batch_encode([LONG], 20)[1].tolist() == [20]
    # set at construction and when loading
    assert WordVocab(plain.idx2word[4:], max_len=10).batch_encode([LONG])[1].tolist() == [10]
    plain.save(tmp_path / "vocab.json")
    loaded = WordVocab.load(tmp_path / "vocab.json", max_len=12)
    assert loaded.batch_encode([LONG])[1].tolist() == [12]
    assert WordVocab.load(tmp_path / "vocab.json").max_len is None  # not saved with the vocabulary


@pytest.mark.parametrize(
    ("value", "error"), [(2, ValueError), (0, ValueError), (10.0, TypeError), (True, TypeError)]
)
def test_a_word_vocabulary_refuses_a_default_max_len_that_cannot_work(value, error):
    with pytest.raises(error, match="max_len"):
        WordVocab(["red"], max_len=value)
    with pytest.raises(error, match="max_len"):
        WordVocab(["red"]).with_max_len(value)


def test_a_bert_tokenizer_truncates_to_its_default_max_len():
    pytest.importorskip("transformers")
    from patchword.data.tokenizers import BertCaptionTokenizer

    pieces = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "a",
        "red",
        "circle",
        "left",
        "of",
        "blue",
        "square",
    ]
    plain = BertCaptionTokenizer({w: i for i, w in enumerate(pieces)})
    assert plain.max_len is None and plain.batch_encode([LONG])[1].tolist() == [50]
    capped = plain.with_max_len(40)
    ids, lens = capped.batch_encode([LONG, "a red circle"])
    want_ids, want_lens = plain.batch_encode([LONG, "a red circle"], max_len=40)
    assert torch.equal(ids, want_ids) and torch.equal(lens, want_lens)
    assert lens.tolist() == [40, 5] and ids[0, 39].item() == capped.sep_id
    assert plain.batch_encode([LONG])[1].tolist() == [50]  # the original is left as it is
    assert capped.batch_encode([LONG], max_len=45)[1].tolist() == [45]
    built = BertCaptionTokenizer({w: i for i, w in enumerate(pieces)}, max_len=8)
    assert built.batch_encode([LONG])[1].tolist() == [8]
    with pytest.raises(ValueError, match="max_len"):
        plain.with_max_len(1)
