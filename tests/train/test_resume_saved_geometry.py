"""``train --resume`` of a plug-in run saved before token geometry was refused in ``model.options``
(a12b816): its config.yaml and last.pt hold ``embed_dim`` / ``num_patches`` / ``has_cls`` there, as its
matcher was built with them. The resume accepts them as ``load_run`` and ``patchword eval`` do
(``split_saved_geometry``): values that agree with the encoders' are dropped, one that disagrees is named.
Old code refused every such run: "model.options.embed_dim: is token geometry ... drop it"."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.matching.registry import _REGISTRY, matcher_spec
from patchword.runs.config import RunConfig
from patchword.train.matcher_checks import check_matcher

pytestmark = pytest.mark.usefixtures("one_thread")

# SEPS registered under another name without a typed section: a plug-in whose options live in model.options
PLUGIN = "seps-options"
GEOMETRY = {"embed_dim": 32, "num_patches": 16, "has_cls": True}  # the tiny ViT's: 4x4 patches and CLS


@pytest.fixture
def plugin(monkeypatch):
    spec = dataclasses.replace(matcher_spec("seps"), name=PLUGIN, section=PLUGIN)
    monkeypatch.setitem(_REGISTRY, PLUGIN, spec)


def test_check_matcher_leaves_a_resumed_runs_saved_geometry_to_its_build(plugin):
    """A new run's geometry in model.options is refused before anything is written; a resumed run's is
    its build's to check against the encoders (``build_model(saved=)``)."""
    cfg = apply_overrides(RunConfig(), [*TINY_RUN_32, f"model.matcher={PLUGIN}"])
    cfg.model.options.update(GEOMETRY)
    check_matcher(cfg, resuming=True)
    with pytest.raises(ConfigError, match=r"^model\.options\.embed_dim: is token geometry"):
        check_matcher(cfg)
    cfg.model.options["sparse_ratio"] = "high"  # the other options are checked as ever
    with pytest.raises(ConfigError, match=r"^model\.options: "):
        check_matcher(cfg, resuming=True)


@pytest.fixture
def old_plugin_run(tmp_path, plugin):
    """A one-step run of plug-in ``seps-options`` whose config.yaml and last.pt record its geometry in
    ``model.options``, as such a run saved before a12b816 did."""
    runs = tmp_path / "runs"
    args = [*TINY_RUN_32, f"model.matcher={PLUGIN}", "train.max_steps=1", f"output_dir={runs}", "name=old"]
    assert main(["train", *args]) == 0
    return runs / "old"


def _save_geometry(run, **geometry) -> None:
    """``geometry`` into the run's model.options, in config.yaml and in last.pt's config alike."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["options"].update(geometry)
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    state = torch.load(run / "last.pt", weights_only=False)
    state["config"]["model"]["options"].update(geometry)
    torch.save(state, run / "last.pt")


def test_an_old_plugin_run_with_its_geometry_in_the_options_resumes(old_plugin_run, capsys):
    _save_geometry(old_plugin_run, **GEOMETRY)
    assert main(["train", "--resume", str(old_plugin_run), "train.max_steps=2"]) == 0, capsys.readouterr().err
    summary = json.loads((old_plugin_run / "summary.json").read_text())
    assert summary["matcher"] == PLUGIN
    assert [
        json.loads(line)["step"] for line in (old_plugin_run / "resumes.jsonl").read_text().splitlines()
    ] == [1]
    assert "embed_dim: 32" in (old_plugin_run / "config.yaml").read_text()  # as it was saved


def test_an_old_plugin_runs_geometry_that_disagrees_is_named_on_resume(old_plugin_run, capsys):
    _save_geometry(old_plugin_run, **{**GEOMETRY, "num_patches": 64})
    assert main(["train", "--resume", str(old_plugin_run), "train.max_steps=2"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: model.options.num_patches: is 64 in {old_plugin_run / 'config.yaml'}, but the run's "
        "encoders give num_patches=16: token geometry comes from the encoders (model.embed_dim, the image "
        "encoder's patches and CLS token), so this run's matcher cannot be built as it was saved"
    )
    assert not (old_plugin_run / "resumes.jsonl").exists()
