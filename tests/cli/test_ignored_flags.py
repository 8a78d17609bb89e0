"""Flags and overrides a command would have ignored while the user believed they took effect: each is
refused in one line naming it (exit 2, nothing written); and a dense caption without words, met while an
index is built, names its file, line and image."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from conftest import one_error_line
from densify_support import RUN, write_images
from patchword.cli import main

# --------------------------------------------------------------------------------------------------------
# patchword eval RUN key=value: keys no evaluation reads
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("train.max_steps=5", "it changes training"),
        ("train.lr=0.1", "it changes training"),
        ("seed=3", "it seeds training"),
        ("output_dir=elsewhere", "it places a new run; an evaluation reads the run directory it is given"),
        (
            "model.tiny_pretrained=synthetic-64",
            "it initialises training; the weights come from the checkpoint",
        ),
        ("data.num_workers=0", "it sets the workers decoding training batches"),
        ("data.vocab_min_count=4", "it sets a training vocabulary; the run's own vocab.json is used"),
    ],
)
@pytest.mark.parametrize("mode", [[], ["--suite", "compositional"]])
def test_eval_refuses_an_override_no_evaluation_reads(
    trained_tiny_run, tmp_path, capsys, override, why, mode
):
    """`patchword eval RUN train.max_steps=5` was accepted and wrote the same numbers as without it."""
    out = tmp_path / "e.json"
    assert main(["eval", str(trained_tiny_run), *mode, "--out", str(out), override]) == 2
    key = override.split("=", 1)[0]
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: {key}: does not apply to an evaluation ({why})"
    assert not out.exists()


def test_eval_keeps_the_overrides_an_evaluation_reads(trained_tiny_run, tmp_path, capsys):
    out = tmp_path / "e.json"
    args = ["eval", str(trained_tiny_run), "--out", str(out), "eval.split=dev", "eval.max_memory_mb=64"]
    assert main([*args, "progress=false", "device=cpu", "data.max_caption_len=40"]) == 0
    assert json.loads(out.read_text())["split"] == "dev"


# --------------------------------------------------------------------------------------------------------
# patchword hash train / eval: a data flag or key the chosen data.format does not read
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--data", "synthetic", "--image", "x.npy"],
            "--image: data.format=synthetic generates its features; --image is read only with --data pairs",
        ),
        (
            ["--labels", "y.npy"],  # the default format: synthetic
            "--labels: data.format=synthetic generates its features; --labels is read only with --data pairs",
        ),
        (
            ["--data", "pairs", "--image", "a.npy", "--text", "b.npy", "--root", "nope"],
            "--root: data.format=pairs reads data.image and data.text (--image, --text); --root is read only "
            "with --data splits or --data mat",
        ),
        (
            ["--data", "splits", "--root", "sp", "--text", "b.npy"],
            "--text: data.format=splits reads the split directory data.root (--root); --text is read only "
            "with --data pairs",
        ),
        (
            ["data.image=x.npy"],  # the same key as an override
            "data.image: data.format=synthetic generates its features; data.image is read only with --data "
            "pairs",
        ),
        (
            ["--root", "feats.mat", "data.format=pairs", "data.image=a.npy", "data.text=b.npy"],
            "--root: data.format=pairs reads data.image and data.text (--image, --text); --root is read only "
            "with --data splits or --data mat",
        ),
    ],
)
def test_hash_train_refuses_a_data_flag_its_format_does_not_read(tmp_path, capsys, flags, expected):
    """`hash train --data synthetic --image x.npy` trained on generated features without a word."""
    out = tmp_path / "runs"
    argv = ["hash", "train", "--epochs", "1", "--output-dir", str(out), "--name", "r", *flags]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {expected}"
    assert not out.exists()


def test_hash_eval_refuses_a_data_override_the_runs_format_does_not_read(hash_run, tmp_path, capsys):
    """`hash eval RUN data.root=DIR` on a synthetic run evaluated the generated features."""
    out = tmp_path / "e.json"
    assert main(["hash", "eval", str(hash_run), "--out", str(out), f"data.root={tmp_path}"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: data.root: data.format=synthetic generates its features; data.root is read only with "
        "data.format=splits or data.format=mat"
    )
    assert not out.exists()
    # a key the run kept is not refused for an override of the format: only what the overrides set is checked
    assert main(["hash", "eval", str(hash_run), "--out", str(out), "data.root="]) == 0


# --------------------------------------------------------------------------------------------------------
# patchword densify: an option of another image source
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "flags", "expected"),
    [
        (
            "images",
            ["--split", "test"],
            "--split: is read only with --data-root or --karpathy; --images does not read it",
        ),
        (
            "images",
            ["--image-root", "x"],
            "--image-root: is read only with --data-root or --karpathy; --images does not",
        ),
        (
            "images",
            ["--synthetic-seed", "3"],
            "--synthetic-seed: is read only with --synthetic; --images does not read it",
        ),
        (
            "synthetic",
            ["--split", "dev"],
            "--split: is read only with --data-root or --karpathy; --synthetic does not read it",
        ),
        (
            "data-root",
            ["--split", "test", "--synthetic-image-size", "32"],
            "--synthetic-image-size: is read only with --synthetic; --data-root does not read it",
        ),
        (
            "data-root",
            ["--split", "test", "--synthetic-num-images", "2"],
            "--synthetic-num-images: is read only with --synthetic; --data-root does not read it",
        ),
    ],
)
def test_densify_refuses_an_option_of_another_image_source(tmp_path, capsys, source, flags, expected):
    """`densify --images DIR --split test` described the whole folder; `--synthetic-seed 3` without
    --synthetic did nothing."""
    images = tmp_path / "imgs"
    write_images(images, ["a.png"])
    given = {"images": ["--images", str(images)], "synthetic": ["--synthetic", "test"]}
    given["data-root"] = ["--data-root", str(tmp_path / "laps")]
    out = tmp_path / "out" / "d.jsonl"
    assert main(["densify", *given[source], *flags, "--out", str(out), *RUN]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {expected}")
    assert not out.parent.exists()


@pytest.mark.parametrize("flags", [["--synthetic-seed", "3"], ["--synthetic-num-images", "4"]])
def test_densify_stats_refuses_synthetic_flags_without_the_split(tmp_path, capsys, flags):
    """`densify stats FILE --synthetic-seed 3` counted against the sidecar's scenes (or none)."""
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"text": "a red circle", "model_id": "m", "metadata": {"image_id": "0"}}) + "\n"
    )
    assert main(["densify", "stats", str(path), *flags]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {flags[0]}: is read only with --synthetic-split (without it, each file's sidecar names its "
        "scenes)"
    )


# --------------------------------------------------------------------------------------------------------
# patchword index build --dense: a dense caption without words
# --------------------------------------------------------------------------------------------------------


def test_index_build_names_the_dense_caption_without_words(trained_tiny_run, tmp_path, capsys):
    """It surfaced as "text 0 is empty (no words)": neither the file nor the image was named."""
    images = tmp_path / "imgs"
    images.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(images / name)
    dense = tmp_path / "dense.jsonl"
    lines = [
        {"text": "a red circle", "metadata": {"file": "a.png"}},
        {"text": "?!", "metadata": {"file": "b.png"}},
    ]
    dense.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["index", "build", str(trained_tiny_run), "--images", str(images), "--out", str(tmp_path / "idx")]
    assert main([*argv, "--dense", str(dense)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {dense}:2: the dense caption of image b.png '?!' has no words: the alnum word split finds "
        "none; reword or remove it"
    )


def test_train_hashing_from_code_refuses_a_data_key_its_format_does_not_read(tmp_path):
    """The command line checked it; the library entry point did not (the key was ignored)."""
    from patchword.config import apply_overrides
    from patchword.errors import ConfigError
    from patchword.hashing.config import HashRunConfig
    from patchword.hashing.runner import train_hashing

    cfg = apply_overrides(HashRunConfig(), [f"output_dir={tmp_path}", "data.image=x.npy"])
    with pytest.raises(ConfigError, match=r"^data.image: "):
        train_hashing(cfg)
    assert list(tmp_path.iterdir()) == []
