"""A matcher family's registered preset (``laps``: no dense text; ``clip``: a learned temperature) holds on
both construction paths of ``build_matcher``: a config object and keywords build the same matcher."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from matcher_support import BUILTIN_MATCHERS
from patchword.matching import build_matcher, matcher_config_class
from patchword.matching.registry import _REGISTRY, MatcherSpec, matcher_preset, matcher_spec
from patchword.matching.seps import SEPSConfig
from patchword.matching.vse import VSEConfig

DIM, N_PATCHES = 32, 16


def _geometry(name: str) -> dict:
    """The token geometry ``name``'s config has fields for (region matchers: no CLS, no patch count)."""
    fields = {f.name for f in dataclasses.fields(matcher_config_class(name))}
    offered = dict(embed_dim=DIM, num_patches=N_PATCHES, has_cls=True)
    return {k: v for k, v in offered.items() if k in fields}


def _same_state(a, b) -> bool:
    """Equal parameters and buffers (NAAF's threshold statistics are NaN until estimated)."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].shape == sb[k].shape and torch.allclose(sa[k], sb[k], rtol=0, atol=0, equal_nan=True)
        for k in sa
    )


@pytest.mark.parametrize("name", BUILTIN_MATCHERS)
def test_a_config_object_and_keywords_build_the_same_matcher_of_the_family(name):
    """Old code: ``{**preset, **config}`` let the config's default values replace the preset, so
    ``build_matcher("laps", config=SEPSConfig(...))`` built SEPS and ``clip`` lost its temperature."""
    geometry = _geometry(name)
    torch.manual_seed(0)
    by_keywords = build_matcher(name, **geometry)
    torch.manual_seed(0)
    by_config = build_matcher(name, config=matcher_config_class(name)(**geometry))
    torch.manual_seed(0)
    by_dict = build_matcher(name, config=dict(geometry))
    for built in (by_config, by_dict):
        assert type(built) is type(by_keywords)
        assert built.config == by_keywords.config
        assert built.consumes_dense == by_keywords.consumes_dense
        assert _same_state(built, by_keywords)
    for key, value in matcher_preset(name).items():
        assert getattr(by_config.config, key) == value, key


def test_laps_from_a_seps_config_reads_no_dense_text_and_clip_keeps_its_temperature():
    laps = build_matcher("laps", config=SEPSConfig(embed_dim=DIM, num_patches=N_PATCHES))
    assert laps.consumes_dense is False and laps.config.use_dense is False
    clip = build_matcher("clip", config=VSEConfig(embed_dim=DIM))
    assert clip.temperature_scale().item() == pytest.approx(1 / 0.07)  # CLIP's initial logit scale
    # a keyword is the caller's explicit choice and wins over the preset, on a config or not
    seps_like = build_matcher("laps", config=SEPSConfig(embed_dim=DIM, num_patches=N_PATCHES), use_dense=True)
    assert seps_like.consumes_dense is True
    assert build_matcher("clip", embed_dim=DIM, learn_temperature=False).temperature_scale() is None


def test_a_config_that_sets_a_preset_key_to_another_value_is_refused_naming_key_and_family(monkeypatch):
    """A value differing from both the preset and the config default was set for another family: refused
    (the built-in presets flip a boolean default, so a test family with a three-valued preset shows it)."""
    base = matcher_spec("vse")
    spec = MatcherSpec("vse-mean", base.cls, VSEConfig, {"init_temperature": 0.05}, "vse")
    monkeypatch.setitem(_REGISTRY, "vse-mean", spec)
    built = build_matcher("vse-mean", config=VSEConfig(embed_dim=DIM, learn_temperature=True))
    assert math.isclose(built.temperature_scale().item(), 1 / 0.05, rel_tol=1e-6)  # default -> preset
    clash = VSEConfig(embed_dim=DIM, init_temperature=0.2)
    with pytest.raises(ValueError, match=r"'vse-mean' fixes init_temperature=0\.05.*init_temperature=0\.2"):
        build_matcher("vse-mean", config=clash)
    with pytest.raises(ValueError, match="init_temperature"):
        build_matcher("vse-mean", config=dataclasses.asdict(clash))
    by_keyword = build_matcher("vse-mean", config=clash, init_temperature=0.2, learn_temperature=True)
    assert math.isclose(by_keyword.temperature_scale().item(), 1 / 0.2, rel_tol=1e-6)
