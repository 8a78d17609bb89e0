"""A researcher onboarding the Flickr30K recipes with their own data and local weights:

* captions almost entirely unknown to the vocabulary (a vocabulary of w0..w34 on English captions) trained
  without a word: counted when a split is tokenised, warned at data preparation and in ``data check``;
* ``data check`` passed an image size, caption length or vocabulary the model cannot take, which ``train``
  refused after loading the data and the weights: ``data check`` now runs the same model-against-data checks;
* the tokenizer ``create_model_and_transforms`` returns was documented as taking a list of captions but was
  not callable.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from conftest import laps_args, tiny_hf_laps_overrides
from patchword.cli import main
from patchword.data.config import DataConfig
from patchword.data.prepare import prepare_data
from patchword.data.split import RetrievalSplit
from patchword.data.tokenizers import BertCaptionTokenizer, WordVocab

pytestmark = pytest.mark.usefixtures("one_thread")

PLACEHOLDER_WORDS = [f"w{i}" for i in range(35)]


def _split(captions: list[str], name: str = "test") -> RetrievalSplit:
    n = len(captions)
    return RetrievalSplit(name, [f"{i}.png" for i in range(n)], captions, np.arange(n))


# ---------------------------------------------------------------------------- 1. unknown caption words


def test_a_placeholder_vocabulary_on_english_captions_is_warned_at_preparation(
    laps_dataset, tmp_path, caplog
):
    """The finding: every caption word is <unk>, and train / eval prepared the data without a word."""
    path = tmp_path / "vocab.json"
    WordVocab(PLACEHOLDER_WORDS).save(path)
    assert WordVocab.load(path).known_and_unknown_words("a red dog")[0] == []
    dc = DataConfig(
        dataset="laps",
        root=str(laps_dataset["root"]),
        image_root=str(laps_dataset["image_root"]),
        image_size=32,
        tokenizer="word",
        vocab_path=str(path),
        dense=False,
    )
    with caplog.at_level(logging.WARNING, logger="patchword.data.prepare"):
        prepare_data(dc, roles=["test"])  # train (encode_raw) and eval (prepare_data) share this step
    (record,) = [r for r in caplog.records if "unknown to the vocabulary" in r.getMessage()]
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert message.startswith(
        f"split 'test': 100% of the caption words (25 of 25 in 8 captions) are unknown to the vocabulary "
        f"{path} (data.vocab_path) and read as <unk>, e.g. "
    )
    assert "'red'" in message or "'green'" in message


def test_the_share_warns_above_half_of_the_caption_words():
    from patchword.data.pipeline import unknown_words_warning

    vocab = WordVocab(["a", "dog", "in", "the"])
    # 2 of 4 words unknown (half, a word counted once per caption): not warned about
    assert unknown_words_warning(_split(["a red red red", "dog cat"]), vocab) is None
    # 5 of 8 unknown
    message = unknown_words_warning(_split(["a red cat", "a cat in snowy park"]), vocab)
    assert message.startswith("split 'test': 62% of the caption words (5 of 8 in 2 captions)")
    assert "built from the training captions (data.vocab_min_count)" in message
    assert "e.g. 'cat', 'red', 'snowy', 'park'" in message


def test_a_bert_vocabulary_is_named_and_the_count_is_sampled(tmp_path):
    from patchword.data.pipeline import UNKNOWN_WORDS_SAMPLE, unknown_words_warning

    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PLACEHOLDER_WORDS]) + "\n"
    )
    tokenizer = BertCaptionTokenizer.from_pretrained(vocab_file)
    split = _split([f"a red dog w{i % 35}" for i in range(3 * UNKNOWN_WORDS_SAMPLE)], name="train")
    message = unknown_words_warning(split, tokenizer)
    assert message.startswith(
        f"split 'train': 75% of the caption words ({3 * UNKNOWN_WORDS_SAMPLE} of {4 * UNKNOWN_WORDS_SAMPLE} "
        f"in {UNKNOWN_WORDS_SAMPLE} sampled captions) are unknown to the vocabulary {vocab_file} "
        "(data.bert_vocab) and read as [UNK], e.g. 'a', 'red', 'dog'"
    )
    assert unknown_words_warning(_split(["w1 w2 red"]), tokenizer) is None


# ---------------------------------------------------------------------------- 2. data check = train's checks


def _tiny_hf_args(tiny_hf, laps_dataset, tmp_path, *extra: str) -> list[str]:
    return [*tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), "data.dense=false", *extra]


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("data.image_size=224", "data.image_size: is 224 but the image encoder (model.hf_vision="),
        ("data.max_caption_len=20", "data.max_caption_len: is 20 but the text encoder has 16 positions"),
        ("data.bert_vocab=BERT", "data.bert_vocab: the tokenizer has 35 ids but the text encoder"),
    ],
)
def test_data_check_refuses_what_train_refuses(tiny_hf, laps_dataset, tmp_path, capsys, override, error):
    """data check printed ok for each of these; train refused them after reading the data and weights."""
    override = override.replace("BERT", str(tiny_hf[0]))
    args = _tiny_hf_args(tiny_hf, laps_dataset, tmp_path, override)
    assert main(["data", "check", *args]) == 2
    out = capsys.readouterr().out
    assert f"model: model.matcher=laps: error: {error}" in out
    assert out.rstrip().endswith("the model does not fit the data")
    # train says the same
    assert main(["train", *args, f"output_dir={tmp_path / 'runs'}", "train.max_steps=1"]) == 2
    assert error in capsys.readouterr().err


def test_data_check_of_a_fitting_model_warns_of_unknown_words(tiny_hf, laps_dataset, tmp_path, capsys):
    """The tiny BERT's vocabulary (w0..w29) reads none of the English caption words: said, not refused."""
    assert main(["data", "check", *_tiny_hf_args(tiny_hf, laps_dataset, tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    warnings = [line for line in lines if line.startswith("    warning: ")]
    assert len(warnings) == 3, out
    assert warnings[0].startswith(
        "    warning: split 'train': 100% of the caption words (53 of 53 in 16 captions) are unknown to the "
        f"vocabulary {tmp_path / 'vocab20.txt'} (data.bert_vocab) and read as [UNK]"
    )
    assert "model: model.matcher=laps: fits the data as train checks it" in lines
    assert lines[-1] == "ok"


def test_data_check_of_a_vocabulary_built_from_training_text_warns_of_nothing(laps_dataset, capsys):
    assert main(["data", "check", *laps_args(laps_dataset)]) == 0
    out = capsys.readouterr().out
    assert "warning" not in out
    assert "model: model.matcher=vse: fits the data" in out
    # the tiny ViT's size, as train checks it (before data check built anything: the config check)
    assert main(["data", "check", *laps_args(laps_dataset, "model.tiny_vit.patch_size=16")]) == 0


# ---------------------------------------------------------------------------- 3. the tokenizer is callable


def test_the_tokenizers_are_called_on_a_list_of_captions(tiny_hf):
    from patchword import create_model_and_transforms
    from patchword.model import ModelConfig

    bert, vit = tiny_hf
    cfg = ModelConfig(
        matcher="vse",
        embed_dim=16,
        image_encoder="hf",
        hf_vision=str(vit),
        text_encoder="bert",
        hf_text=str(bert),
    )
    _, tok, _ = create_model_and_transforms(cfg)
    assert isinstance(tok, BertCaptionTokenizer)
    ids, lens = tok(["w1 w2 w3", "w4"])
    assert ids.shape == (2, 5) and ids.dtype == torch.long and lens.tolist() == [5, 3]
    assert torch.equal(ids, tok.batch_encode(["w1 w2 w3", "w4"])[0])
    _, words, _ = create_model_and_transforms("seps-tiny-32")
    assert isinstance(words, WordVocab)
    ids, lens = words(["a red circle"])
    assert ids.shape == (1, int(lens[0])) and torch.equal(ids, words.batch_encode(["a red circle"])[0])
    with pytest.raises(TypeError, match="pass \\[text\\]"):
        words("a red circle")


def test_the_models_doc_shows_the_call_and_its_outputs():
    import re

    from project_paths import ROOT

    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "models.md").read_text(), flags=re.S)
        if "tokenizer([" in b
    ]
    scope: dict = {}
    exec("from patchword import create_model_and_transforms\n" + block, scope)  # noqa: S102 - our own doc
    ids, lens = scope["ids"], scope["lens"]
    assert str(tuple(ids.shape)) in block and str(ids.dtype).removeprefix("torch.") in block
    assert str(ids.tolist()) in block.replace("\n#   ", " ").replace("# ids", "ids")
    assert f"{lens.tolist()}" in block


def test_data_check_compares_region_features_with_the_model(tmp_path, capsys):
    """Features of another detector (4 regions of 8 dims) passed data check; train refused them."""
    for split, n in {"train": 4, "dev": 2, "test": 2}.items():
        np.save(tmp_path / f"{split}_ims.npy", np.ones((n, 4, 8), dtype=np.float32))
        (tmp_path / f"{split}_caps.txt").write_text("a red dog on the grass\n" * 5 * n)
    assert main(["data", "check", "--config", "naaf_f30k", f"data.root={tmp_path}"]) == 2
    out = capsys.readouterr().out
    assert (
        f"model: naaf-precomp: error: model.precomp: the region features ({tmp_path / 'train_ims.npy'}) have "
        "4 regions of 8 dims but model.precomp.num_regions=36, model.precomp.region_dim=2048"
    ) in out
