"""A matcher's options are checked by the library, not only by ``patchword train``: ``create_model``,
``load_run`` and ``patchword eval`` refuse an option that would fail, do nothing or override the encoders'
token geometry, as one ``ConfigError`` naming the key; and what a run records of a plug-in's reported
options is what its matcher used, a default included.

Old code: ``create_model(options={"sparse_ratio": 0.9})`` built SEPS at 0.5, ``matcher="vse", seps={...}``
ignored the section, ``options={"bogus": 1}`` was a raw TypeError, ``model.options.has_cls=false`` trained a
matcher reading the CLS token as a patch; summary.json recorded ``"variant": null`` for a plug-in left at its
default ``variant='plain'``, ``patchword export`` failed with KeyError 'variant', and the model card said
``mine`` (``seps-tiny-32``) of a run whose matcher replaced SEPS."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pytest
import yaml
from torch import nn

from conftest import TINY_MODEL_32, TINY_RUN_32, one_error_line
from patchword import create_model
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.factory import get_model_config
from patchword.matching import Matcher, MatcherOutput, register_matcher
from patchword.matching.ops import l2norm, masked_mean
from patchword.model import build_model

pytestmark = pytest.mark.usefixtures("one_thread")

NAMED = "seps-tiny-32"


@dataclass
class OptsConfig:
    embed_dim: int = 32
    num_patches: int = 16
    has_cls: bool = True
    variant: Literal["plain", "proj"] = "plain"  # reported: every metrics file records it
    temperature: float = 1.0
    sizes: tuple[int, ...] = (1, 2)  # a YAML file would give a tuple back as a list


@register_matcher("opts-mean", OptsConfig, losses=("hinge",), report=("variant",))
class OptsMatcher(Matcher):
    """Cosine of the mean patch and the mean (optionally projected) word."""

    consumes_dense = False

    def __init__(self, config: OptsConfig) -> None:
        super().__init__()
        self.config, self.embed_dim, self.has_cls = config, config.embed_dim, config.has_cls
        self.proj = nn.Linear(config.embed_dim, config.embed_dim)

    def forward(self, img_tokens, cap_tokens, cap_lens, dense_tokens=None, dense_lens=None) -> MatcherOutput:
        self.validate_image_tokens(img_tokens)
        lens = self.validate_text(cap_tokens, cap_lens)
        cap_tokens = cap_tokens.to(img_tokens.dtype)  # scored in the image tokens' dtype (the contract)
        img = l2norm(img_tokens[:, int(self.has_cls) :].mean(1))
        txt = cap_tokens if self.config.variant == "plain" else self.proj(cap_tokens)
        return MatcherOutput(sims=img @ l2norm(masked_mean(txt, lens)).T / self.config.temperature)


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        # SEPS reads model.seps: the option was dropped and SEPS built at sparse_ratio=0.5
        ({"options": {"sparse_ratio": 0.9}}, "model.options.sparse_ratio", "it reads model.seps"),
        # VSE reads model.vse: the SEPS section was ignored
        ({"matcher": "vse", "seps": {"sparse_ratio": 0.6}}, "model.seps.sparse_ratio", "it reads model.vse"),
        # a raw TypeError from the config class
        ({"matcher": "opts-mean", "options": {"bogus": 1}}, "model.options.bogus", "valid: sizes, "),
        # the encoders' geometry: has_cls=False read the CLS token as a patch, embed_dim=64 failed at the
        # first step naming no key
        ({"matcher": "opts-mean", "options": {"has_cls": False}}, "model.options.has_cls", "encoders"),
        ({"matcher": "opts-mean", "options": {"embed_dim": 64}}, "model.options.embed_dim", "encoders"),
        ({"matcher": "opts-mean", "options": {"num_patches": 4}}, "model.options.num_patches", "encoders"),
        # a value outside its Literal, named before any encoder is built
        ({"matcher": "opts-mean", "options": {"variant": "x"}}, "model.options", "variant must be one of"),
    ],
)
def test_create_model_refuses_an_option_that_would_fail_or_do_nothing(overrides, key, says):
    with pytest.raises(ConfigError) as caught:
        create_model(NAMED, pretrained=False, **overrides)
    assert caught.value.key == key and says in caught.value.detail


def test_build_model_refuses_the_options_too_but_not_a_section_of_another_matcher():
    """build_model (load_run, eval) checks the options of the matcher it builds; a recipe's rebuild under
    another matcher (global_recall: vse on the demo's SEPS config) keeps the run's own section."""
    bogus = get_model_config(NAMED, matcher="opts-mean", options={"bogus": 1})
    with pytest.raises(ConfigError, match=r"^model\.options\.bogus: is not an option of opts-mean"):
        build_model(bogus, vocab_size=50)
    seps_set = get_model_config(NAMED, seps={"variant": "paper"})
    vse = build_model(get_model_config(NAMED, matcher="vse", seps={"variant": "paper"}), vocab_size=50)
    assert type(vse.matcher).__name__ == "VSEMatcher" and seps_set.seps.variant == "paper"


def test_the_matchers_geometry_is_the_encoders():
    model = create_model(NAMED, pretrained=False, matcher="opts-mean", options={"variant": "proj"})
    config = model.matcher.config
    assert (config.embed_dim, config.num_patches, config.has_cls) == (32, 16, True)
    assert config.variant == "proj"


def test_the_resolved_options_hold_every_default_and_the_config_yaml_keeps_plain_values():
    from patchword.model import reported_options, resolve_plugin_options, resolved_matcher_options

    cfg = get_model_config(NAMED, matcher="opts-mean", options={"temperature": 2.0})
    assert resolved_matcher_options(cfg) == {"variant": "plain", "temperature": 2.0, "sizes": (1, 2)}
    assert reported_options(cfg) == {"variant": "plain"}  # not None: the default is what the matcher used
    resolve_plugin_options(cfg)
    # the tuple stays unwritten (a YAML file would give it back as a list): its default still applies
    assert cfg.options == {"variant": "plain", "temperature": 2.0}
    seps = get_model_config(NAMED)
    resolve_plugin_options(seps)  # a typed section holds its fields already
    assert seps.options == {}
    # an old run's options: {} builds the defaults
    old = get_model_config(NAMED, matcher="opts-mean")
    assert old.options == {} and build_model(old, vocab_size=50).matcher.config.variant == "plain"


RUN = [*TINY_RUN_32, "train.max_steps=2", "model.matcher=opts-mean"]


@pytest.fixture(scope="module")
def opts_run(tmp_path_factory):
    """A two-step run of the plug-in, its options left at their defaults."""
    runs = tmp_path_factory.mktemp("runs")
    assert main(["train", *RUN, f"output_dir={runs}", "name=opts", f"data.cache_dir={runs / 'c'}"]) == 0
    return runs / "opts"


def test_a_default_option_is_recorded_as_its_value_and_the_card_names_the_replaced_matcher(
    opts_run, tmp_path
):
    summary = json.loads((opts_run / "summary.json").read_text())
    assert summary["matcher"] == "opts-mean" and summary["variant"] == "plain"
    assert main(["eval", str(opts_run), "--out", str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["variant"] == "plain"
    assert main(["export", str(opts_run), str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    assert "A patchword model: `opts-mean` matcher on the `seps-tiny-32` encoders: image encoder" in card
    assert "* matcher: `opts-mean`, variant `plain`" in card


def test_a_new_runs_config_yaml_holds_every_option_of_its_plugin_matcher(opts_run):
    """A plug-in's ``model.options`` saved as a typed section is: every option with the value the matcher
    was built with, the defaults included (the run left them all unset). Old code saved ``options: {}``:
    the run's values were whatever the plug-in's defaults were when it was next loaded. ``sizes`` (a
    tuple, which a YAML file would give back as a list) stays unwritten."""
    saved = yaml.safe_load((opts_run / "config.yaml").read_text())["model"]["options"]
    assert saved == {"variant": "plain", "temperature": 1.0}


def test_a_new_plugin_run_resumes_with_its_completed_options(tmp_path, capsys):
    """The completed options are the run's own: a resume (which refuses a config.yaml that differs from
    the one last.pt recorded) takes them, and resolves nothing of its own."""
    runs = tmp_path / "runs"
    args = [
        *RUN,
        f"output_dir={runs}",
        "name=new",
        f"data.cache_dir={tmp_path / 'c'}",
        "model.options.temperature=2",
    ]
    assert main(["train", *args]) == 0
    assert main(["train", "--resume", str(runs / "new"), "train.max_steps=3"]) == 0, capsys.readouterr().err
    summary = json.loads((runs / "new" / "summary.json").read_text())
    assert (summary["steps"], summary["variant"]) == (3, "plain")
    saved = yaml.safe_load((runs / "new" / "config.yaml").read_text())["model"]["options"]
    assert saved == {"variant": "plain", "temperature": 2.0}


def test_a_run_saved_with_empty_plugin_options_still_resumes_and_evaluates(tmp_path, monkeypatch, capsys):
    """A run trained before its config.yaml held every plug-in option (``options: {}``) resumes (the
    resume leaves its config as it was saved) and evaluates with the plug-in's defaults."""
    runs = tmp_path / "runs"
    with monkeypatch.context() as old_code:  # what a run written before the options were completed saved
        old_code.setattr("patchword.train.validate.resolve_plugin_options", lambda model: None)
        assert (
            main(["train", *RUN, f"output_dir={runs}", "name=old", f"data.cache_dir={tmp_path / 'c'}"]) == 0
        )
    run = runs / "old"
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["options"] == {}
    assert main(["train", "--resume", str(run), "train.max_steps=3"]) == 0, capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["variant"]) == (3, "plain")
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["options"] == {}  # never rewritten
    assert main(["eval", str(run), "--out", str(tmp_path / "e.json")]) == 0, capsys.readouterr().err
    evaluated = json.loads((tmp_path / "e.json").read_text())
    assert evaluated["variant"] == "plain" and evaluated["rsum"] == pytest.approx(summary["rsum"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.options.bogus=1", "model.options.bogus"),  # a TypeError traceback
        ("model.options.has_cls=false", "model.options.has_cls"),  # the CLS token scored as a patch
    ],
)
def test_eval_refuses_a_plugin_option_that_would_fail_or_override_the_geometry(
    opts_run, tmp_path, capsys, override, key
):
    out = tmp_path / "e.json"
    assert main(["eval", str(opts_run), override, "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}: ")
    assert not out.exists()


def test_eval_refuses_an_option_the_runs_matcher_does_not_read(trained_tiny_run, tmp_path, capsys):
    """A SEPS run evaluated with model.options.sparse_ratio=0.9 ran, and its record named the override as
    applied while SEPS read model.seps."""
    out = tmp_path / "e.json"
    assert main(["eval", str(trained_tiny_run), "model.options.sparse_ratio=0.9", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line
        == "error: model.options.sparse_ratio: has no effect with model.matcher=seps (it reads model.seps)"
    )
    assert not out.exists()


def test_train_refuses_the_geometry_in_the_options_before_anything_is_written(tmp_path, capsys):
    args = [*RUN, *TINY_MODEL_32, f"output_dir={tmp_path}", "name=geo", "model.options.has_cls=false"]
    assert main(["train", *args]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: model.options.has_cls: ")
    assert not (tmp_path / "geo").exists()
