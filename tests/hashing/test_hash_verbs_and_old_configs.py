"""Hashing leftovers: ``hash search``'s re-split refusal said ``hash eval``; a new run from an old run's
config.yaml (``hashnet_alpha: 0.0``, the old "unset") was refused although resume and eval read it; ``hash
eval --map-all eval.map_all=false`` let the flag win without a word; ``open_hashing_run`` read last.pt's
config twice (parsed for the data, then the raw dict again for the epochs)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import one_error_line
from patchword.cli.hash import main
from patchword.hashing import HashRunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = ["--modality", "image", "--query-index", "0", "--k", "2"]


@pytest.mark.parametrize("verb", ["eval", "search"])
def test_a_resplit_refusal_names_the_verb_that_runs(hash_run, capsys, verb):
    """Defect: ``hash search RUN data.synthetic_seed=3`` said "cannot change on hash eval"."""
    argv = [verb, str(hash_run), "data.synthetic_seed=3", *(SEARCH if verb == "search" else [])]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: data.synthetic_seed: cannot change on hash {verb} of a trained run (0 -> 3)"
    )


@pytest.mark.parametrize("verb", ["eval", "search"])
def test_a_resplit_of_a_copy_of_the_run_s_data_names_the_verb_too(pair_run, tmp_path, capsys, verb):
    """The same refusal made once a copy of the run's files was read (its fingerprint is the run's)."""
    copy = tmp_path / "image.npy"
    shutil.copy(pair_run.parent.parent / "image.npy", copy)
    argv = [verb, str(pair_run), f"data.image={copy}", "data.split_seed=1"]
    assert main([*argv, *(SEARCH if verb == "search" else [])]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: data.split_seed: cannot change on hash {verb} of a trained run (0 -> 1)")


def _old_config(run: Path, path: Path, **train) -> Path:
    """``run``'s config.yaml as a version before null was the default wrote it: ``hashnet_alpha: 0.0``."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"].update(hashnet_alpha=0.0, **train)
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_new_run_from_an_old_hashnet_run_s_config_trains_with_10_over_bits(
    hash_run, tmp_path, capsys, caplog
):
    """Defect: ``hash train --config OLD/config.yaml`` was refused ("must be a finite number > 0, got
    0.0"), while resume and eval of that run read the 0.0 as unset. Now the new run reads it as they do,
    says so in one warning naming the file, and saves null."""
    old = _old_config(hash_run, tmp_path / "old.yaml", loss="hashnet")
    argv = ["train", "--config", str(old), "--output-dir", str(tmp_path / "runs"), "--name", "new"]
    with caplog.at_level(logging.WARNING, logger="patchword.hashing.config"):
        assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["hashnet_alpha"] == 10 / 16
    warned = [r.getMessage() for r in caplog.records if r.name == "patchword.hashing.config"]
    assert len(warned) == 1 and warned[0].startswith(f"train.hashnet_alpha: 0.0 in {old} is how runs saved")
    saved = yaml.safe_load((tmp_path / "runs" / "new" / "config.yaml").read_text())
    assert saved["train"]["hashnet_alpha"] is None and saved["train"]["loss"] == "hashnet"


def test_a_new_run_from_an_old_infonce_run_s_config_is_no_unused_key(hash_run, tmp_path, capsys):
    """An old infonce run's 0.0 is unset too, not a value given for a loss that does not read it."""
    old = _old_config(hash_run, tmp_path / "old.yaml")
    argv = ["train", "--config", str(old), "--output-dir", str(tmp_path / "runs"), "--name", "new"]
    assert main(argv) == 0
    assert "hashnet_alpha" not in json.loads(capsys.readouterr().out)


def test_an_alpha_override_of_an_old_config_is_the_command_s_own(hash_run, tmp_path, capsys, caplog):
    """``train.hashnet_alpha=0`` typed now is refused as before; another value wins, with no warning."""
    old = _old_config(hash_run, tmp_path / "old.yaml", loss="hashnet")
    argv = ["train", "--config", str(old), "--output-dir", str(tmp_path / "runs"), "--name", "new"]
    assert main([*argv, "train.hashnet_alpha=0"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: train.hashnet_alpha: must be a finite number > 0, got 0.0"), line
    with caplog.at_level(logging.WARNING, logger="patchword.hashing.config"):
        assert main([*argv, "train.hashnet_alpha=0.25"]) == 0
    assert json.loads(capsys.readouterr().out)["hashnet_alpha"] == 0.25
    assert not [r for r in caplog.records if r.name == "patchword.hashing.config"]


def test_map_all_and_an_override_that_disagree_are_refused(hash_run, capsys, monkeypatch):
    """Defect: ``--map-all eval.map_all=false`` computed map@all (the flag won, silently). Refused before
    the run is read, as ``hash train`` refuses ``--bits 32 model.bits=16``; the same value twice is none."""
    import patchword.hashing.runner as runner

    with monkeypatch.context() as m:
        m.setattr(runner, "open_hashing_run", lambda *a, **k: pytest.fail("the run was read"))
        assert main(["eval", str(hash_run), "--map-all", "eval.map_all=false"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --map-all: given, but the override eval.map_all=false sets eval.map_all too: give one of them"
    )
    assert main(["eval", str(hash_run), "eval.map_all=true", "--map-all"]) == 0
    assert "i2t_map@all" in json.loads(capsys.readouterr().out)


def test_open_hashing_run_parses_last_pt_s_config_once(hash_run, monkeypatch):
    """Defect: last.pt's config was parsed for the data, then read raw again for the epochs the session
    trained to. The checkpoint record's epochs now come from the one parse (7 here, through the parse
    this test alters: the run trained 1 epoch of 7, so it did not finish)."""
    from dataclasses import replace

    import patchword.hashing.openrun as openrun

    parsed = []
    from_dict = openrun.from_dict

    def parse(cls, data):
        parsed.append(cls)
        cfg = from_dict(cls, data)
        return replace(cfg, train=replace(cfg.train, epochs=7))

    monkeypatch.setattr(openrun, "from_dict", parse)
    run = openrun.open_hashing_run(hash_run)
    assert parsed == [HashRunConfig]
    assert run.checkpoint == {"file": "last.pt", "epoch": 1, "step": 2, "finished": False}
