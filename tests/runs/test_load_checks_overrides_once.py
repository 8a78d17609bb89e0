"""load_run checks a saved run's ``model.*`` overrides once: read_run_config checks them on the default
path (old code checked them there and again in load_run), load_run itself where the caller gives the
config; either way another matcher's section is refused."""

from __future__ import annotations

import pytest

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.runs import load, load_run, read_run_config

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vse_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    args = [*TINY_RUN_32, "model.matcher=vse", "train.max_steps=1", f"output_dir={runs}", "name=vse"]
    assert main(["train", *args]) == 0
    return runs / "vse"


def _counted(monkeypatch) -> list:
    calls = []
    check = load.check_option_overrides

    def counting(cfg, overrides):
        calls.append(list(overrides))
        return check(cfg, overrides)

    monkeypatch.setattr(load, "check_option_overrides", counting)
    return calls


def test_the_default_path_checks_once(vse_run, monkeypatch):
    calls = _counted(monkeypatch)
    load_run(vse_run, overrides=["model.vse.pool=mean"])
    assert calls == [["model.vse.pool=mean"]]


def test_a_callers_config_is_checked_by_load_run(vse_run, monkeypatch):
    bad = ["model.seps.sparse_ratio=0.6"]
    config = apply_overrides(read_run_config(vse_run), bad)  # not read_run_config's check
    calls = _counted(monkeypatch)
    with pytest.raises(ConfigError) as caught:
        load_run(vse_run, overrides=bad, config=config)
    assert caught.value.key == "model.seps.sparse_ratio" and calls == [bad]
    with pytest.raises(ConfigError) as caught:
        load_run(vse_run, overrides=bad)
    assert caught.value.key == "model.seps.sparse_ratio"
