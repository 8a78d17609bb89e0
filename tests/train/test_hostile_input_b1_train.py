"""A hostile-input review of ``patchword pretrain --force`` (review B1): ``--force`` replaced whatever folder
``--out`` named (a finished run, a folder of a user's files) and an ``--out`` holding the pretraining run
deleted the run it exported. Now ``--force`` replaces only a folder of encoders, and an ``--out`` that is,
holds or lies inside ``output_dir/name`` is refused: one ``error:`` line, exit 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _overrides(tmp_path: Path) -> list[str]:
    """The pretraining recipe made tiny (as tests/train/test_pretrain.py runs it), three steps."""
    values = {
        "output_dir": tmp_path / "runs",
        "name": "pt",
        "data.cache_dir": tmp_path / "cache",
        "model.name": "vse-tiny-16",
        "model.matcher": "clip",
        "data.synthetic_image_size": 32,
        "data.num_train": 32,
        "data.num_dev": 8,
        "data.num_test": 8,
        "train.batch_size": 16,
        "train.epochs": 2,
        "train.max_steps": 3,
        "train.eval_max_images": 8,
        "train.log_every": 1,
        "train.num_threads": 1,
    }
    return [f"{key}={value}" for key, value in values.items()]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if the pretraining run starts: the refusals come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the pretraining run started before --out was checked")

    monkeypatch.setattr("patchword.train.runner.train_run", refuse)
    monkeypatch.setattr("patchword.train.runner.resume_run", refuse)


def test_force_does_not_replace_a_finished_run(trained_tiny_run, tmp_path, capsys, no_training):
    """Old code: ``pretrain --force --out RUN`` trained, then put the encoders in the place of the run
    (moved aside and deleted)."""
    run = Path(shutil.copytree(trained_tiny_run, tmp_path / "victim"))
    before = _snapshot(run)
    assert main(["pretrain", "--force", "--out", str(run), *_overrides(tmp_path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {run} holds .lock, best.pt, config.yaml ..., not only encoders "), line
    assert "--force replaces only a folder of encoders" in line
    assert _snapshot(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # no lock file left beside it


def test_force_does_not_replace_encoders_beside_a_users_file(tmp_path, capsys, no_training):
    enc = tmp_path / "enc"
    enc.mkdir()
    for name in ("model.safetensors", "vocab.json", "config.json", "notes.txt"):
        (enc / name).write_text(name)
    assert main(["pretrain", "--force", "--out", str(enc), *_overrides(tmp_path)]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {enc} holds notes.txt, not only encoders"
    )
    assert (enc / "notes.txt").read_text() == "notes.txt"


@pytest.mark.parametrize(
    ("out", "where"), [("runs", "holds"), ("runs/pt", "is"), ("runs/pt/enc", "lies inside")]
)
def test_an_out_over_the_pretraining_run_is_refused(tmp_path, capsys, no_training, out, where):
    """Old code: ``--out OUTPUT_DIR`` trained the run there, then replaced OUTPUT_DIR (the run in it) with
    the encoders; ``--out OUTPUT_DIR/NAME`` exported over the run itself."""
    target = tmp_path / out
    assert main(["pretrain", "--force", "--out", str(target), *_overrides(tmp_path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: --out: {target} {where} the pretraining run {tmp_path / 'runs' / 'pt'} (output_dir/name): "
        "the encoders go in a folder of their own, outside it"
    )
    assert list(tmp_path.iterdir()) == []
