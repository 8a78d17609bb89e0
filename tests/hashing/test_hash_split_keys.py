"""The keys that split one set of pairs (``data.num_query``, ``data.num_train``, ``data.split_seed``) given
for pre-split files (a ``splits`` directory, a pre-split ``.mat``), which decide the splits and ignored them:
refused in one line naming the key, before anything is written. Their defaults are not zero, so the command
line tells a given key by the overrides that set it; code, by a value other than the default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import one_error_line
from patchword.cli.hash import main

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ["--bits", "16", "--epochs", "1", "model.hidden=32", "model.dim_feedforward=32", "model.num_layers=1"]
MODEL += ["train.batch_size=16", "eval.ks=[1,5]"]


def _arrays(rows: int, rng) -> dict[str, np.ndarray]:
    return {
        "image": rng.standard_normal((rows, 16)).astype(np.float32),
        "text": rng.standard_normal((rows, 16)).astype(np.float32),
        "label": (rng.random((rows, 3)) < 0.5).astype(np.uint8),
    }


def _write_splits(root: Path) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir()
    for name, rows in (("train", 40), ("query", 8), ("retrieval", 30)):
        np.savez(root / f"{name}.npz", **_arrays(rows, rng))
    return root


def _refusal(key: str, fmt: str, root: Path) -> str:
    return (
        f"{key}: data.format={fmt} reads pre-split files ({root}: train / query / retrieval): the pre-split "
        f"files decide the splits, so {key} would be ignored; drop it"
    )


@pytest.mark.parametrize(
    "override", ["data.num_query=500", "data.num_train=2000", "data.split_seed=0", "data.num_query=4"]
)
def test_hash_train_refuses_a_split_key_for_a_split_directory(tmp_path, capsys, override):
    """Even at its default value (500, 2000, 0): the override says the user meant it."""
    root, out = _write_splits(tmp_path / "sp"), tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), "--name", "r", "--data", "splits", "--root", str(root)]
    assert main([*argv, override]) == 2
    key = override.split("=", 1)[0]
    assert one_error_line(capsys.readouterr().err) == f"error: {_refusal(key, 'splits', root)}"
    assert not out.exists()
    assert main(argv) == 0  # without it the run trains on the files' own splits


def test_hash_train_refuses_a_split_key_for_a_pre_split_mat_but_splits_a_whole_set_one(tmp_path, capsys):
    scipy_io = pytest.importorskip("scipy.io")
    rng = np.random.default_rng(0)
    parts = {s: _arrays(rows, rng) for s, rows in (("tr", 40), ("te", 8), ("db", 30))}
    pre = tmp_path / "pre.mat"
    scipy_io.savemat(
        pre, {f"{m}_{s}": parts[s][k] for s in parts for m, k in zip("ITL", parts[s], strict=True)}
    )
    whole = tmp_path / "whole.mat"
    scipy_io.savemat(whole, {"IAll": parts["db"]["image"], "YAll": parts["db"]["text"]})
    out = tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), "--data", "mat", "data.split_seed=3"]
    assert main([*argv, "--name", "pre", "--root", str(pre)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {_refusal('data.split_seed', 'mat', pre)}"
    assert not out.exists()
    # one set of pairs: the keys split it
    assert (
        main([*argv, "--name", "whole", "--root", str(whole), "data.num_query=6", "data.num_train=20"]) == 0
    )


def test_train_hashing_from_code_refuses_a_split_key_changed_for_pre_split_files(tmp_path):
    """As the data keys a format does not read (check_data_source): code refuses a value it can tell was
    set, here one other than the default; ``given_keys`` names keys set at their default value."""
    from patchword.config import apply_overrides
    from patchword.errors import ConfigError
    from patchword.hashing.config import HashRunConfig
    from patchword.hashing.runner import train_hashing

    root, out = _write_splits(tmp_path / "sp"), tmp_path / "runs"
    model = [o for o in MODEL if "=" in o] + ["model.bits=16", "train.epochs=1"]
    base = [*model, f"output_dir={out}", "name=r", "data.format=splits", f"data.root={root}"]
    with pytest.raises(ConfigError) as err:
        train_hashing(apply_overrides(HashRunConfig(), [*base, "data.num_train=20"]))
    assert str(err.value) == _refusal("data.num_train", "splits", root)
    cfg = apply_overrides(HashRunConfig(), base)
    with pytest.raises(ConfigError, match=r"^data\.split_seed: data\.format=splits reads pre-split files"):
        train_hashing(cfg, given_keys={"data.split_seed"})
    assert not out.exists()
    assert train_hashing(cfg)["data"]["train"] == 40


def test_hash_eval_refuses_a_split_key_override_of_a_pre_split_run(tmp_path, capsys):
    root, out = _write_splits(tmp_path / "sp"), tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), "--name", "r", "--data", "splits", "--root", str(root)]
    assert main(argv) == 0
    report = tmp_path / "e.json"
    assert main(["eval", str(out / "r"), "--out", str(report), "data.num_query=4"]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {_refusal('data.num_query', 'splits', root)}"
    assert not report.exists()
    assert main(["eval", str(out / "r"), "--out", str(report)]) == 0
