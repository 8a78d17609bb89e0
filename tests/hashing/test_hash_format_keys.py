"""Data keys a ``data.format`` would ignore, refused in one line naming the key and why (exit 2, nothing
written), as the split keys are for pre-split files (test_hash_split_keys.py): ``data.split_seed`` for
synthetic data, whose splits are taken in order (no permutation is drawn), and the ``data.synthetic_*`` keys
for data read from files, whose features are their own. The command line tells a given key by the overrides
that set it (a default value too); code, by a value other than the default. A run's own config.yaml, which
holds every key at its value, still trains again with ``--config``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ["--bits", "16", "--epochs", "1", "model.hidden=32", "model.dim_feedforward=32", "model.num_layers=1"]
MODEL += ["train.batch_size=16", "eval.ks=[1,5]"]

READS = {
    "pairs": "reads data.image and data.text (--image, --text)",
    "splits": "reads the split directory data.root (--root)",
    "mat": "reads the .mat file data.root (--root)",
}
SPLIT_SEED = (
    "data.split_seed: data.format=synthetic takes its splits in order from the generated pairs "
    "(data.synthetic_seed seeds them): no split is drawn, so data.split_seed would be ignored; drop it"
)


def _synthetic_refusal(key: str, fmt: str) -> str:
    return (
        f"{key}: data.format={fmt} {READS[fmt]}: the data.synthetic_* keys shape generated features only "
        f"(data.format=synthetic), so {key} would be ignored; drop it"
    )


def _arrays(rows: int, rng) -> dict[str, np.ndarray]:
    return {
        "image": rng.standard_normal((rows, 16)).astype(np.float32),
        "text": rng.standard_normal((rows, 16)).astype(np.float32),
        "label": (rng.random((rows, 3)) < 0.5).astype(np.uint8),
    }


def _data_flags(fmt: str, tmp_path: Path) -> list[str]:
    """Files of ``fmt`` under ``tmp_path`` (16-d features, labelled) and the flags that read them."""
    rng = np.random.default_rng(0)
    if fmt == "pairs":
        arrays = _arrays(60, rng)
        for name in ("image", "text"):
            np.save(tmp_path / f"{name}.npy", arrays[name])
        flags = ["--image", str(tmp_path / "image.npy"), "--text", str(tmp_path / "text.npy")]
        return ["--data", "pairs", *flags, "data.num_query=8", "data.num_train=40"]
    if fmt == "splits":
        root = tmp_path / "sp"
        root.mkdir()
        for name, rows in (("train", 40), ("query", 8), ("retrieval", 30)):
            np.savez(root / f"{name}.npz", **_arrays(rows, rng))
        return ["--data", "splits", "--root", str(root)]
    scipy_io = pytest.importorskip("scipy.io")
    arrays = _arrays(60, rng)
    scipy_io.savemat(tmp_path / "whole.mat", {"IAll": arrays["image"], "YAll": arrays["text"]})
    return ["--data", "mat", "--root", str(tmp_path / "whole.mat"), "data.num_query=8", "data.num_train=20"]


@pytest.mark.parametrize("override", ["data.split_seed=0", "data.split_seed=7"])
def test_hash_train_refuses_a_split_seed_for_synthetic_data(tmp_path, capsys, override):
    """Even at its default value: synthetic pairs are split in order, whatever the seed (it was accepted and
    the run was the same as without it)."""
    out = tmp_path / "runs"
    argv = ["train", "--bits", "16", "--epochs", "1", "--output-dir", str(out), "--name", "r", *TINY_HASH]
    assert main([*argv, override]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {SPLIT_SEED}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("fmt", "override"),
    [
        ("pairs", "data.synthetic_seed=0"),
        ("pairs", "data.synthetic_image_dim=32"),
        ("splits", "data.synthetic_num_retrieval=4000"),
        ("splits", "data.synthetic_text_dim=8"),
        ("mat", "data.synthetic_seed=3"),
    ],
)
def test_hash_train_refuses_a_synthetic_key_for_data_read_from_files(tmp_path, capsys, fmt, override):
    """The file's features were trained on and the key ignored, at its default value or another."""
    out = tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), "--name", "r", *_data_flags(fmt, tmp_path)]
    assert main([*argv, override]) == 2
    key = override.split("=", 1)[0]
    assert one_error_line(capsys.readouterr().err) == f"error: {_synthetic_refusal(key, fmt)}"
    assert not out.exists()
    assert main(argv) == 0  # without it the run trains on the files


def test_train_hashing_from_code_refuses_a_key_its_format_ignores(tmp_path):
    """As the split keys: code refuses a value other than the default; ``given_keys`` names keys set at
    their default value."""
    from patchword.config import apply_overrides
    from patchword.errors import ConfigError
    from patchword.hashing.config import HashRunConfig
    from patchword.hashing.runner import train_hashing

    out = tmp_path / "runs"
    base = [*TINY_HASH, "model.bits=16", "train.epochs=1", f"output_dir={out}", "name=r"]
    with pytest.raises(ConfigError) as err:
        train_hashing(apply_overrides(HashRunConfig(), [*base, "data.split_seed=7"]))
    assert str(err.value) == SPLIT_SEED
    with pytest.raises(ConfigError) as err:
        train_hashing(apply_overrides(HashRunConfig(), base), given_keys={"data.split_seed"})
    assert str(err.value) == SPLIT_SEED
    pairs = [o for o in base if not o.startswith("data.synthetic_")]
    image, text = tmp_path / "image.npy", tmp_path / "text.npy"
    pairs += ["data.format=pairs", f"data.image={image}", f"data.text={text}"]
    with pytest.raises(ConfigError) as err:
        train_hashing(apply_overrides(HashRunConfig(), [*pairs, "data.synthetic_text_dim=32"]))
    assert str(err.value) == _synthetic_refusal("data.synthetic_text_dim", "pairs")
    with pytest.raises(ConfigError) as err:
        train_hashing(apply_overrides(HashRunConfig(), pairs), given_keys={"data.synthetic_seed"})
    assert str(err.value) == _synthetic_refusal("data.synthetic_seed", "pairs")
    assert not out.exists()


def test_hash_eval_refuses_a_key_the_runs_format_ignores(hash_run, tmp_path, capsys):
    """``hash eval`` overrides data keys (other data for the trained weights): one the format ignores was
    accepted and the numbers were those of the run's own data."""
    report = tmp_path / "e.json"
    assert main(["eval", str(hash_run), "--out", str(report), "data.split_seed=3"]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {SPLIT_SEED}"
    out = tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), "--name", "sp", *_data_flags("splits", tmp_path)]
    assert main(argv) == 0
    assert main(["eval", str(out / "sp"), "--out", str(report), "data.synthetic_seed=1"]) == 2
    expected = _synthetic_refusal("data.synthetic_seed", "splits")
    assert one_error_line(capsys.readouterr().err) == f"error: {expected}"
    assert not report.exists()
    # the synthetic run's own data keys would evaluate another generated set: refused (test_hash_eval_data)
    assert main(["eval", str(hash_run), "--out", str(report), "data.synthetic_seed=1"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        "error: data.synthetic_seed: cannot change on hash eval of a trained run (0 -> 1)"
    )
    assert not report.exists()


def test_a_runs_own_config_yaml_trains_again_with_config(tmp_path, capsys):
    """config.yaml holds every key, the split and synthetic ones at their defaults for pre-split files: a key
    a --config file holds is not taken for one the user gave (it would refuse every saved config)."""
    out = tmp_path / "runs"
    argv = ["train", *MODEL, "--output-dir", str(out), *_data_flags("splits", tmp_path)]
    assert main([*argv, "--name", "a"]) == 0
    capsys.readouterr()
    assert main(["train", "--config", str(out / "a" / "config.yaml"), "--name", "b"]) == 0
    assert (out / "b" / "config.yaml").read_text() == (out / "a" / "config.yaml").read_text().replace(
        "name: a", "name: b"
    )
