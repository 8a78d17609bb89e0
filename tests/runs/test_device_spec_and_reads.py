"""The device helpers shared by an import's checks, training and search: a ``device`` value's grammar
(without asking whether this machine has it) and the one host copy of several small tensors."""

import pytest
import torch

from patchword.device import check_device_spec, read_together, resolve_device
from patchword.errors import ConfigError


def test_the_grammar_accepts_devices_this_machine_lacks_and_refuses_a_trailing_newline():
    for spec in ("auto", "cpu", "mps", "cuda", "cuda:7"):
        check_device_spec(spec)  # whether they exist is the evaluating machine's to say
    for spec in ("gpu", "cuda:", "cpu\n"):
        with pytest.raises(ConfigError, match=r"^device: must be auto, cpu, cuda, cuda:N or mps, got "):
            check_device_spec(spec)
    # was accepted by the grammar, then torch's bare RuntimeError ("Invalid device string")
    with pytest.raises(ConfigError, match=r"^eval.device: must be auto"):
        resolve_device("cpu\n", key="eval.device")


def test_read_together_gives_every_tensor_back_exactly_with_its_shape_and_dtype():
    torch.manual_seed(0)
    tensors = [
        torch.randn(3, 4),  # float32: bit-identical through the float64 buffer
        torch.tensor(0.1),  # 0-dim
        torch.tensor([True, False, True]),
        torch.tensor([[3, 2**40]]),  # int64 beyond float32's exact range
        torch.randn(5, dtype=torch.bfloat16),
        torch.randn(2, dtype=torch.float64),
        torch.zeros(0, 2),
    ]
    back = read_together(*tensors)
    assert len(back) == len(tensors)
    for given, got in zip(tensors, back, strict=True):
        assert got.device.type == "cpu" and got.dtype == given.dtype and got.shape == given.shape
        assert torch.equal(got, given)
    assert read_together() == []
