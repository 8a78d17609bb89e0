"""Settings that shape a vocabulary built from the training text, given beside ``data.vocab_path`` (whose
vocabulary keeps its own rule and words): refused, before anything is written, naming the key. Before e427c5e
accepted them silently, and config.yaml recorded ``data.word_split=unicode`` for a run whose tokenizer cut
words by ``alnum`` (every ``--config demo`` run: its vocabulary is the shipped encoders')."""

from __future__ import annotations

import pytest

from conftest import one_error_line
from patchword.cli import main
from patchword.data.config import DataConfig
from patchword.data.prepare import build_tokenizer
from patchword.data.tokenizers import WordVocab
from patchword.errors import ConfigError

TINY = ["data.num_train=20", "data.num_dev=8", "data.num_test=8", "train.batch_size=16", "train.max_steps=1"]


@pytest.mark.parametrize(
    ("setting", "key"),
    [("data.word_split=unicode", "data.word_split"), ("data.vocab_min_count=4", "data.vocab_min_count")],
)
def test_train_with_a_vocabulary_file_refuses_the_build_settings(tmp_path, capsys, setting, key):
    args = ["train", "--config", "demo", *TINY, setting, f"output_dir={tmp_path}", "name=r"]
    assert main(args) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}: ")
    assert not (tmp_path / "r").exists()


def test_data_check_refuses_a_minimum_count_beside_a_vocabulary_file(capsys):
    assert main(["data", "check", "--config", "demo", "data.vocab_min_count=50", *TINY[:3]]) == 2
    assert "error: data.vocab_min_count: " in capsys.readouterr().err


def test_a_word_split_equal_to_the_vocabularys_own_or_the_default_is_accepted(tmp_path):
    path = tmp_path / "vocab.json"
    WordVocab.build(["a red cube, left of it"], split="treebank").save(path)
    for split in ("alnum", "treebank"):  # alnum: the default, "the vocabulary's own"
        vocab = build_tokenizer(DataConfig(vocab_path=str(path), word_split=split), None)
        assert vocab.split == "treebank"
    with pytest.raises(ConfigError) as refused:
        build_tokenizer(DataConfig(vocab_path=str(path), word_split="unicode"), None)
    assert refused.value.key == "data.word_split" and "treebank" in str(refused.value)
