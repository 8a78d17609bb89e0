"""What ``create_model`` and the model's encoders say of arguments they cannot use, before anything is
built or run: a device this machine lacks (``auto`` accepted, as the CLI's default), a vocabulary or width
below one, and encoder inputs of the wrong kind (ids that are not token ids of the vocabulary, integer
pixels, nothing to encode), each one ValueError naming the argument instead of torch's error."""

from __future__ import annotations

import warnings

import pytest
import torch

from patchword import create_model
from patchword.errors import ConfigError
from patchword.eval import encode_image_tokens, encode_text_tokens

pytestmark = pytest.mark.usefixtures("one_thread")

NAMED = "seps-tiny-32"
NO_CUDA = r"^device: cuda requested but CUDA is not available \(.*\); use device=auto or cpu$"


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CUDA, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="module")
def model():
    return create_model(NAMED, pretrained=False).eval()


def test_a_missing_gpu_is_named_and_auto_is_the_cpu(no_cuda):
    """Old code: "AssertionError: Torch not compiled with CUDA enabled" after the whole build (on a CUDA
    machine the model went to the GPU); ``auto``: "RuntimeError: Expected one of cpu, cuda, ..."."""
    with pytest.raises(ConfigError, match=NO_CUDA):
        create_model(NAMED, pretrained=False, device="cuda")
    built = create_model(NAMED, pretrained=False, device="auto")
    assert {p.device.type for p in built.parameters()} == {"cpu"}
    with pytest.raises(ValueError, match=r"^device: not a torch device: 'gpu'"):
        create_model(NAMED, pretrained=False, device="gpu")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 0}, "vocab_size: must be an int >= 1, got 0"),
        ({"vocab_size": -1}, "vocab_size: must be an int >= 1, got -1"),
        ({"embed_dim": 0}, "model.embed_dim: must be an int >= 1, got 0"),
        ({"embed_dim": -3}, "model.embed_dim: must be an int >= 1, got -3"),
    ],
)
def test_a_size_below_one_is_refused_by_its_key_before_anything_is_built(overrides, message):
    """Old code: vocab_size=0 built an Embedding(0, C) every forward failed on; -1 and embed_dim=-3 were
    torch's "Trying to create tensor with negative dimension"; embed_dim=0 was named ``model.seps`` after a
    torch warning about a zero-element tensor."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing was built: no torch warning about empty layers
        with pytest.raises(ConfigError) as caught:
            create_model(NAMED, pretrained=False, **overrides)
    assert str(caught.value) == message


def test_token_ids_out_of_the_vocabulary_or_not_integers_are_named(model):
    """Old code: IndexError "index out of range in self" (ids >= vocab, or negative), and a RuntimeError
    about index scalar types for float ids. The encoding helper reads the ids once per call; the model's
    encode_texts, which every training step calls, checks their dtype only (reading them would make the
    step wait for the device)."""
    vocab = model.text_encoder.vocab_size
    outside = r"^ids: token id {} is outside the text encoder's vocabulary \(ids must be in \[0, {}\)\)$"
    with pytest.raises(ValueError, match=outside.format(vocab, vocab)):
        encode_text_tokens(model, torch.full((2, 5), vocab), [5, 5])
    with pytest.raises(ValueError, match=outside.format(-1, vocab)):
        encode_text_tokens(model, torch.full((2, 5), -1, dtype=torch.int32), [5, 5])
    float_ids = r"^ids must be int64 \(or int32\) token ids, got torch.float32$"
    with pytest.raises(ValueError, match=float_ids):
        encode_text_tokens(model, torch.ones(2, 5), [5, 5])
    with pytest.raises(ValueError, match=float_ids):
        model.encode_texts(torch.ones(2, 5), torch.tensor([5, 5]))
    ids = torch.ones(2, 6, dtype=torch.long)
    ids[:, 5] = vocab  # beyond every text's length: the batch is trimmed before it, never read, not refused
    assert encode_text_tokens(model, ids, [5, 3]).shape == (2, 6, model.matcher.embed_dim)


def test_integer_pixels_are_refused_with_the_way_to_preprocess_them(model):
    """Old code: RuntimeError "Input type (unsigned char) and bias type (float) should be the same"."""
    pixels = torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)
    with pytest.raises(
        ValueError, match=r"^images must be float, got torch.uint8: use the run's preprocess transform$"
    ):
        model.encode_images(pixels)
    with pytest.raises(ValueError, match=r"got torch.uint8: use the run's preprocess transform"):
        encode_image_tokens(model, pixels)


def test_nothing_to_encode_is_named(model):
    """Old code: "torch.cat(): expected a non-empty list of Tensors"."""
    with pytest.raises(ValueError, match=r"^images: no images to encode \(0 given\)$"):
        encode_image_tokens(model, torch.randn(0, 3, 32, 32))
    with pytest.raises(ValueError, match=r"^ids: no texts to encode \(0 given\)$"):
        encode_text_tokens(model, torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, dtype=torch.long))
