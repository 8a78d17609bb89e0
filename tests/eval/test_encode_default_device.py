"""``encode_image_tokens`` / ``encode_text_tokens`` run where the model is unless told otherwise.

Bug: both defaulted to ``device="cpu"`` (SPEC: a public function takes the device from an argument or from
the model, as the scoring of a matrix, ``global_embeddings`` and ``two_stage_scores`` do): a model on an
accelerator was handed host inputs (CUDA: "Expected all tensors to be on the same device"). Checked on the
simulated accelerator (:mod:`patchword.testing.simulated_device`), which refuses host/device mixes as CUDA
does.
"""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from patchword.eval import encode_image_tokens, encode_text_tokens
from patchword.testing import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs():
    g = torch.Generator().manual_seed(0)
    pixels = torch.rand(5, 3, 32, 32, generator=g)
    ids, lens = torch.randint(5, 40, (6, 9), generator=g), torch.tensor([9, 3, 5, 9, 2, 7])
    return pixels, ids, lens


def test_the_encoders_default_to_the_models_device():
    model = tiny_model([f"w{i}" for i in range(40)])
    pixels, ids, lens = _inputs()
    want_img = encode_image_tokens(model, pixels, batch_size=2)
    want_txt = encode_text_tokens(model, ids, lens, batch_size=4)
    sim = SimulatedDevice()
    with sim:
        sim.to_device(model)
        assert next(model.parameters()).device == sim.device
        sim.reset()
        img = encode_image_tokens(model, pixels, batch_size=2)  # no device: the model's
        txt = encode_text_tokens(model, ids, lens, batch_size=4)
    # computed there (the inputs went up: before, host inputs met device weights and the op raised)
    assert sim.counts.h2d_copies > 0
    assert img.device.type == "cpu" and txt.device.type == "cpu"  # the result comes back to the host
    assert (img - want_img).abs().max().item() <= 1e-5
    assert (txt - want_txt).abs().max().item() <= 1e-5


def test_an_explicit_device_still_wins_and_a_model_without_parameters_encodes_on_the_cpu():
    class _Identity(torch.nn.Module):  # no parameter, no buffer: nothing says where it is
        def encode_images(self, images):
            assert images.device.type == "cpu"
            return images.flatten(2).transpose(1, 2)

    pixels, _, _ = _inputs()
    out = encode_image_tokens(_Identity(), pixels)
    assert torch.equal(out, pixels.flatten(2).transpose(1, 2))
    model = tiny_model([f"w{i}" for i in range(40)])
    assert torch.equal(encode_image_tokens(model, pixels, device="cpu"), encode_image_tokens(model, pixels))
