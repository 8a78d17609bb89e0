"""The error of weights that do not fit a model (``checkpoint.load_fitting_weights``: ``patchword eval`` or
``bench --checkpoint`` given another model's checkpoint) is one readable line: old code quoted torch's whole
"Missing key(s)" list, hundreds of names for a ViT + BERT model."""

from __future__ import annotations

import pytest
import torch

from patchword.checkpoint import load_fitting_weights
from patchword.errors import ConfigError


def _error(model: torch.nn.Module, weights: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        load_fitting_weights(model, weights, "other.pt", "--checkpoint", "this config builds")
    assert caught.value.key == "--checkpoint"
    return caught.value.detail


def test_a_long_key_list_is_cut_to_three_names_and_a_count():
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(30)])
    assert _error(model, {}) == (
        "the weights in other.pt do not fit the model this config builds: Missing key(s) in state_dict: "
        '"0.weight", "0.bias", "1.weight" and 57 more.'
    )


def test_a_short_list_and_a_shape_mismatch_are_quoted_whole():
    model = torch.nn.Linear(2, 2)
    assert _error(model, {**model.state_dict(), "x": torch.zeros(1)}).endswith(
        'Unexpected key(s) in state_dict: "x". '
    )
    wide = {"weight": torch.zeros(3, 2), "bias": torch.zeros(2)}
    assert "size mismatch for weight: copying a param with shape torch.Size([3, 2])" in _error(model, wide)
