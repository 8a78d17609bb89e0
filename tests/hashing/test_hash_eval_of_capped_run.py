"""``hash eval`` / ``hash search`` of a trained pair-only run: the default ``data.num_train`` capped to the
pairs is said (warned) once, by ``hash train``, and a key that would re-split the run's data (or that its
format ignores) is refused before its data are read or built."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from conftest import one_error_line
from patchword.cli.hash import main

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ["--bits", "16", "--epochs", "1", "model.hidden=32", "model.dim_feedforward=32", "model.num_layers=1"]
MODEL += ["train.batch_size=5", "eval.ks=[1,5]"]
CAPPED = "data.num_train=2000 (not given) capped to the 10 pairs of"
BUILD = "patchword.hashing.build"


def _cap_records(caplog, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == BUILD and CAPPED in r.getMessage() and r.levelno == level]


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory) -> tuple[Path, list[tuple[int, str]]]:
    """A run on 60 pair-only pairs with data.num_query=50 and the default data.num_train (2000): trained on
    the 10 pairs the queries leave. Also returns (level, message) of hash train's build log records."""
    tmp = tmp_path_factory.mktemp("capped")
    rng = np.random.default_rng(0)
    for name in ("image", "text"):
        np.save(tmp / f"{name}.npy", rng.standard_normal((60, 16)).astype(np.float32))
    data = ["--data", "pairs", "--image", str(tmp / "image.npy"), "--text", str(tmp / "text.npy")]
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    build = logging.getLogger(BUILD)
    build.addHandler(handler)
    try:
        argv = ["train", *MODEL, "--output-dir", str(tmp / "runs"), "--name", "p", *data, "data.num_query=50"]
        assert main(argv) == 0
    finally:
        build.removeHandler(handler)
    return tmp / "runs" / "p", [(r.levelno, r.getMessage()) for r in records]


def test_hash_train_warns_once_that_the_default_num_train_was_capped(capped_run):
    _, records = capped_run
    assert [level for level, message in records if CAPPED in message] == [logging.WARNING]


def test_hash_eval_of_the_run_does_not_warn_of_the_cap(capped_run, caplog, capsys):
    """Defect: every ``hash eval`` of the run warned that data.num_train (which the user never set, and
    which the evaluation does not use) was capped."""
    run, _ = capped_run
    assert main(["eval", str(run)]) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "capped" not in capsys.readouterr().err
    assert main(["-v", "eval", str(run)]) == 0  # said at debug level only
    assert len(_cap_records(caplog, logging.DEBUG)) == 1
    assert f"DEBUG {BUILD}: {CAPPED}" in capsys.readouterr().err


def test_hash_search_of_the_run_does_not_warn_of_the_cap(capped_run, caplog, capsys):
    run, _ = capped_run
    assert main(["search", str(run), "--modality", "text", "--query-index", "0", "--k", "2"]) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "capped" not in capsys.readouterr().err


class _Built(Exception):
    """Raised by the patched data builders: the command got as far as reading the data."""


@pytest.mark.parametrize(
    ("override", "values"),
    [("data.split_seed=1", "0 -> 1"), ("data.num_query=40", "50 -> 40"), ("data.num_train=5", "2000 -> 5")],
)
def test_hash_eval_refuses_a_resplit_before_the_data_are_built(
    capped_run, capsys, monkeypatch, override, values
):
    """Defect: the refusal came after the run's data were read and split (minutes on real data)."""

    def built(*args, **kwargs):
        raise _Built("the data were read or built before the refusal")

    monkeypatch.setattr("patchword.hashing.openrun.build_hashing_dataset", built)
    monkeypatch.setattr("patchword.hashing.build.load_pairs", built)
    run, _ = capped_run
    assert main(["eval", str(run), override]) == 2
    key = override.split("=", 1)[0]
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {key}: cannot change on hash eval of a trained run ({values}):")


def test_open_hashing_run_refuses_a_resplit_before_the_data_are_built(capped_run, monkeypatch):
    from patchword.errors import ConfigError
    from patchword.hashing.runner import open_hashing_run

    def built(*args, **kwargs):
        raise _Built("the data were read or built before the refusal")

    monkeypatch.setattr("patchword.hashing.openrun.build_hashing_dataset", built)
    run, _ = capped_run
    with pytest.raises(ConfigError, match=r"^data\.split_seed: cannot change on hash eval"):
        open_hashing_run(run, ["data.split_seed=3"])


def _split_arrays(rows: int, rng) -> dict[str, np.ndarray]:
    return {
        "image": rng.standard_normal((rows, 16)).astype(np.float32),
        "text": rng.standard_normal((rows, 16)).astype(np.float32),
        "label": (rng.random((rows, 3)) < 0.5).astype(np.uint8),
    }


def test_hash_eval_refuses_keys_of_a_pre_split_run_before_its_files_are_read(tmp_path, capsys, monkeypatch):
    """A split directory ignores the split keys (said before its files are read, as the format's own
    refusal); a .mat file is known to be pre-split only once read, so a split key is refused as a re-split
    that a pre-split file would ignore."""
    scipy_io = pytest.importorskip("scipy.io")
    rng = np.random.default_rng(0)
    parts = {s: _split_arrays(rows, rng) for s, rows in (("train", 40), ("query", 8), ("retrieval", 30))}
    root = tmp_path / "sp"
    root.mkdir()
    for name, arrays in parts.items():
        np.savez(root / f"{name}.npz", **arrays)
    mat = tmp_path / "pre.mat"
    names = {"train": "tr", "query": "te", "retrieval": "db"}
    scipy_io.savemat(
        mat, {f"{m}_{names[s]}": parts[s][k] for s in parts for m, k in zip("ITL", parts[s], strict=True)}
    )
    out = tmp_path / "runs"
    base = ["train", *MODEL, "train.batch_size=16", "--output-dir", str(out)]
    assert main([*base, "--name", "sp", "--data", "splits", "--root", str(root)]) == 0
    assert main([*base, "--name", "mat", "--data", "mat", "--root", str(mat)]) == 0
    capsys.readouterr()

    def built(*args, **kwargs):
        raise _Built("the data were read or built before the refusal")

    monkeypatch.setattr("patchword.hashing.openrun.build_hashing_dataset", built)
    for name in ("load_split_dir", "read_mat"):
        monkeypatch.setattr(f"patchword.hashing.build.{name}", built)
    assert main(["eval", str(out / "sp"), "data.num_query=4"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: data.num_query: data.format=splits reads pre-split files ({root}: train / query / "
        "retrieval): the pre-split files decide the splits, so data.num_query would be ignored; drop it"
    )
    assert main(["eval", str(out / "mat"), "data.split_seed=2"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: data.split_seed: cannot change on hash eval of a trained run (0 -> 2): it re-splits the "
        "run's pairs, so its query set may hold pairs the run trained on (a pre-split .mat ignores it: its "
        "splits are its own); drop it, or evaluate other data (data.format / data.image / data.text / "
        "data.root)"
    )
