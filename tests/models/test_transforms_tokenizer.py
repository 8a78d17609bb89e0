"""``create_model_and_transforms`` hands back a tokenizer that cuts captions as training did."""

from __future__ import annotations

import torch

from patchword import create_model_and_transforms
from patchword.data.config import DataConfig
from patchword.runs import load_run

LONG = " ".join(["a red circle left of a blue square"] * 40)  # 320 words


def test_a_saved_runs_tokenizer_cuts_as_the_run_does(trained_tiny_run):
    """Defect: the tokenizer returned did not cut: 50 ids where the run's ``tokenize`` gives its
    ``data.max_caption_len`` (and over 160 words failed in the text encoder)."""
    model, tokenizer, _ = create_model_and_transforms(str(trained_tiny_run))
    run = load_run(trained_tiny_run)
    texts = ["a red circle", LONG]
    got, want = tokenizer.batch_encode(texts), run.tokenize(texts)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert int(got[1].max()) == run.config.data.max_caption_len
    assert run.tokenizer.batch_encode([LONG])[0].shape[1] > run.config.data.max_caption_len  # not changed


def test_a_named_models_tokenizer_cuts_to_the_training_default():
    model, tokenizer, _ = create_model_and_transforms("seps-tiny-32", pretrained=False)
    ids, lens = tokenizer.batch_encode([LONG])
    assert int(lens.max()) == min(DataConfig().max_caption_len, model.text_encoder.max_len)
    with torch.no_grad():
        model.eval().text_encoder(ids, lens)  # within the encoder's positions
