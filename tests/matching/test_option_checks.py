"""SEPS / LAPS options are type- and range-checked by name before anything is built (``embed_dim=32.5``
failed deep in torch, ``gumbel_tau=0`` built a paper variant whose every gradient was NaN, ``has_cls="yes"``
built a matcher), and a matcher plug-in must implement the Matcher contract to register."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from patchword.matching import Matcher, MatcherOutput, build_matcher, list_matchers, register_matcher
from patchword.matching.registry import _REGISTRY
from patchword.matching.seps import SEPSConfig


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("gumbel_tau", 0, "gumbel_tau must be a finite number > 0"),
        ("gumbel_tau", -1.0, "gumbel_tau must be a finite number > 0"),
        ("gumbel_tau", math.nan, "gumbel_tau must be a finite number"),
        ("gumbel_tau", math.inf, "gumbel_tau must be a finite number"),
        ("hrpa_topk", -1, "hrpa_topk must be >= 0"),
        ("embed_dim", 0, "embed_dim must be a positive int"),
        ("embed_dim", -8, "embed_dim must be a positive int"),
        ("num_patches", 0, "num_patches must be a positive int"),
        ("caption_chunk", -1, "caption_chunk must be >= 0"),
        ("beta", math.nan, "beta must be a finite number"),
        ("leaky_slope", math.inf, "leaky_slope must be a finite number"),
    ],
)
def test_an_option_out_of_range_is_a_value_error_naming_it(option, value, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        SEPSConfig(**{option: value}).check()
    with pytest.raises(ValueError, match=f"^{message}"):
        build_matcher("seps", **{option: value})


@pytest.mark.parametrize(
    ("option", "value", "want"),
    [
        ("embed_dim", 32.5, "an int"),
        ("embed_dim", True, "an int"),
        ("num_patches", "16", "an int"),
        ("hrpa_topk", 2.0, "an int"),
        ("caption_chunk", None, "an int"),
        ("sparse_ratio", "0.5", "a number"),
        ("gumbel_tau", None, "a number"),
        ("has_cls", "yes", "a bool"),
        ("has_cls", 1, "a bool"),
        ("use_dense", None, "a bool"),
        ("detach_selection", "no", "a bool"),
        ("gumbel", 0, "a bool"),
        ("joint_score", 1, "a bool"),
    ],
)
def test_an_option_of_the_wrong_type_is_a_type_error_naming_it(option, value, want):
    with pytest.raises(TypeError, match=f"^{option} must be {want}, got"):
        build_matcher("seps", **{option: value})


def test_valid_options_still_build_and_none_switches_take_the_variant():
    m = build_matcher(
        "seps", embed_dim=32, num_patches=16, has_cls=False, variant="paper", gumbel_tau=0.5, hrpa_topk=0
    )
    assert m.config.gumbel is True and m.config.hrpa_topk == 0 and m.config.gumbel_tau == 0.5
    assert (
        build_matcher("laps", embed_dim=32, num_patches=16, sparse_ratio=1, beta=0).config.sparse_ratio == 1
    )


@dataclass
class _PlainConfig:
    embed_dim: int = 8


def test_registering_a_class_that_is_not_a_matcher_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"^matcher 'plain-module': '.*Plain' is not a subclass of .*Matcher"):

        @register_matcher("plain-module", _PlainConfig)
        class Plain(nn.Module):
            def forward(self, img, cap, lens, dense=None, dense_lens=None):
                return img.mean(1) @ cap.mean(1).T

    assert "plain-module" not in list_matchers()


def test_a_matcher_subclass_still_registers():
    try:

        @register_matcher("subclass-check", _PlainConfig)
        class Dot(Matcher):
            consumes_dense = False

            def __init__(self, config):
                super().__init__()
                self.embed_dim = config.embed_dim

            def forward(self, img, cap, lens, dense=None, dense_lens=None):
                return MatcherOutput(sims=img.mean(1) @ cap.mean(1).T)

        m = build_matcher("subclass-check")
        assert isinstance(m, Dot)
        assert m(torch.ones(2, 3, 8), torch.ones(4, 5, 8), [5, 5, 5, 5]).sims.shape == (2, 4)
    finally:
        _REGISTRY.pop("subclass-check", None)
