"""Review of training settings (findings 4, 5, 6): a new run's setting that cannot take effect is one error
line naming the key and why, before anything is written (a value at its default is never refused, and no
shipped recipe is refused); milestones and epoch counts are in range; a bad ``data.cache_dir`` is named
before the scenes are generated, on a resume too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.runs.config import RunConfig, list_recipes, load_run_config
from patchword.train.validate import check_config

pytestmark = pytest.mark.usefixtures("one_thread")

CLIP = ["model.matcher=clip", "train.loss=infonce"]


def _config(*overrides: str) -> RunConfig:
    return apply_overrides(RunConfig(), [*TINY_RUN_32, *overrides])


@pytest.mark.parametrize(
    "overrides, key, why",
    [
        ([*CLIP, "train.margin=0.3"], "train.margin", "with train.loss=infonce"),
        ([*CLIP, "train.hardest_after_epochs=0"], "train.hardest_after_epochs", "with train.loss=infonce"),
        (["train.backbone_lr_mult=0.5"], "train.backbone_lr_mult", "without a pretrained encoder"),
        (["train.wandb_project=mine"], "train.wandb_project", "without wandb in train.report_to"),
        (["train.wandb_mode=online"], "train.wandb_mode", "without wandb in train.report_to"),
        (["train.lr_milestones=[-1]"], "train.lr_milestones", "must be >= 0"),
        (["train.lr_milestone_steps=[0]"], "train.lr_milestone_steps", "must be >= 1"),
        (["train.lr_milestone_steps=[-3]"], "train.lr_milestone_steps", "must be >= 1"),
        (["train.hardest_after_epochs=-1"], "train.hardest_after_epochs", "must be >= 0"),
        (["train.align_warmup_epochs=-1"], "train.align_warmup_epochs", "must be >= 0"),
        (["train.report_to=[tensorboard,tensorboard]"], "train.report_to", "names 'tensorboard' twice"),
        (
            ["model.seps.dense_pairing=caption", "data.dense=false"],
            "model.seps.dense_pairing",
            "caption has no effect with data.dense=false",
        ),
        (
            ["model.matcher=laps", "model.seps.dense_pairing=caption"],
            "model.seps.dense_pairing",
            "reads no dense",
        ),
    ],
)
def test_a_setting_without_effect_or_out_of_range_is_refused(overrides, key, why):
    """Old code accepted each and trained as if it were not there."""
    with pytest.raises(ConfigError) as refused:
        check_config(_config(*overrides))
    assert refused.value.key == key and why in refused.value.detail


@pytest.mark.parametrize(
    "overrides",
    [
        [*CLIP, "train.margin=0.2", "train.hardest_after_epochs=1"],  # the defaults, spelled out
        ["train.margin=0.5", "train.hardest_after_epochs=0"],  # the hinge reads them
        ["train.lr_milestones=[0]", "train.lr_milestone_steps=[1]", "train.align_warmup_epochs=0"],
        ["model.seps.dense_pairing=caption"],
        ["data.dense=false"],
    ],
)
def test_settings_that_take_effect_are_accepted(overrides):
    check_config(_config(*overrides))


def test_wandb_settings_are_read_with_wandb():
    from patchword.train.settings import check_settings_take_effect

    check_settings_take_effect(_config("train.report_to=[wandb]", "train.wandb_project=mine"))


@pytest.mark.parametrize("recipe", list_recipes())
def test_no_shipped_recipe_sets_a_setting_without_effect(recipe):
    from patchword.train.settings import check_settings_take_effect

    check_settings_take_effect(load_run_config(recipe, []))


def test_caption_pairing_without_dense_text_is_one_line_naming_both_keys(tmp_path, capsys):
    argv = ["train", *TINY_RUN_32, f"output_dir={tmp_path / 'runs'}", "name=x", "train.max_steps=1"]
    assert main([*argv, "model.seps.dense_pairing=caption", "data.dense=false"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: model.seps.dense_pairing: ") and "data.dense=false" in line
    assert not (tmp_path / "runs").exists()


def test_a_ratio_weight_for_a_matcher_without_patch_selection_is_refused_before_writing(tmp_path, capsys):
    """model.matcher=vse has no ratio loss: train.ratio_weight=5 trained exactly as 2 did."""
    argv = ["train", *TINY_RUN_32, f"output_dir={tmp_path / 'runs'}", "name=x", "train.max_steps=1"]
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert main([*argv, cache, "model.matcher=vse", "train.ratio_weight=5"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: train.ratio_weight: has no effect with model.matcher=vse"), line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind", ["file", "below_a_file", "proc"])
def test_a_bad_cache_dir_is_one_line_naming_the_key_before_any_work(tmp_path, capsys, kind):
    """Old: `error: [Errno 17] File exists: '...'` once the scenes were generated."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    if kind == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    cache = {"file": blocker, "below_a_file": blocker / "cache", "proc": Path("/proc/patchword-cache")}[kind]
    argv = ["train", *TINY_RUN_32, f"output_dir={tmp_path / 'runs'}", "name=x", f"data.cache_dir={cache}"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.cache_dir: "), line
    assert not (tmp_path / "runs").exists() and blocker.read_text() == "not a directory"


def test_a_bad_cache_dir_on_a_resume_is_refused_before_anything_is_written(
    trained_tiny_run, tmp_path, capsys
):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    before = sorted(os.listdir(trained_tiny_run))
    assert (
        main(["train", "--resume", str(trained_tiny_run), "train.max_steps=3", f"data.cache_dir={blocker}"])
        == 2
    )
    assert one_error_line(capsys.readouterr().err).startswith("error: data.cache_dir: ")
    assert sorted(os.listdir(trained_tiny_run)) == before


def test_scenes_cached_in_a_read_only_cache_are_read(tmp_path, monkeypatch, capsys):
    """The cache is only checked for writing when the scenes are not there yet: a shared read-only cache
    that holds them trains. Read-only is what the write probe finds there (as root, chmod does not stop
    writes): every probe of a folder under the cache fails as a read-only directory makes it fail."""
    from patchword import fileio

    cache = tmp_path / "cache"
    argv = ["train", *TINY_RUN_32, "train.max_steps=1", f"data.cache_dir={cache}"]
    assert main([*argv, f"output_dir={tmp_path / 'runs'}", "name=first"]) == 0
    probe = fileio.probe_writable

    def read_only_cache(directory):
        if Path(directory).resolve().is_relative_to(cache.resolve()):
            raise OSError(f"{directory}: cannot write here: Read-only file system (EROFS)")
        probe(directory)

    monkeypatch.setattr(fileio, "probe_writable", read_only_cache)
    assert main([*argv, f"output_dir={tmp_path / 'runs'}", "name=second"]) == 0
    # the check itself still runs where the scenes are not cached yet
    other = ["train", *TINY_RUN_32, "train.max_steps=1", "data.synthetic_seed=7", f"data.cache_dir={cache}"]
    assert main([*other, f"output_dir={tmp_path / 'runs'}", "name=third"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: data.cache_dir: ")


def test_a_resume_of_a_run_with_best_pt_but_no_last_pt_does_not_advise_rerunning_it(tmp_path, capsys):
    """It said the run stopped before its first checkpoint and to rerun the command that started it, which
    then refused the run directory (it holds best.pt)."""
    args = [*TINY_RUN_32, "train.max_steps=1", "progress=false", f"output_dir={tmp_path}", "name=r"]
    assert main(["train", *args]) == 0
    (tmp_path / "r" / "last.pt").unlink()
    assert main(["train", "--resume", str(tmp_path / "r")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "has best.pt but no last.pt" in line and "train.init_from=" in line
    assert "run the command that started it again" not in line
