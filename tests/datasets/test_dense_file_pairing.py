"""How a dense-caption file meets a split, from a researcher's dense captions for their own images: a
dense file named for a dataset that reads none is refused; lines without image ids are paired by order,
and said so; an empty text says what to do; with ``data.skip_bad_images`` a file that lacks exactly the
unusable images' lines (``densify --skip-bad-images`` leaves them out) is accepted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, laps_args, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.data.config import DataConfig
from patchword.data.prepare import load_raw_data
from patchword.errors import ConfigError, DataError
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SEPS = ("model.matcher=seps", "data.max_dense_len=64")  # a model that reads dense text


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.6)])


def _dense_with_ids(path: Path, ids: list[str]) -> Path:
    """A dense file as densify writes it: one line per image id, each recording it."""
    lines = [json.dumps({"text": f"a photo {i}", "model_id": "m", "metadata": {"image_id": i}}) for i in ids]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _cfg(laps_dataset, *extra: str):
    return apply_overrides(RunConfig(), laps_args(laps_dataset, *extra))


def _rows(out: str) -> dict[str, list[str]]:
    return {
        line.split()[0]: re.split(r"\s{2,}", line.strip())
        for line in out.splitlines()
        if line[:5] in ("train", "test ")
    }


# ------------------------------------------------------------------ 1. data.dense_* read by nothing


def test_a_dense_file_for_the_synthetic_scenes_is_refused_before_a_run_is_written(tmp_path, capsys):
    """Old code: trained on the scenes' own dense text and recorded data.dense_test in the run's config."""
    runs = tmp_path / "runs"
    args = [*TINY_RUN_32, "train.max_steps=1", f"output_dir={runs}", "name=r", "data.dense_test=mine.jsonl"]
    assert main(["train", *args]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: data.dense_test: applies to image-file datasets (laps, karpathy); synthetic brings its own "
        "dense text"
    )
    assert not (runs / "r").exists()


@pytest.mark.parametrize("dataset", ["precomp", "synthetic_regions"])
def test_a_dense_file_for_region_features_is_refused(dataset, tmp_path):
    dc = DataConfig(dataset=dataset, root=str(tmp_path), dense_train="t.jsonl", dense_test="t.jsonl")
    with pytest.raises(
        ConfigError, match=rf"^data\.dense_train: .*; {dataset} has region features, no dense"
    ):
        load_raw_data(dc, ["test"])


# ------------------------------------------------------------------ 2. lines that record no image


def test_lines_without_ids_are_paired_by_order_and_said_so(laps_dataset, caplog, capsys):
    """The SEPS release's lines record no image: they pair with any split of their size. Old code: silent."""
    dense = laps_dataset["dense_test"]
    cfg = _cfg(
        laps_dataset, *SEPS, f"data.dense_train={laps_dataset['dense_train']}", f"data.dense_test={dense}"
    )
    load_raw_data(cfg.data, ["test"], use_dense=True)
    warned = [r.getMessage() for r in caplog.records if "by order" in r.getMessage()]
    assert warned == [
        f"{dense}: its lines record no image id (metadata.image_id or metadata.file), so line k is paired "
        "with image k of the split by order alone (as the SEPS release is read): check that the file was "
        "made for this split, in its image order"
    ]
    args = laps_args(
        laps_dataset, *SEPS, f"data.dense_train={laps_dataset['dense_train']}", f"data.dense_test={dense}"
    )
    assert main(["data", "check", "--split", "train", "--split", "test", *args]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["train"][5] == "8/8 (by order)" and rows["test"][5] == "4/4 (by order)"


def test_lines_with_ids_are_checked_not_said_to_be_paired_by_order(laps_dataset, tmp_path, caplog, capsys):
    dense = _dense_with_ids(tmp_path / "test.jsonl", [f"test{i}" for i in range(4)])
    args = laps_args(
        laps_dataset, *SEPS, f"data.dense_train={laps_dataset['dense_train']}", f"data.dense_test={dense}"
    )
    assert main(["data", "check", "--split", "test", *args]) == 0
    assert _rows(capsys.readouterr().out)["test"][5] == "4/4"
    assert f"{dense}: its lines" not in caplog.text


# ------------------------------------------------------------------ 3. an empty text


def test_an_empty_dense_text_says_what_to_do(laps_dataset, tmp_path):
    """Old code: `expected an object with a non-empty string field 'text'` (the text was there, empty)."""
    dense = _dense_with_ids(tmp_path / "test.jsonl", [f"test{i}" for i in range(4)])
    lines = dense.read_text().splitlines()
    lines[1] = json.dumps({"text": " ", "model_id": "m", "metadata": {"image_id": "test1"}})
    dense.write_text("\n".join(lines) + "\n")
    cfg = _cfg(laps_dataset, *SEPS, f"data.dense_test={dense}")
    with pytest.raises(ValueError) as err:
        load_raw_data(cfg.data, ["test"], use_dense=True)
    assert str(err.value) == (
        f"{dense}:2: 'text' is empty (image 'test1'): every image needs a dense caption; write one into the "
        "line, or describe the images again into a new file with other settings (patchword densify --prompt, "
        "--sample or another model; it leaves out an empty description)"
    )


# ------------------------------------------------------------------ 4. data.skip_bad_images and missing lines

TRAIN_IDS = [f"train{i}" for i in range(8)]


def test_skip_bad_images_accepts_a_file_without_exactly_the_unusable_images_lines(laps_dataset, tmp_path):
    """Old code: `7 dense captions for a split of 8 images`, read before the unusable image was left out."""
    dense = _dense_with_ids(tmp_path / "train.jsonl", [i for i in TRAIN_IDS if i != "train2"])
    _truncate(laps_dataset["image_root"] / "train2.png")
    cfg = _cfg(laps_dataset, *SEPS, f"data.dense_train={dense}", "data.skip_bad_images=true")
    split = load_raw_data(cfg.data, ["train"], use_dense=True).splits["train"]
    kept = [i for i in TRAIN_IDS if i != "train2"]
    assert split.image_ids == kept and split.dense_captions == [f"a photo {i}" for i in kept]
    assert split.dense_origin.places.tolist() == [1, 2, 3, 4, 5, 6, 7] and split.num_captions == 14
    strict = _cfg(laps_dataset, *SEPS, f"data.dense_train={dense}")  # without skip: refused, with the way
    with pytest.raises(
        ValueError, match=r"7 dense captions .* are accepted with data\.skip_bad_images=true\)$"
    ):
        load_raw_data(strict.data, ["train"], use_dense=True)


def test_a_missing_line_of_an_image_that_decodes_is_still_refused(laps_dataset, tmp_path):
    dense = _dense_with_ids(tmp_path / "train.jsonl", [i for i in TRAIN_IDS if i not in ("train2", "train5")])
    _truncate(laps_dataset["image_root"] / "train2.png")
    cfg = _cfg(laps_dataset, *SEPS, f"data.dense_train={dense}", "data.skip_bad_images=true")
    with pytest.raises(DataError) as err:
        load_raw_data(cfg.data, ["train"], use_dense=True)
    image = laps_dataset["image_root"] / "train5.png"
    assert str(err.value) == (
        f"{dense}: no line for 1 image(s) of the train split that decode, e.g. 'train5' ({image}); "
        "data.skip_bad_images leaves out only the unusable images: rerun `patchword densify` on the file to "
        "describe them (it fills in the images it lacks)"
    )


def test_lines_without_ids_cannot_skip_an_image(laps_dataset, tmp_path):
    lines = laps_dataset["dense_train"].read_text().splitlines()
    dense = tmp_path / "train.jsonl"
    dense.write_text("\n".join(lines[:2] + lines[3:]) + "\n")  # train2's line gone, nothing says which
    _truncate(laps_dataset["image_root"] / "train2.png")
    cfg = _cfg(laps_dataset, *SEPS, f"data.dense_train={dense}", "data.skip_bad_images=true")
    with pytest.raises(ValueError, match=r"7 dense captions for a split of 8 images; .*only when every line"):
        load_raw_data(cfg.data, ["train"], use_dense=True)


def test_data_check_and_train_accept_the_file_densify_skip_bad_images_writes(laps_dataset, tmp_path, capsys):
    dense = _dense_with_ids(tmp_path / "train.jsonl", [i for i in TRAIN_IDS if i != "train2"])
    _truncate(laps_dataset["image_root"] / "train2.png")
    extra = [*SEPS, f"data.dense_train={dense}", f"data.dense_test={laps_dataset['dense_test']}"]
    args = laps_args(laps_dataset, *extra, "data.skip_bad_images=true")
    assert main(["data", "check", "--split", "train", *args]) == 2  # the unusable image is still listed
    out = capsys.readouterr().out
    assert _rows(out)["train"][5:] == ["7/8", "1"] and "error" not in out
    assert out.strip().endswith("(data.skip_bad_images=true: train and eval leave the unusable images out)")
    runs = tmp_path / "runs"
    assert main(["train", *args, "data.dev_from_train=2", f"output_dir={runs}", "name=r"]) == 0
    _dense_with_ids(dense, [i for i in TRAIN_IDS if i not in ("train2", "train5")])
    assert main(["data", "check", "--split", "train", *args]) == 2
    assert "no line for 1 image(s) of the train split that decode, e.g. 'train5'" in capsys.readouterr().out
