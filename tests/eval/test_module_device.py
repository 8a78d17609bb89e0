"""Where a module lives when no device is given: ``patchword.device.module_device``, the one rule
``encode_image_tokens`` / ``encode_text_tokens`` and the scoring engine both use (each had its own copy):
its first parameter's device, else its first buffer's, else the fallback (the scoring engine passes the
inputs' for a matcher without weights), else the CPU."""

from __future__ import annotations

import torch
from torch import nn

from patchword.device import module_device

META = torch.device("meta")


def test_a_modules_device_is_its_first_parameters_then_its_first_buffers():
    assert module_device(nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(nn.Linear(2, 2, device="meta")) == META
    buffered = nn.Module()
    buffered.register_buffer("scale", torch.ones(1, device="meta"))
    assert module_device(buffered) == META
    assert module_device(buffered, fallback=torch.device("cpu")) == META  # the module's own comes first


def test_a_module_without_tensors_is_on_the_fallback_else_the_cpu():
    assert module_device(nn.Identity()) == torch.device("cpu")
    assert module_device(nn.Identity(), fallback=META) == META
