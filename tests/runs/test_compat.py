"""Old run directories and exports still load and score the same: a tiny run and its export written by
f715cbc (``tests/data/compat_f715cbc``, made by ``benchmarks/compat_fixture.py``), loaded by today's code;
and that run made a plug-in matcher's saved with its token geometry in ``model.options``, as runs saved
before a12b816 are."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys

import pytest
import torch
import yaml

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.matching.registry import _REGISTRY, matcher_spec
from patchword.runs import load_run
from project_paths import BENCHMARKS, TEST_DATA

FIXTURE = TEST_DATA / "compat_f715cbc"
sys.path.insert(0, str(BENCHMARKS))
from compat_fixture import score  # noqa: E402  (the same inputs the old version scored)

KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "i2t_medr", "t2i_medr")


@pytest.mark.parametrize("kind", ["run", "export"])
def test_a_run_and_an_export_from_f715cbc_score_as_they_did(kind):
    recorded = torch.load(FIXTURE / "scores.pt", weights_only=True)[kind]
    assert recorded.shape == (4, 6)
    # the same kernels in another order (the engine and the encoders changed since): float32 rounding only
    assert torch.allclose(score(FIXTURE / kind), recorded, rtol=0, atol=1e-6)


def test_a_run_from_f715cbc_evaluates_to_its_recorded_recalls(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run)
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out), f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    recorded = json.loads((FIXTURE / "eval.json").read_text())
    evaluated = json.loads(out.read_text())
    assert {k: evaluated[k] for k in KEYS} == {k: recorded[k] for k in KEYS}


# A run saved before token geometry was refused in model.options (a12b816): a plug-in matcher's options then
# went to its config as given, the encoders' geometry too, and config.yaml kept them. The plug-in here is
# SEPS registered under another name, so that the f715cbc run is such a run once its config names it.
PLUGIN = "seps-options"
GEOMETRY = {"embed_dim": 32, "num_patches": 16, "has_cls": True}  # the tiny ViT's: 4x4 patches and CLS


@pytest.fixture
def old_plugin_run(tmp_path, monkeypatch):
    """The f715cbc run as a run of plug-in ``seps-options`` whose ``model.options`` hold its geometry."""
    spec = dataclasses.replace(matcher_spec("seps"), name=PLUGIN, section=PLUGIN)
    monkeypatch.setitem(_REGISTRY, PLUGIN, spec)
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"].update(matcher=PLUGIN, options=dict(GEOMETRY))
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run


def _set_options(run, **options) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["options"].update(options)
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def test_an_old_plugin_run_with_its_geometry_in_the_options_loads_evaluates_and_exports(
    old_plugin_run, tmp_path, capsys, caplog
):
    """Old code (a12b816 on): "model.options.embed_dim: is token geometry ... drop it" from load_run,
    ``patchword eval`` and ``patchword export`` of a run saved with it, whose config.yaml is never
    rewritten."""
    recorded = torch.load(FIXTURE / "scores.pt", weights_only=True)["run"]
    with caplog.at_level("DEBUG", logger="patchword.model.build"):
        assert torch.allclose(score(old_plugin_run), recorded, rtol=0, atol=1e-6)
    dropped = [r.getMessage() for r in caplog.records if "is the encoders' token geometry" in r.getMessage()]
    assert [m.split(": ", 1)[1].split("=")[0] for m in dropped] == [f"model.options.{k}" for k in GEOMETRY]
    out = tmp_path / "eval.json"
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    assert main(["eval", str(old_plugin_run), "--out", str(out), cache]) == 0, capsys.readouterr().err
    evaluated, was = json.loads(out.read_text()), json.loads((FIXTURE / "eval.json").read_text())
    assert evaluated["matcher"] == PLUGIN and {k: evaluated[k] for k in KEYS} == {k: was[k] for k in KEYS}
    assert main(["export", str(old_plugin_run), str(tmp_path / "export")]) == 0, capsys.readouterr().err
    assert torch.allclose(score(tmp_path / "export"), recorded, rtol=0, atol=1e-6)
    assert "embed_dim: 32" in (old_plugin_run / "config.yaml").read_text()  # as it was saved


@pytest.mark.parametrize(("key", "value"), [("num_patches", 64), ("has_cls", False), ("embed_dim", 16)])
def test_an_old_plugin_runs_geometry_that_disagrees_with_its_encoders_is_one_error_naming_it(
    old_plugin_run, tmp_path, capsys, key, value
):
    _set_options(old_plugin_run, **{key: value})
    with pytest.raises(ConfigError) as caught:
        load_run(old_plugin_run)
    assert caught.value.key == f"model.options.{key}"
    assert f"is {value!r} in {old_plugin_run / 'config.yaml'}" in caught.value.detail
    assert f"the run's encoders give {key}={GEOMETRY[key]!r}" in caught.value.detail
    out = tmp_path / "eval.json"
    assert main(["eval", str(old_plugin_run), "--out", str(out), f"data.cache_dir={tmp_path / 'c'}"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: model.options.{key}: is {value!r} in ")
    assert not out.exists()


def test_geometry_given_now_is_refused_even_where_it_agrees(old_plugin_run, tmp_path, capsys):
    """A run saved with it keeps loading; an override of it (eval) and a new run's (train) are refused."""
    out = tmp_path / "eval.json"
    assert main(["eval", str(old_plugin_run), "model.options.num_patches=16", "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: model.options.num_patches: is token geom"
    )
    train = ["train", *json.loads((FIXTURE / "made_by.json").read_text())["train"], f"model.matcher={PLUGIN}"]
    train += ["model.options.num_patches=16", f"output_dir={tmp_path}", "name=new"]
    assert main(train) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: model.options.num_patches: is token geom"
    )
    assert not (tmp_path / "new").exists() and not out.exists()
