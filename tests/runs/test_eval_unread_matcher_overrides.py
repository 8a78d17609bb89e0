"""What an evaluation of a saved run refuses of the matcher's options, and how an ensemble names a member's
bad config.

Old code: ``patchword eval VSE_RUN model.seps.sparse_ratio=0.6`` (or the legacy ``model.sparse_ratio``)
evaluated and recorded the override as applied, although VSE never reads ``model.seps`` (the build leaves
other sections alone: a recipe rebuilds a SEPS run's encoders under VSE and keeps its section), while
``patchword train`` refuses it; and ``patchword eval RUN --ensemble OTHER`` with a member of a matcher not
registered said "model.matcher: unknown matcher 'nosuch'" without naming which of the runs it was. An
ensemble's override of one member's section applies to the members that read it (old code refused it for
the others), and one no member reads is refused naming every member's section."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import TINY_RUN_32, one_error_line
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


@pytest.mark.parametrize("key", ["model.seps.sparse_ratio", "model.sparse_ratio", "model.scan.lambda_lse"])
def test_eval_refuses_an_option_of_a_section_the_runs_matcher_does_not_read(vse_run, tmp_path, capsys, key):
    out = tmp_path / "e.json"
    assert main(["eval", str(vse_run), f"{key}=0.6", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: {key}: has no effect with model.matcher=vse (it reads model.vse)"
    assert not out.exists()
    with pytest.raises(ConfigError) as caught:  # load_run refuses it as well
        load_run(vse_run, overrides=[f"{key}=0.6"])
    assert caught.value.key == key


def test_an_option_of_the_runs_own_section_still_applies(vse_run):
    assert load_run(vse_run, overrides=["model.vse.pool=mean"]).model.matcher.config.pool == "mean"


def test_an_ensemble_members_unknown_matcher_names_the_member(vse_run, tmp_path, capsys):
    member = tmp_path / "member"
    shutil.copytree(vse_run, member)
    config = member / "config.yaml"
    config.write_text(config.read_text().replace("  matcher: vse\n", "  matcher: nosuch\n"))
    out = tmp_path / "e.json"
    assert main(["eval", str(vse_run), "--ensemble", str(member), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: model.matcher: in ensemble member {member}: unknown matcher 'nosuch'")
    assert not out.exists()


# load_run checks a saved run's model.* overrides once: read_run_config checks them on the default path (old
# code checked them there and again in load_run), load_run itself where the caller gives the config; either
# way another matcher's section is refused.


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


def test_a_whole_model_mapping_is_checked_as_its_dotted_keys(vse_run, tmp_path, capsys):
    """Old code left ``model={seps: {...}}`` to the build, which never looks at other sections: applied,
    recorded, ignored."""
    out, override = tmp_path / "e.json", "model={seps: {sparse_ratio: 0.6}}"
    assert main(["eval", str(vse_run), override, "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: model.seps: has no effect with model.matcher=vse (it reads model.vse) "
        f"(in override {override!r})"
    )
    assert not out.exists()


@pytest.fixture(scope="module")
def seps_run(vse_run):
    args = [*TINY_RUN_32, "train.max_steps=1", f"output_dir={vse_run.parent}", "name=seps"]
    assert main(["train", *args]) == 0
    return vse_run.parent / "seps"


def test_an_ensemble_applies_a_section_to_the_members_that_read_it(seps_run, vse_run, tmp_path, monkeypatch):
    """Old code refused ``model.seps.leaky_slope`` on a SEPS + VSE ensemble: the VSE member's check saw a
    section its matcher does not read, although the SEPS member does. Each member is loaded with its
    share: the SEPS run with the override, the VSE run without it."""
    import patchword.runs

    loaded = {}

    def recording(run_dir, *args, overrides=(), config=None, **kwargs):
        loaded[run_dir.name] = (list(overrides), config.model.seps.leaky_slope)
        return load_run(run_dir, *args, overrides=overrides, config=config, **kwargs)

    monkeypatch.setattr(patchword.runs, "load_run", recording)
    out, override = tmp_path / "e.json", "model.seps.leaky_slope=0.5"
    assert main(["eval", str(seps_run), "--ensemble", str(vse_run), "--out", str(out), override]) == 0
    assert loaded == {"seps": ([override], 0.5), "vse": ([], 0.1)}
    assert json.loads(out.read_text())["overrides"] == [override]


def test_an_ensemble_refuses_a_section_no_member_reads(seps_run, vse_run, tmp_path, capsys):
    out = tmp_path / "e.json"
    args = ["eval", str(seps_run), "--ensemble", str(vse_run), "--out", str(out), "model.scan.lambda_lse=5"]
    assert main(args) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: model.scan.lambda_lse: has no effect on any member of the ensemble (their matchers read "
        "model.seps, model.vse)"
    )
    assert not out.exists()
