"""``train.hashnet_alpha`` without ``train.loss=hashnet``, ``train.betas`` with ``train.optimizer=sgd``
(no betas), ``train.temperature`` with ``train.loss=hashnet`` and ``train.feature_weight=0`` (no InfoNCE
term) and ``model.eval_batch_size`` with ``model.fusion=unimodal`` (no evaluation blocks) were accepted and
never used: a new run refuses a value given for them, naming the key and the settings that would ignore it,
before anything is written. A default never triggers it (a run's config.yaml
holds every key), and a run saved before the check still evaluates and resumes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.hashing import HashRunConfig, train_hashing

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = (
    "train.hashnet_alpha: is used by train.loss=hashnet with a train.hash_weight other than 0 only (the "
    "HashNet loss's scale); train.loss={loss} would ignore it: drop it or set train.loss=hashnet"
)
BETAS = (
    "train.betas: is used by train.optimizer=adam or train.optimizer=adamw only (Adam's moment decay "
    "rates); train.optimizer=sgd would ignore it: drop it or set train.optimizer=adam or "
    "train.optimizer=adamw"
)

TEMPERATURE = (
    "train.temperature: is used by a train.loss other than hashnet or a train.feature_weight other than 0 "
    "only (the contrastive losses' temperature); train.loss=hashnet with train.feature_weight=0.0 would "
    "ignore it: drop it or set a train.loss other than hashnet or a train.feature_weight other than 0"
)
EVAL_BLOCK = (
    "model.eval_batch_size: is used by model.fusion=official_fused only (the pairs of one evaluation block, "
    "which attend to each other); model.fusion=unimodal would ignore it: drop it or set "
    "model.fusion=official_fused"
)
NO_INFONCE = ["--loss", "hashnet", "train.feature_weight=0"]


def _argv(out, name: str = "r") -> list[str]:
    return ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", name, *TINY_HASH]


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["train.hashnet_alpha=0.2"], ALPHA.format(loss="infonce")),
        (["train.hashnet_alpha=null"], ALPHA.format(loss="infonce")),  # given at its default: still unused
        (["--loss", "balanced", "train.hashnet_alpha=0.5"], ALPHA.format(loss="balanced")),
        (["train.optimizer=sgd", "train.betas=[0.9,0.99]"], BETAS),
        (["train.optimizer=sgd", "train.betas=[0.5,0.999]"], BETAS),  # the default, given
        ([*NO_INFONCE, "train.temperature=0.1"], TEMPERATURE),
        ([*NO_INFONCE, "train.temperature=0.5"], TEMPERATURE),  # the default, given
        (["train.feature_weight=0", "train.temperature=0.1", "train.loss=hashnet"], TEMPERATURE),
        (["model.eval_batch_size=64"], EVAL_BLOCK),
        (["--fusion", "unimodal", "model.eval_batch_size=128"], EVAL_BLOCK),  # the default, given
    ],
)
def test_hash_train_refuses_a_key_the_settings_do_not_use(tmp_path, capsys, given, line):
    """Defect: each of these trained, exit 0, with the value silently unused."""
    out = tmp_path / "runs"
    assert main([*_argv(out), *given]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {line}"
    assert not out.exists()  # refused before anything is written


def test_hash_train_refuses_a_non_default_value_of_a_config_file(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"train": {"optimizer": "sgd", "betas": [0.9, 0.99]}}))
    out = tmp_path / "runs"
    assert main([*_argv(out), "--config", str(cfg)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {BETAS}"
    assert not out.exists()


def test_train_hashing_from_code_refuses_a_value_other_than_the_default(tmp_path):
    cfg = apply_overrides(HashRunConfig(), [*TINY_HASH, f"output_dir={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError, match=r"^train\.hashnet_alpha: is used by train\.loss=hashnet with"):
        train_hashing(replace(cfg, train=replace(cfg.train, hashnet_alpha=0.3)))
    with pytest.raises(ConfigError, match=r"^train\.betas: is used by train\.optimizer=adam or"):
        train_hashing(replace(cfg, train=replace(cfg.train, optimizer="sgd", betas=[0.9, 0.9])))
    no_infonce = replace(cfg.train, loss="hashnet", feature_weight=0.0, temperature=0.2)
    with pytest.raises(ConfigError) as err:
        train_hashing(replace(cfg, train=no_infonce))
    assert str(err.value) == TEMPERATURE
    with pytest.raises(ConfigError) as err:
        train_hashing(replace(cfg, model=replace(cfg.model, eval_batch_size=32)))
    assert str(err.value) == EVAL_BLOCK
    assert not (tmp_path / "runs").exists()


def test_check_used_keys_accepts_what_the_settings_use_and_untouched_defaults():
    from patchword.hashing.usedkeys import check_used_keys

    cfg = HashRunConfig()
    check_used_keys(cfg)  # defaults: nothing given
    check_used_keys(replace(cfg, train=replace(cfg.train, optimizer="sgd")))  # betas left at the default
    check_used_keys(replace(cfg, train=replace(cfg.train, loss="hashnet", hashnet_alpha=0.2)), {"train.loss"})
    check_used_keys(replace(cfg, train=replace(cfg.train, optimizer="adamw", betas=[0.9, 0.99])))
    check_used_keys(cfg, {"train.betas"})  # adam reads them
    # InfoNCE reads the temperature: the codes' term of a contrastive loss, or a feature term of any loss
    temperature = {"train.temperature"}
    check_used_keys(replace(cfg, train=replace(cfg.train, loss="hashnet", temperature=0.2)), temperature)
    check_used_keys(replace(cfg, train=replace(cfg.train, feature_weight=0.0, temperature=0.2)), temperature)
    check_used_keys(replace(cfg, train=replace(cfg.train, loss="hashnet", feature_weight=0.0)))  # default
    fused = replace(cfg.model, fusion="official_fused", eval_batch_size=16)
    check_used_keys(replace(cfg, model=fused), {"model.eval_batch_size"})


def test_hash_train_takes_a_run_s_saved_config_with_another_optimiser(tmp_path, capsys):
    """A config.yaml holds every key (train.betas included): ``--config RUN/config.yaml`` with sgd is no
    refusal of betas the user never wrote; a key the settings do use trains as before."""
    out = tmp_path / "runs"
    assert main([*_argv(out, "adam"), "--loss", "hashnet", "train.hashnet_alpha=0.2"]) == 0
    capsys.readouterr()
    saved = out / "adam" / "config.yaml"
    assert (
        main(["train", "--config", str(saved), "--name", "sgd", "--loss", "infonce", "train.optimizer=sgd"])
        == 2
    )
    # the saved run's hashnet_alpha (0.2, not the default) is unused by infonce: named
    assert one_error_line(capsys.readouterr().err) == f"error: {ALPHA.format(loss='infonce')}"
    argv = ["train", "--config", str(saved), "--name", "sgd", "train.optimizer=sgd"]
    assert main(argv) == 0  # hashnet still, with its alpha; sgd and the saved (default) betas
    assert json.loads(capsys.readouterr().out)["run_dir"] == str(out / "sgd")


def test_a_run_saved_before_the_check_still_evaluates_and_resumes(tmp_path, capsys, monkeypatch):
    """A run trained before the check may hold such a value in its config.yaml: it is the run's own, and
    hash eval / --resume take it as they did."""
    out = tmp_path / "runs"
    with monkeypatch.context() as m:
        m.setattr("patchword.hashing.runner.check_used_keys", lambda *args: None)  # an older version
        given = ["train.optimizer=sgd", "train.betas=[0.9,0.99]", "train.hashnet_alpha=0.3"]
        assert main([*_argv(out), *given]) == 0
    run = out / "r"
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["betas"] == [0.9, 0.99]
    assert main(["eval", str(run)]) == 0
    assert main(["search", str(run), "--modality", "image", "--query-index", "0", "--k", "2"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == 2


def test_hash_eval_refuses_an_override_the_run_never_reads(tmp_path, capsys):
    """``hash eval`` takes ``model.eval_batch_size``, which only the fused model reads: on a unimodal run it
    was accepted and changed nothing; refused as a new run refuses it. The run's own config.yaml values are
    not the command's (checked only for what the command line gives)."""
    out = tmp_path / "runs"
    assert main(_argv(out)) == 0
    run = out / "r"
    capsys.readouterr()
    assert main(["eval", str(run), "model.eval_batch_size=64"]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {EVAL_BLOCK}"
    assert main(["eval", str(run), "eval.topk=5"]) == 0  # an override it reads: evaluated
