"""A matcher's settings the run would not apply, refused before anything is written: a learned temperature
under the hinge (``clip`` is ``vse`` with one, so it trains with InfoNCE only; FILIP's and VSE's
temperature options are inert under the hinge), and a region matcher (SCAN, NAAF) on an image encoder
that puts a CLS token first, named by the setting the user gives rather than the matcher's ``has_cls``."""

from __future__ import annotations

import pytest

from conftest import TINY_REGIONS, TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.runs.config import RunConfig
from patchword.train.validate import check_config


def _refused(tmp_path, capsys, overrides: list[str]) -> str:
    """The one error line of ``patchword train`` with ``overrides``; nothing was written."""
    runs = tmp_path / "runs"
    assert main(["train", *overrides, "train.max_steps=1", f"output_dir={runs}", "name=r"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert not runs.exists(), sorted(runs.rglob("*"))
    return line


def test_clip_under_the_default_hinge_is_refused_naming_the_loss(tmp_path, capsys):
    """Old code: trained as vse (same losses, same rSum), logit_scale never moved."""
    overrides = [*TINY_RUN_32, "model.matcher=clip", "model.vse.init_temperature=0.5"]
    line = _refused(tmp_path, capsys, [*overrides, "model.vse.max_logit_scale=3"])
    assert line == (
        "error: train.loss: model.matcher=clip trains with infonce, not hinge (it has a learned "
        "temperature, which only infonce reads: set train.loss=infonce)"
    )


@pytest.mark.parametrize(
    ("matcher", "key", "value", "why"),
    [
        ("filip", "model.filip.init_temperature", "0.5", "the learned temperature scales only infonce's"),
        ("filip", "model.filip.max_logit_scale", "3", "the learned temperature scales only infonce's"),
        ("vse", "model.vse.max_logit_scale", "3", "model.matcher=vse learns no temperature"),
        ("vse", "model.vse.learn_temperature", "true", "model.matcher=vse learns no temperature"),
    ],
)
def test_a_temperature_option_under_the_hinge_is_refused_naming_it(
    tmp_path, capsys, matcher, key, value, why
):
    line = _refused(tmp_path, capsys, [*TINY_RUN_32, f"model.matcher={matcher}", f"{key}={value}"])
    assert line.startswith(f"error: {key}: has no effect with train.loss=hinge: {why}"), line


def test_what_applies_its_temperature_or_needs_none_still_passes():
    """FILIP under the hinge at its default temperature (the comparison sweep's filip-tiny), CLIP and FILIP
    under InfoNCE with their temperature set: all checked and accepted."""
    for extra in (
        ["model.matcher=filip"],
        ["model.matcher=clip", "train.loss=infonce", "model.vse.init_temperature=0.5"],
        ["model.matcher=filip", "train.loss=infonce", "model.filip.max_logit_scale=3"],
        ["model.matcher=vse"],
    ):
        check_config(apply_overrides(RunConfig(), [*TINY_RUN_32, *extra]))


def test_a_resumed_run_is_not_checked_for_temperature_settings():
    """As every setting without effect: a resumed run keeps what it trained with."""
    cfg = apply_overrides(
        RunConfig(), [*TINY_RUN_32, "model.matcher=filip", "model.filip.init_temperature=0.5"]
    )
    check_config(cfg, resuming=True)
    with pytest.raises(ConfigError, match="model.filip.init_temperature"):
        check_config(cfg)


@pytest.mark.parametrize("matcher", ["scan", "naaf"])
def test_a_region_matcher_on_the_tiny_vit_is_refused_naming_the_image_encoder(tmp_path, capsys, matcher):
    """Old code: read the data, then said ``model.scan: matcher 'scan' takes tokens without a CLS token,
    but has_cls=True`` (a value the user never sets)."""
    line = _refused(tmp_path, capsys, [*TINY_RUN_32, f"model.matcher={matcher}"])
    assert line == (
        f"error: model.image_encoder: model.matcher={matcher} takes image tokens without a CLS token (region "
        "features), but model.image_encoder=tiny puts a CLS token first: use model.image_encoder=precomp "
        "(data.dataset=precomp or synthetic_regions)"
    )


def test_a_region_matcher_behind_a_global_region_token_is_refused_naming_it(tmp_path, capsys):
    overrides = [*TINY_REGIONS, "model.matcher=scan", "model.precomp.context.global_token=true"]
    line = _refused(tmp_path, capsys, overrides)
    assert line == (
        "error: model.precomp.context.global_token: model.matcher=scan takes image tokens without a CLS "
        "token (region features), but a global token would come first: set it false"
    )
    check_config(apply_overrides(RunConfig(), [*TINY_REGIONS, "model.matcher=scan"]))  # regions alone: fine
