"""Bad input to ``patchword hash train|eval|search``: one ``error:`` line (exit 2) naming the file, flag or
config key, no traceback, and nothing written: no run directory, no cached index, no output file."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

from conftest import TINY_HASH, one_error_line
from patchword.cli import main as patchword_main
from patchword.cli.hash import main
from patchword.errors import DataError
from patchword.hashing import readers

pytestmark = pytest.mark.usefixtures("one_thread")

# TINY_HASH for data read from files: the data.synthetic_* keys shape generated features only (refused)
FILES = [o for o in TINY_HASH if not o.startswith("data.synthetic_")]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run(hash_run) -> Path:
    """A trained 16-bit UCMFH run on tiny synthetic data (32-d image and text features)."""
    return hash_run


def _npy_bytes(array: np.ndarray, tmp_path: Path) -> bytes:
    np.save(tmp_path / "_.npy", array)
    return (tmp_path / "_.npy").read_bytes()


def _split_fields(rows: int = 40) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "image": rng.standard_normal((rows, 8)).astype(np.float32),
        "text": rng.standard_normal((rows, 8)).astype(np.float32),
        "label": (rng.random((rows, 3)) < 0.5).astype(np.uint8),
    }


def _write_splits(root: Path, ext: str, content: bytes | None) -> None:
    """``root/{train,query,retrieval}.ext``: train holds ``content``, the others good data."""
    root.mkdir()
    for name in ("train", "query", "retrieval"):
        if name == "train" and content is not None:
            (root / f"train{ext}").write_bytes(content)
        else:
            np.savez(root / f"{name}.npz", **_split_fields())


# (case id, files to write {name: bytes-maker}, data flags, text the error line must contain)
TRAIN_CASES = [
    (  # was EOFError with a traceback
        "empty .npy",
        {"image.npy": lambda t: b""},
        ["--data", "pairs", "--image", "image.npy", "--text", "text.npy"],
        "image.npy: not a readable .npy file: the file is empty",
    ),
    (
        "truncated .npy",
        {"image.npy": lambda t: _npy_bytes(np.ones((50, 32), np.float32), t)[:300]},
        ["--data", "pairs", "--image", "image.npy", "--text", "text.npy"],
        "image.npy: not a readable .npy file (damaged, truncated or another format): Failed to read all data",
    ),
    (
        "text in a .npy",
        {"text.npy": lambda t: b"hello\n"},
        ["--data", "pairs", "--image", "image.npy", "--text", "text.npy"],
        "text.npy: not a .npy file (text starting 'hello')",
    ),
    (
        "object .npy",
        {"text.npy": lambda t: _npy_bytes(np.array([{"a": 1}], dtype=object), t)},
        ["--data", "pairs", "--image", "image.npy", "--text", "text.npy"],
        "text.npy: holds pickled (object) data, not read without pickle",
    ),
    (  # was EOFError with a traceback
        "empty split .npz",
        {},
        ["--data", "splits", "--root", "sp"],
        "train.npz: not a readable .npz file: the file is empty",
    ),
    (  # was "error: invalid literal for int() with base 10: 'arbage\n'", naming no file
        "text in a split .pkl",
        {},
        ["--data", "splits", "--root", "sp-pkl"],
        "train.pkl: not a pickle (text starting 'garbage')",
    ),
    (  # was MatReadError with a traceback
        "text in a .mat",
        {"t.mat": lambda t: b"hello\n"},
        ["--data", "mat", "--root", "t.mat"],
        "t.mat: not a readable .mat file (damaged, truncated or another format): Mat file appears to be",
    ),
    (  # was "bits must be >= 1, got 0", naming neither the flag nor the key
        "--bits 0",
        {},
        ["--bits", "0"],
        "model.bits: must be >= 1 (the code length), got 0 (set by --bits)",
    ),
]


@pytest.mark.parametrize(
    ("files", "flags", "expected"), [c[1:] for c in TRAIN_CASES], ids=[c[0] for c in TRAIN_CASES]
)
def test_hash_train_bad_data_is_one_line_naming_the_file(
    tmp_path, capsys, monkeypatch, files, flags, expected
):
    monkeypatch.chdir(tmp_path)
    np.save("image.npy", np.ones((50, 32), np.float32))
    np.save("text.npy", np.ones((50, 32), np.float32))
    _write_splits(tmp_path / "sp", ".npz", b"")
    _write_splits(tmp_path / "sp-pkl", ".pkl", b"garbage\n")
    for name, make in files.items():
        (tmp_path / name).write_bytes(make(tmp_path))
    before = _snapshot(tmp_path)
    assert main(["train", *flags, "--output-dir", "runs", "--name", "x", *FILES]) == 2
    assert expected in one_error_line(capsys.readouterr().err)
    assert _snapshot(tmp_path) == before and not (tmp_path / "runs").exists()


def test_hash_train_damaged_file_traceback_only_with_verbose(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "image.npy").write_bytes(b"")
    np.save("text.npy", np.ones((50, 32), np.float32))
    argv = ["hash", "train", "--data", "pairs", "--image", "image.npy", "--text", "text.npy", *FILES]
    assert patchword_main([*argv, "-v"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith(
        "image.npy: not a readable .npy file: the file is empty"
    )


def test_every_truncation_of_a_split_file_is_a_data_error_naming_it(tmp_path):
    """numpy, zipfile and pickle raise EOFError, BadZipFile, ValueError, UnpicklingError... on a file cut
    short; the readers turn each into a DataError naming the file."""
    good = tmp_path / "good.npz"
    np.savez_compressed(good, **_split_fields())
    data = good.read_bytes()
    pickled = pickle.dumps(_split_fields())
    mat = tmp_path / "good.mat"
    scipy.io.savemat(mat, {"IAll": np.ones((20, 4)), "YAll": np.ones((20, 5))})
    for raw, name, read in [
        (data, "cut.npz", readers.load_split),
        (pickled, "cut.pkl", readers.load_split),
        (_npy_bytes(np.ones((20, 4)), tmp_path), "cut.npy", lambda p: readers.read_npy(p)),
        (mat.read_bytes(), "cut.mat", readers.load_mat),
    ]:
        path = tmp_path / name
        for size in range(0, len(raw), max(1, len(raw) // 40)):
            path.write_bytes(raw[:size])
            with pytest.raises(DataError, match=f"^{re.escape(str(path))}: "):
                read(path)


def test_hash_search_bad_query_is_refused_before_the_index_is_cached(run, tmp_path, capsys):
    """The database index (index_text.npz) was built and cached before the query file was read."""
    data = _npy_bytes(np.ones((3, 32), np.float32), tmp_path)
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "trunc.npy").write_bytes(data[:100])
    np.save(tmp_path / "dim.npy", np.ones((3, 7), np.float32))
    np.save(tmp_path / "words.npy", np.array([["a", "b"]]))
    cases = [
        (["--query", str(tmp_path / "empty.npy")], "empty.npy: not a readable .npy file: the file is empty"),
        (["--query", str(tmp_path / "trunc.npy")], "trunc.npy: not a readable .npy file (damaged, truncated"),
        (
            ["--query", str(tmp_path / "dim.npy")],
            "dim.npy: expected (N, 32) image features, got shape (3, 7)",
        ),
        (["--query", str(tmp_path / "words.npy")], "words.npy: expected (N, d) numeric query features"),
        (["--query-index", "999"], "--query-index: [999] out of range for the 16 query pairs"),
        (["--query-index", "0", "--k", "0"], "--k: must be >= 1 (neighbours per query), got 0"),
    ]
    for cached in run.glob("index_*.npz"):
        cached.unlink()
    before = _snapshot(run)
    for argv, expected in cases:
        assert main(["search", str(run), "--modality", "image", *argv]) == 2, argv
        assert expected in one_error_line(capsys.readouterr().err), argv
        assert _snapshot(run) == before, argv


def test_hash_search_out_names_a_force_flag_that_exists(run, tmp_path, capsys):
    """`hash search --out FILE` said "pass --force" but had no --force."""
    out = tmp_path / "res.json"
    out.write_text("{}")
    argv = [
        "search",
        str(run),
        "--modality",
        "text",
        "--query-index",
        "0",
        "1",
        "--k",
        "3",
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    assert "res.json exists; pass --force to overwrite it" in one_error_line(capsys.readouterr().err)
    assert out.read_text() == "{}"
    assert main([*argv, "--force"]) == 0
    results = json.loads(out.read_text())
    assert results["database"] == "retrieval.image" and [len(r["indices"]) for r in results["results"]] == [
        3,
        3,
    ]


def test_hash_search_damaged_cached_index_says_rebuild(run, tmp_path, capsys):
    index = run / "index_text.npz"
    argv = ["search", str(run), "--modality", "image", "--query-index", "2", "--k", "2"]
    assert main([*argv, "--rebuild"]) == 0
    expected = json.loads(capsys.readouterr().out)
    good = index.read_bytes()
    index.write_bytes(good[: len(good) // 2])
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {index}: cached index unreadable")
    assert main([*argv, "--rebuild"]) == 0
    assert json.loads(capsys.readouterr().out) == expected and index.read_bytes() == good


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.bits=32", "model.bits"),
        ("model.hidden=64", "model.hidden"),
        ("train.lr_heads=0.5", "train.lr_heads"),  # was silently without effect
    ],
)
def test_hash_eval_refuses_overrides_that_change_the_trained_model(run, capsys, override, key):
    """`hash eval RUN model.bits=16` ended in a RuntimeError (size mismatch) traceback."""
    assert main(["eval", str(run), override]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}: cannot change on a trained run")


def test_hash_eval_data_that_does_not_fit_the_weights_names_the_data(run, tmp_path, capsys):
    """Data may be overridden (an imported checkpoint has none of its own), but features of another size
    ended in a RuntimeError (size mismatch) traceback."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "image.npy", rng.standard_normal((40, 16)).astype(np.float32))
    np.save(tmp_path / "text.npy", rng.standard_normal((40, 32)).astype(np.float32))
    other = [
        "data.format=pairs",
        f"data.image={tmp_path / 'image.npy'}",
        f"data.text={tmp_path / 'text.npy'}",
    ]
    # other data than the run's: their split keys are the user's to choose
    assert main(["eval", str(run), *other, "data.num_query=8"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: data: the weights in {run / 'last.pt'} do not fit the model these data build"
    )
    assert "(image 16-d, text 32-d)" in line


def test_hash_eval_takes_evaluation_and_data_overrides(run, capsys):
    # the run's own data.num_query (16): no re-split, accepted
    assert main(["eval", str(run), "eval.topk=5", "eval.ks=[2]", "data.num_query=16"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert {"i2t_map@5", "t2i_map@5", "i2t_p@2"} <= set(metrics) and "i2t_map@50" not in metrics


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("nodir/x.png", "error: --pr-plot: directory {tmp}/nodir does not exist"),
        ("x.foo", "error: --pr-plot: x.foo: the suffix picks the image format, one of"),
        (".", "error: --pr-plot: . is a directory: --pr-plot names the file to write"),
    ],
)
def test_hash_eval_pr_plot_location_is_checked_before_the_evaluation(
    run, tmp_path, capsys, monkeypatch, target, expected
):
    """`--pr-plot nodir/x.png` ran the whole evaluation, then failed with [Errno 2] naming no flag."""
    import patchword.hashing.runner as runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "open_hashing_run", lambda *a, **k: pytest.fail("the run was loaded"))
    assert main(["eval", str(run), "--pr-plot", target]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(expected.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_hash_eval_pr_plot_format_follows_the_suffix(run, tmp_path, capsys):
    assert main(["eval", str(run), "--pr-plot", str(tmp_path / "pr.svg")]) == 0
    assert b"<svg" in (tmp_path / "pr.svg").read_bytes()[:400]
    assert [p.name for p in tmp_path.iterdir()] == ["pr.svg"]  # no temporary file left behind


def test_hash_search_rebuilds_an_index_cached_before_the_run_was_trained_on(run, tmp_path, capsys):
    """The cached ``index_*.npz`` held the codes of the weights it was built with; a run resumed and
    trained on since kept answering with the old codes unless --rebuild was given."""
    import os
    import shutil

    copy = tmp_path / "r"
    shutil.copytree(run, copy)
    (copy / "index_text.npz").unlink(missing_ok=True)
    argv = ["search", str(copy), "--modality", "image", "--query-index", "0", "1", "2", "--k", "5"]
    assert main(argv) == 0
    capsys.readouterr()
    old_codes = (copy / "index_text.npz").read_bytes()
    # "trained on": other weights in last.pt, written after the index (negated weights flip every code)
    state = torch.load(copy / "last.pt", map_location="cpu", weights_only=False)
    state["model"] = {k: -v if v.is_floating_point() else v for k, v in state["model"].items()}
    torch.save(state, copy / "last.pt")
    later = (copy / "index_text.npz").stat().st_mtime + 10
    os.utime(copy / "last.pt", (later, later))
    assert main(argv) == 0
    cached = json.loads(capsys.readouterr().out)
    new_codes = (copy / "index_text.npz").read_bytes()
    assert new_codes != old_codes
    assert main([*argv, "--rebuild"]) == 0
    assert (
        json.loads(capsys.readouterr().out) == cached and (copy / "index_text.npz").read_bytes() == new_codes
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("eval.topk=0", "eval.topk"),  # ran and reported map@0 = 0.0
        ("model.dropout=1.5", "model.dropout"),  # torch's own message, naming no key
        ("model.head_dropout=-0.1", "model.head_dropout"),
        ("train.betas=[2.0,0.9]", "train.betas[0]"),
        ("train.temperature=0", "train.temperature"),
    ],
)
def test_hash_train_values_out_of_range_name_their_key_before_anything_is_written(
    tmp_path, capsys, override, key
):
    out = tmp_path / "runs"
    argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", "r", *TINY_HASH]
    assert main([*argv, override]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {key}:")
    assert not out.exists()
