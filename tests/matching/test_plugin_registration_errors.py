"""What a plug-in author gets wrong, refused at registration or reported as one line naming the matcher.

Bugs (a researcher writing a plug-in matcher): ``patchword eval RUN`` of a run whose matcher is not
installed was a ``KeyError`` traceback (exit 1; ``--suite compositional`` and ``--ensemble`` too) where
every other verb said ``model.matcher: unknown matcher ...`` (exit 2); ``losses=("infonce",)`` without a
learned temperature registered and crashed at the first training step (``Tensor * None``); a typo in
``engine="module:Class"`` was a bare ``ModuleNotFoundError`` at the first evaluation, naming neither the
matcher nor its registration; ``build_matcher`` was annotated ``-> nn.Module``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from conftest import TINY_MODEL_32, one_error_line
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.eval import engine
from patchword.matching import (
    Matcher,
    MatcherOutput,
    build_matcher,
    list_matchers,
    register_matcher,
    registry,
)
from patchword.matching.ops import l2norm, masked_mean

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass
class _MeanConfig:
    embed_dim: int = 32
    num_patches: int = 16
    has_cls: bool = True


class _Mean(Matcher):
    """Cosine of the mean patch and the mean word (after a learned map of the words)."""

    consumes_dense = False

    def __init__(self, config: _MeanConfig) -> None:
        super().__init__()
        self.config, self.embed_dim, self.has_cls = config, config.embed_dim, config.has_cls
        self.word_map = nn.Linear(config.embed_dim, config.embed_dim)

    def forward(self, img_tokens, cap_tokens, cap_lens, dense_tokens=None, dense_lens=None) -> MatcherOutput:
        lens = self.validate_text(cap_tokens, cap_lens)
        img = l2norm(img_tokens[:, int(self.has_cls) :].mean(1))
        return MatcherOutput(sims=img @ l2norm(masked_mean(self.word_map(cap_tokens), lens)).T)


# the same class under two names: runs of "mean-kept" stay evaluable, "mean-gone" is uninstalled below
register_matcher("mean-kept", _MeanConfig)(_Mean)
register_matcher("mean-gone", _MeanConfig)(_Mean)

TINY = [
    "data.num_train=16",
    "data.num_dev=8",
    "data.num_test=8",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.max_steps=1",
    "train.num_threads=1",
]


@pytest.fixture(scope="module")
def plugin_runs(tmp_path_factory) -> dict[str, str]:
    """One-step runs of ``mean-kept`` and ``mean-gone``: their directories by matcher name."""
    runs = tmp_path_factory.mktemp("runs")
    for name in ("mean-kept", "mean-gone"):
        argv = ["train", *TINY, f"model.matcher={name}", f"output_dir={runs}", f"name={name}"]
        assert main([*argv, f"data.cache_dir={runs / 'cache'}"]) == 0
    return {name: str(runs / name) for name in ("mean-kept", "mean-gone")}


def _uninstalled(monkeypatch, name: str) -> None:
    """The plug-in ``name`` as in a process where its distribution is not installed."""
    monkeypatch.delitem(registry._REGISTRY, name)
    monkeypatch.setattr(registry, "_plugins_loaded", True)  # no entry point brings it back


@pytest.mark.parametrize(
    "extra",
    [[], ["--suite", "compositional"], ["--ensemble", "{gone}"], ["{kept}", "--ensemble", "{gone}"]],
    ids=["eval", "suite", "ensemble", "ensemble-member"],
)
def test_evaluating_a_run_whose_matcher_is_not_installed_is_one_line_naming_model_matcher(
    plugin_runs, tmp_path, monkeypatch, capsys, extra
):
    _uninstalled(monkeypatch, "mean-gone")
    runs = {"gone": plugin_runs["mean-gone"], "kept": plugin_runs["mean-kept"]}
    argv = [a.format(**runs) for a in extra]
    if not argv or argv[0] != runs["kept"]:
        argv = [runs["gone"], *argv]
    assert main(["eval", *argv, "--out", str(tmp_path / "e.json")]) == 2
    line = one_error_line(capsys.readouterr().err)
    # an ensemble's member is named: the key alone does not say which of the runs it was
    member = f"in ensemble member {runs['gone']}: " if argv[0] == runs["kept"] else ""
    assert line.startswith(f"error: model.matcher: {member}unknown matcher 'mean-gone'; registered: "), line
    assert "mean-kept" in line and "model.matcher: model.matcher" not in line
    assert not (tmp_path / "e.json").exists()


def test_an_unknown_matcher_is_a_config_error_on_model_matcher_and_still_a_key_error():
    with pytest.raises(KeyError) as caught:
        build_matcher("no-such-matcher")
    err = caught.value
    assert isinstance(err, ConfigError) and err.key == "model.matcher"
    assert str(err).startswith("model.matcher: unknown matcher 'no-such-matcher'; registered: clip, filip")
    # what callers wrapping the KeyError read: the message without the key (no "model.matcher" twice)
    assert err.args[0].startswith("unknown matcher 'no-such-matcher'")
    with pytest.raises(ConfigError, match=r"^model\.matcher: unknown matcher 'no-such-matcher'"):
        engine.core.declared_precisions("no-such-matcher")


def test_infonce_without_a_learned_temperature_is_refused_at_registration():
    with pytest.raises(TypeError, match=r"^matcher 'mean-nce': losses include 'infonce'.*_Mean does not"):
        register_matcher("mean-nce", _MeanConfig, losses=("hinge", "infonce"))(_Mean)
    assert "mean-nce" not in list_matchers()

    class _Tempered(_Mean):
        def __init__(self, config: _MeanConfig) -> None:
            super().__init__(config)
            self.logit_scale = nn.Parameter(torch.tensor(2.0))

        def temperature_scale(self) -> torch.Tensor:
            return self.logit_scale.exp()

    try:
        register_matcher("mean-tempered", _MeanConfig, losses=("infonce",))(_Tempered)
        assert build_matcher("mean-tempered").temperature_scale().item() == pytest.approx(math.exp(2.0))
    finally:
        registry._REGISTRY.pop("mean-tempered", None)
    # every built-in that declares infonce has its temperature (they all registered at import)
    infonce = [name for name in list_matchers() if "infonce" in registry.matcher_spec(name).losses]
    assert {"clip", "filip"} <= set(infonce)
    for name in infonce:
        assert registry.matcher_spec(name).cls.temperature_scale is not Matcher.temperature_scale, name


@pytest.mark.parametrize("string", ["mine_engine", "mine engine:Fast", "mod:", ":Fast", "a..b:Fast", 3])
def test_an_engine_that_is_not_module_colon_class_is_refused_at_registration(string):
    with pytest.raises(ValueError, match=r"^matcher 'mean-bad-engine': engine must be 'module:Class'"):
        register_matcher("mean-bad-engine", _MeanConfig, engine=string)(_Mean)
    assert "mean-bad-engine" not in list_matchers()


@pytest.mark.parametrize(
    ("string", "why"),
    [
        (
            "mean_engine_typo:Fast",
            r" cannot be imported: ModuleNotFoundError: No module named 'mean_engine_typo'",
        ),
        ("patchword.errors:Fast", r": module 'patchword.errors' has no 'Fast'"),
    ],
    ids=["module", "class"],
)
def test_an_engine_that_does_not_import_names_the_matcher_and_the_engine_string(
    string, why, plugin_runs, tmp_path, monkeypatch, capsys
):
    spec = registry.matcher_spec("mean-kept")
    monkeypatch.setitem(registry._REGISTRY, "mean-kept", dataclasses.replace(spec, engine=string))
    said = rf"^matcher 'mean-kept': its engine '{string}' \(register_matcher\(\.\.\., engine=\)\)" + why
    with pytest.raises(ImportError, match=said):
        engine.core.declared_precisions("mean-kept")  # a run's config checked before evaluating it
    with pytest.raises(ImportError, match=said):
        engine.engine_for(build_matcher("mean-kept"))  # the engine that scores a matcher
    # the command line: one line, exit 2 (was a ModuleNotFoundError traceback)
    assert main(["eval", plugin_runs["mean-kept"], "--out", str(tmp_path / "e.json")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "'mean-kept'" in line and string in line


def test_build_matcher_is_annotated_to_return_a_matcher():
    assert typing.get_type_hints(build_matcher)["return"] is Matcher
