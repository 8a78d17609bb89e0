"""``hash search`` takes ``data.*`` overrides as ``hash eval`` does: a run whose data moved was told to
"point data.image=NEW at it", which search refused as an unrecognized argument. And ``--backend faiss`` on
a run of codes that are not whole bytes is refused naming ``--backend`` and ``model.bits`` as soon as
config.yaml is read (it came after the run and its data were read, naming neither)."""

from __future__ import annotations

import json

import pytest

from conftest import TINY_HASH, one_error_line, write_pair_hash_run
from patchword.cli.hash import main

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = ["--modality", "image", "--query-index", "0", "1", "--k", "2"]


def test_hash_search_takes_the_data_override_its_error_asks_for(tmp_path, capsys):
    """Defect: the error said to point data.image=NEW at the data; search took no such argument."""
    run = write_pair_hash_run(tmp_path)
    capsys.readouterr()
    assert main(["search", str(run), *SEARCH]) == 0
    expected = json.loads(capsys.readouterr().out)["results"]
    moved = tmp_path / "moved_image.npy"
    (tmp_path / "image.npy").rename(moved)
    assert main(["search", str(run), *SEARCH]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.endswith(f"(from {run / 'config.yaml'}); point data.image=NEW at it")
    assert main(["search", str(run), f"data.image={moved}", *SEARCH]) == 0  # before the options
    assert json.loads(capsys.readouterr().out)["results"] == expected  # the run's own data, found
    assert main(["search", str(run), *SEARCH, f"data.image={moved}"]) == 0  # or after them
    assert json.loads(capsys.readouterr().out)["results"] == expected


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "eval.topk=5",
            "error: eval.topk: hash search takes data.* overrides only (where the run's data lie now)",
        ),
        (
            "model.bits=8",
            "error: model.bits: cannot change on a trained run (its weights fix the model; train.* changes "
            "only training): override data.* (where the run's data lie now)",
        ),
        ("data.root=/x", "error: data.root: data.format=pairs reads data.image and data.text"),
        (
            "data.split_seed=3",
            "error: data.split_seed: cannot change on hash search of a trained run (0 -> 3)",
        ),
        ("data.frob=1", "error: data.frob"),
    ],
)
def test_hash_search_checks_its_overrides_as_hash_eval_does(pair_run, capsys, override, line):
    assert main(["search", str(pair_run), override, *SEARCH]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(line)


def test_faiss_on_codes_of_odd_bits_is_refused_once_config_yaml_is_read(tmp_path, capsys, monkeypatch):
    """Defect: `ValueError`-worded 'the faiss backend needs a multiple of 8 bits, got 12' after the run's
    model and data were built, naming neither --backend nor model.bits."""
    out = tmp_path / "runs"
    argv = ["train", "--bits", "12", "--epochs", "1", "--output-dir", str(out), "--name", "b12", *TINY_HASH]
    assert main(argv) == 0
    capsys.readouterr()

    def built(*args, **kwargs):
        raise AssertionError("the data were built before the refusal")

    monkeypatch.setattr("patchword.hashing.build.synthetic_dataset", built)
    assert main(["search", str(out / "b12"), "--backend", "faiss", *SEARCH]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --backend: faiss needs a multiple of 8 bits, the run's codes have model.bits=12: use "
        "--backend numpy"
    )
