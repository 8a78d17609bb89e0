"""Matcher options a registration declares training-only (``register_matcher(..., training_only=)``): each
leaves an eval-mode forward's scores unchanged (what makes refusing it at ``patchword eval`` right), and
:func:`patchword.model.training_only_keys` names them under their config keys."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from matcher_support import BUILTIN_MATCHERS
from patchword.matching import build_matcher, matcher_config_class
from patchword.matching.registry import _REGISTRY, MatcherSpec, matcher_spec, register_matcher
from patchword.matching.vse import VSEConfig
from patchword.model import training_only_keys

DIM, N_PATCHES, B_V, B_T, L = 16, 16, 3, 4, 6

# another value of every declared option (a declaration without one here fails the test below)
OTHER = {
    "detach_selection": True,
    "gumbel": True,
    "gumbel_tau": 0.3,
    "ratio_mode": "per_branch",
    "alpha": 3.0,
    "update_threshold": False,
    "min_samples": 5,
    "blend": 0.2,
    "reset_below_min": False,
    "init_threshold": 0.3,
    "init_threshold_safe": 0.3,
}
DECLARED = [(name, option) for name in BUILTIN_MATCHERS for option in matcher_spec(name).training_only]


def test_seps_and_naaf_declare_their_training_only_options_under_their_config_keys():
    assert set(matcher_spec("seps").training_only) == {
        "detach_selection",
        "gumbel",
        "gumbel_tau",
        "ratio_mode",
    }
    assert matcher_spec("laps").training_only == matcher_spec("seps").training_only
    assert set(matcher_spec("naaf").training_only) == {
        "alpha",
        "update_threshold",
        "min_samples",
        "blend",
        "reset_below_min",
        "init_threshold",
        "init_threshold_safe",
    }
    keys = training_only_keys()
    why = "it only cuts the gradients of patch selection, as the official no_grad does"
    assert keys["model.seps.detach_selection"] == why
    assert keys["model.detach_selection"] == why  # ModelConfig.ALIASES loads it into model.seps
    assert "model.naaf.min_samples" in keys
    assert not [k for k in keys if k.startswith(("model.vse.", "model.scan.", "model.tgdt.", "model.filip."))]
    assert {name for name, _ in DECLARED} == {"seps", "laps", "naaf"}


def _inputs(name: str, matcher) -> tuple:
    torch.manual_seed(1)
    fields = {f.name for f in dataclasses.fields(matcher_config_class(name))}
    tokens = 1 + N_PATCHES if "has_cls" in fields else 5  # patches and CLS, or regions
    img = torch.randn(B_V, tokens, DIM)
    cap, cap_lens = torch.randn(B_T, L, DIM), torch.tensor([L, 4, 3, L])
    if not matcher.consumes_dense:
        return img, cap, cap_lens, None, None
    return img, cap, cap_lens, torch.randn(B_V, L, DIM), torch.tensor([L, 5, 2])


@pytest.mark.parametrize(("name", "option"), DECLARED, ids=[f"{n}.{o}" for n, o in DECLARED])
def test_a_training_only_option_leaves_the_eval_scores_unchanged(name, option):
    fields = {f.name for f in dataclasses.fields(matcher_config_class(name))}
    geometry = {k: v for k, v in dict(embed_dim=DIM, num_patches=N_PATCHES).items() if k in fields}
    torch.manual_seed(0)
    base = build_matcher(name, **geometry).eval()
    other = build_matcher(name, **geometry, **{option: OTHER[option]}).eval()
    assert getattr(other.config, option) == OTHER[option] != getattr(base.config, option)
    other.load_state_dict(base.state_dict())  # a checkpoint's weights (and NAAF's threshold buffers)
    with torch.no_grad():
        expected = base(*_inputs(name, base)).sims
        assert torch.equal(other(*_inputs(name, other)).sims, expected)


def test_a_registration_naming_an_unknown_training_only_field_is_refused():
    with pytest.raises(ValueError, match=r"training_only names unknown fields \['frob'\]"):
        register_matcher("frob-matcher", VSEConfig, training_only={"frob": "a typo"})
    assert "frob-matcher" not in _REGISTRY


def test_a_plugin_matcher_without_a_typed_section_declares_under_model_options(monkeypatch):
    spec = MatcherSpec(
        "vse-plugin",
        matcher_spec("vse").cls,
        VSEConfig,
        {},
        "vse-plugin",
        training_only={"init_temperature": "it starts the learned temperature"},
    )
    monkeypatch.setitem(_REGISTRY, "vse-plugin", spec)
    assert training_only_keys()["model.options.init_temperature"] == "it starts the learned temperature"
