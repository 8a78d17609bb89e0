"""Settings ``hash train`` took and silently replaced or ignored, refused before anything is written:
``train.hashnet_alpha=0`` (trained with 10/bits, config.yaml said 0.0; the scale used is recorded now), a
``train.batch_size`` above the training pairs (one batch of them all), loss weights that train nothing or a
HashNet loss whose term is dropped, a shortcut flag and a dotted override of its key with other values (the
flag won), and ``--data pairs`` without ``--text`` (blamed data.image). Runs saved with the old
``hashnet_alpha: 0.0`` still evaluate and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from conftest import TINY_HASH, one_error_line
from patchword.checkpoint import atomic_save, load_checkpoint
from patchword.cli.hash import main

pytestmark = pytest.mark.usefixtures("one_thread")


#: TINY_HASH without its train.batch_size (the tests that set one with --batch-size)
UNBATCHED = [item for item in TINY_HASH if not item.startswith("train.batch_size=")]


def _argv(out, *extra: str, tiny: list[str] = TINY_HASH) -> list[str]:
    return ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", "r", *tiny, *extra]


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (
            ["--loss", "hashnet", "train.hashnet_alpha=0"],
            "train.hashnet_alpha: must be a finite number > 0, got 0.0 (unset, null: 10 / model.bits)",
        ),
        (
            ["train.batch_size=128"],
            "train.batch_size: 128 is more than the 64 training pairs (every epoch would be one batch of "
            "64): give train.batch_size=64 or less",
        ),
        (
            ["--batch-size", "65"],
            "train.batch_size: 65 is more than the 64 training pairs (every epoch would be one batch of "
            "64): give train.batch_size=64 or less (set by --batch-size)",
        ),
        (
            ["train.feature_weight=0", "train.hash_weight=0"],
            "train.hash_weight: 0 with train.feature_weight=0 too: the loss is 0 and nothing is trained; "
            "give either a weight",
        ),
        (
            ["--loss", "hashnet", "train.hash_weight=0"],
            "train.loss: hashnet is the loss of the codes' term, which train.hash_weight=0 drops (the "
            "feature term is InfoNCE, as with train.loss=infonce): drop train.loss or give "
            "train.hash_weight > 0",
        ),
        (
            ["--loss", "hashnet", "train.hash_weight=0", "train.hashnet_alpha=0.5"],
            "train.hashnet_alpha: is used by train.loss=hashnet with a train.hash_weight other than 0 only "
            "(the HashNet loss's scale); train.hash_weight=0.0 would ignore it: drop it or set a "
            "train.hash_weight other than 0",
        ),
        (["--bits", "32", "model.bits=16"], "--bits: 32, but the override model.bits=16 sets model.bits too"),
        (["train.epochs=3"], "--epochs: 1, but the override train.epochs=3 sets train.epochs too"),
        (
            ["output_dir=elsewhere"],
            "--output-dir: {out}, but the override output_dir=elsewhere sets output_dir",
        ),
    ],
    ids=[
        "alpha-0",
        "batch",
        "batch-flag",
        "no-weight",
        "hashnet-dropped",
        "alpha-dropped",
        "bits",
        "epochs",
        "dir",
    ],
)
def test_hash_train_refuses_what_it_replaced_or_ignored(tmp_path, capsys, monkeypatch, given, line):
    """Defect: each trained, exit 0 (alpha 0 as 10/bits, the batch as one of 64 pairs, the weights as a
    loss of 0, the flag over the override)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs"
    assert main(_argv(out, *given, tiny=UNBATCHED if "--batch-size" in given else TINY_HASH)) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {line.format(out=out)}")
    assert not out.exists() and not (tmp_path / "elsewhere").exists()  # before anything is written


def test_a_batch_above_the_training_pairs_is_refused_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    """Defect: the check came after the model was built and the data moved to the device."""
    import patchword.hashing.runner as runner

    built = []
    build = runner.build_hashing_model
    monkeypatch.setattr(runner, "build_hashing_model", lambda *a: built.append(a) or build(*a))
    assert main(_argv(tmp_path / "runs", "train.batch_size=128")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: train.batch_size: 128 is more than the 64 training pairs"), line
    assert built == []


def test_a_flag_and_its_override_with_one_value_are_no_conflict(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(_argv(out, "model.bits=16", "train.epochs=1", "--batch-size", "32")) == 0
    assert json.loads(capsys.readouterr().out)["bits"] == 16


def test_a_resume_refuses_a_flag_and_an_override_of_one_key(hash_run, capsys):
    assert main(["train", "--resume", str(hash_run), "--epochs", "2", "train.epochs=3"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line == "error: --epochs: 2, but the override train.epochs=3 sets train.epochs too: give one of them"
    )


def test_pairs_without_text_names_the_empty_key(tmp_path, capsys):
    """Defect: ``--data pairs --image X`` said ``data.image: ... needs data.image and data.text``."""
    np.save(tmp_path / "image.npy", np.ones((8, 4), np.float32))
    argv = _argv(tmp_path / "runs", "--data", "pairs", "--image", str(tmp_path / "image.npy"))
    assert main([a for a in argv if not a.startswith("data.synthetic_")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: data.text: is empty: data.format=pairs reads data.image and data.text")


def test_a_hashnet_run_records_the_scale_it_trained_with(tmp_path, capsys):
    """Defect: the default scale (10/bits) was recorded nowhere, config.yaml said 0.0."""
    out = tmp_path / "runs"
    assert main(_argv(out, "--loss", "hashnet")) == 0
    assert json.loads(capsys.readouterr().out)["hashnet_alpha"] == 10 / 16
    run = out / "r"
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["hashnet_alpha"] is None
    assert json.loads((run / "eval.json").read_text())["hashnet_alpha"] == 10 / 16
    assert main(["eval", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["hashnet_alpha"] == 10 / 16
    assert main(_argv(out, "--name", "given", "--loss", "hashnet", "train.hashnet_alpha=0.25")) == 0
    assert json.loads(capsys.readouterr().out)["hashnet_alpha"] == 0.25


def test_a_run_saved_with_alpha_0_still_evaluates_and_resumes(tmp_path, capsys):
    """A run of an older version holds ``hashnet_alpha: 0.0`` (its default, 10/bits) in config.yaml and
    last.pt: read as the default, not refused as an explicit 0."""
    out = tmp_path / "runs"
    assert main(_argv(out, "--loss", "hashnet", "train.save_every=1")) == 0
    run = out / "r"
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["hashnet_alpha"] = 0.0
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    state = load_checkpoint(run / "last.pt")
    state["config"]["train"]["hashnet_alpha"] = 0.0
    atomic_save(state, run / "last.pt")
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["hashnet_alpha"] == 10 / 16
    assert main(["train", "--resume", str(run), "--epochs", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["epochs"] == 2 and summary["hashnet_alpha"] == 10 / 16
