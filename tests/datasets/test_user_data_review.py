"""Bringing one's own data: splits that share images, missing image files, ``~`` in data paths, a LAPS
layout without id mapping, SCAN rows per caption with ids per image, unknown Karpathy split names, empty
captions files, ``data.captions_per_image`` on a dataset that ignores it, and a directory listed as an
image. Each is one line naming the file, line or key (exit code 2 at the CLI), before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import laps_args, one_error_line, write_laps_dataset
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.data.config import DataConfig
from patchword.data.images import find_bad_images, image_problem, load_image
from patchword.data.laps import load_laps_split
from patchword.data.precomp import load_precomp_split, write_precomp_split
from patchword.data.prepare import load_raw_data
from patchword.data.textfiles import captions_per_image_mismatch
from patchword.errors import ConfigError, DataError
from patchword.runs.checks import check_region_boxes
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _laps(paths: dict[str, Path], **changes) -> DataConfig:
    return DataConfig(
        dataset="laps", root=str(paths["root"]), image_root=str(paths["image_root"]), dense=False, **changes
    )


def _set_lines(path: Path, replace: dict[int, str]) -> None:
    """Replace lines (0-based) of a one-item-per-line file."""
    lines = path.read_text().splitlines()
    for index, text in replace.items():
        lines[index] = text
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------- 1. splits sharing images


def test_a_test_split_holding_a_training_image_is_refused_naming_both_files(laps_dataset):
    root = laps_dataset["root"]
    _set_lines(root / "test_ids.txt", {2: "train3", 3: "train3"})  # test image 1 is train image 3
    with pytest.raises(DataError) as err:
        load_raw_data(_laps(laps_dataset), ["train", "dev", "test"])
    assert str(err.value).startswith(
        f"{root / 'test_ids.txt'}:3: image id 'train3' of the test split is also image 3 of the train split "
        f"({root / 'train_ids.txt'}:7): a test split sharing images with the train split is not held out"
    )
    assert "set data.test_split=train to score the training split on purpose" in str(err.value)
    # one role alone (patchword eval) is compared with the ids and files of the splits it is held out from
    with pytest.raises(DataError) as alone:
        load_raw_data(_laps(laps_dataset), ["test"])
    assert str(alone.value) == str(err.value)


def test_one_file_under_two_ids_is_the_same_image(laps_dataset):
    root = laps_dataset["root"]
    mapping = json.loads((root / "id_mapping.json").read_text())
    mapping["dev1"] = mapping["train0"]
    (root / "id_mapping.json").write_text(json.dumps(mapping))
    with pytest.raises(
        DataError, match=r"dev_ids.txt:3: image file '.*train0.png' of the dev split is also "
    ):
        load_raw_data(_laps(laps_dataset), ["train", "dev"])
    with pytest.raises(DataError, match="validate on training images held out with data.dev_from_train=N"):
        load_raw_data(_laps(laps_dataset), ["train", "dev"])


def test_dev_and_test_reading_different_files_must_not_share_images(laps_dataset):
    root = laps_dataset["root"]
    _set_lines(root / "test_ids.txt", {0: "dev2", 1: "dev2"})
    with pytest.raises(
        DataError,
        match=r"test_ids.txt:1: image id 'dev2' of the test split is also image 2 of the dev "
        r"split \(.*dev_ids.txt:5\).*set data.test_split=dev to score the split the checkpoint",
    ):
        load_raw_data(_laps(laps_dataset), ["dev", "test"])


def test_reusing_a_split_on_purpose_is_not_refused(laps_dataset):
    """Naming the same split (recorded as split_use "training" / "model selection" and warned of) and the
    dev split held out of training (disjoint by construction) are no accident."""
    for changes in (
        {"test_split": "train"},
        {"test_split": "dev"},
        {"dev_split": "train"},
        {"dev_from_train": 2},
    ):
        raw = load_raw_data(_laps(laps_dataset, **changes), ["train", "dev", "test"])
        assert set(raw.splits) == {"train", "dev", "test"}


def test_train_and_data_check_refuse_shared_images_before_writing(laps_dataset, tmp_path, capsys):
    root, runs = laps_dataset["root"], tmp_path / "runs"
    _set_lines(root / "test_ids.txt", {0: "train0", 1: "train0"})
    assert main(["train", *laps_args(laps_dataset, f"output_dir={runs}", "name=r")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: {root / 'test_ids.txt'}:1: image id 'train0' of the test split is also image 0"
    )
    assert not runs.exists()
    assert main(["data", "check", *laps_args(laps_dataset)]) == 2
    out = capsys.readouterr().out
    # the test split, read alone as data check reads each split, is refused like eval's
    test_row = next(line for line in out.splitlines() if line.startswith("test "))
    assert test_row.split(None, 1)[1].startswith(
        f"error: {root / 'test_ids.txt'}:1: image id 'train0' of the test split"
    )
    assert out.strip().splitlines()[-1] == "1 split(s) with problems"


def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)


def _karpathy(tmp_path: Path, entries: list[tuple[str, int, str]]) -> tuple[Path, Path]:
    images = tmp_path / "kimages"
    data = {"images": []}
    for split, imgid, filename in entries:
        _png(images / filename)
        sentences = [{"raw": f"a picture {imgid} number {k}"} for k in range(2)]
        data["images"].append({"split": split, "imgid": imgid, "filename": filename, "sentences": sentences})
    path = tmp_path / "dataset_k.json"
    path.write_text(json.dumps(data))
    return path, images


def test_karpathy_splits_sharing_a_file_are_refused_but_dev_is_val(tmp_path):
    entries = [("train", 0, "0.png"), ("train", 1, "1.png"), ("val", 2, "2.png"), ("test", 3, "3.png")]
    path, images = _karpathy(tmp_path, [*entries, ("test", 7, "1.png")])
    dc = DataConfig(dataset="karpathy", root=str(path), image_root=str(images), dense=False)
    with pytest.raises(DataError) as err:
        load_raw_data(dc, ["train", "dev", "test"])
    assert str(err.value).startswith(
        f"{path}: images[4]: image file '{images / '1.png'}' of the test split is also image 1 of the train "
        f"split ({path}: images[1])"
    )
    path, images = _karpathy(tmp_path, entries)
    same = DataConfig(
        dataset="karpathy", root=str(path), image_root=str(images), dense=False, test_split="val"
    )
    assert load_raw_data(same, ["train", "dev", "test"]).splits["test"].image_ids == ["2"]  # dev reads val


def test_precomp_splits_sharing_ids_are_refused_only_with_ids_files(tmp_path):
    feats = np.random.default_rng(0).random((2, 3, 8), dtype=np.float32)
    caps = [f"caption {k} of image {i}" for i in range(2) for k in range(5)]
    for split in ("train", "test"):
        write_precomp_split(tmp_path, split, feats, caps)
    dc = DataConfig(dataset="precomp", root=str(tmp_path))
    assert len(load_raw_data(dc, ["train", "test"]).splits) == 2  # rows are positions: nothing to compare
    write_precomp_split(tmp_path, "test", feats, caps, image_ids=["0", "1"])
    assert len(load_raw_data(dc, ["train", "test"]).splits) == 2  # ids on one side only: neither
    write_precomp_split(tmp_path, "train", feats, caps, image_ids=["11", "12"])
    write_precomp_split(tmp_path, "test", feats, caps, image_ids=["12", "13"])
    with pytest.raises(
        DataError,
        match=r"test_ids.txt:1: image id '12' of the test split is also image 1 of the "
        r"train split \(.*train_ids.txt:2\)",
    ):
        load_raw_data(dc, ["train", "test"])


# ---------------------------------------------------------------------------- 2. missing image files


def test_a_missing_image_is_an_unusable_file_with_the_skip_hint(laps_dataset, tmp_path, capsys):
    images, runs = laps_dataset["image_root"], tmp_path / "runs"
    (images / "train5.png").unlink()
    with pytest.raises(DataError) as err:
        load_raw_data(_laps(laps_dataset), ["train"])
    assert str(err.value).startswith(
        f"1 of 8 image files of the train split are unusable: {images / 'train5.png'}: missing; replace or "
        "delete them"
    )
    assert "data.skip_bad_images=true" in str(err.value) and "check_images=false" not in str(err.value)
    assert main(["train", *laps_args(laps_dataset, f"output_dir={runs}", "name=r")]) == 2
    assert "image files of the train split are unusable" in one_error_line(capsys.readouterr().err)
    assert not runs.exists()


def test_the_readers_missing_image_hint_is_skip_bad_images(laps_dataset):
    (laps_dataset["image_root"] / "test1.png").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"])
    assert "set data.skip_bad_images=true to leave them and their captions out" in str(err.value)
    assert "data.check_images=false" not in str(err.value)


# ---------------------------------------------------------------------------- 3. ~ in data paths


def test_home_in_data_paths_is_expanded_by_the_readers(tmp_path, monkeypatch):
    home = tmp_path / "home"
    paths = write_laps_dataset(home / "laps")
    monkeypatch.setenv("HOME", str(home))
    dc = DataConfig(
        dataset="laps",
        root="~/laps",
        image_root="~/laps/images",
        dense_train="~/laps/train.jsonl",
        dense=True,
    )
    raw = load_raw_data(dc, ["train"])
    assert raw.splits["train"].images[0] == str(paths["image_root"] / "train0.png")
    assert raw.splits["train"].dense_captions is not None


# ---------------------------------------------------------------------------- 5. LAPS without id mapping


def test_missing_id_mapping_says_where_to_put_it(laps_dataset):
    root = laps_dataset["root"]
    (root / "id_mapping.json").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_raw_data(_laps(laps_dataset), ["test"])
    assert str(err.value) == (
        f"id mapping not found: {root / 'id_mapping.json'}; put id_mapping.json (a JSON object: image id -> "
        f"file name relative to data.image_root) in {root}"
    )


# ---------------------------------------------------------------------------- 7. / 9. SCAN layout


def test_rows_per_caption_with_one_id_per_image(tmp_path):
    """P_rep_ids1: 2 images x 5 copied rows, 10 captions, test_ids.txt = 100, 200."""
    feats = np.random.default_rng(1).random((2, 3, 8), dtype=np.float32)
    np.save(tmp_path / "test_ims.npy", np.repeat(feats, 5, axis=0))
    (tmp_path / "test_caps.txt").write_text("".join(f"caption {k}\n" for k in range(10)))
    (tmp_path / "test_ids.txt").write_text("100\n200\n")
    split = load_precomp_split(tmp_path, "test")
    assert split.image_ids == ["100", "200"] and np.array_equal(split.images, feats)
    assert split.txt2img.tolist() == [0] * 5 + [1] * 5
    (tmp_path / "test_ids.txt").write_text("100\n200\n300\n")  # fits neither the images nor the captions
    with pytest.raises(DataError) as err:
        load_precomp_split(tmp_path, "test")
    assert str(err.value) == (
        f"{tmp_path / 'test_ids.txt'}: 3 ids for 2 images in test_ims.npy and 10 captions; expected one id "
        "per image or one per caption"
    )


def test_an_empty_captions_file_is_refused_as_empty(tmp_path, laps_dataset):
    np.save(tmp_path / "test_ims.npy", np.zeros((2, 3, 8), np.float32))
    (tmp_path / "test_caps.txt").write_text("")
    with pytest.raises(DataError) as err:
        load_precomp_split(tmp_path, "test")
    assert str(err.value) == f"{tmp_path / 'test_caps.txt'}: empty: no captions"
    (laps_dataset["root"] / "test_caps.txt").write_text("")
    with pytest.raises(DataError, match="test_caps.txt: empty: no captions"):
        load_laps_split(laps_dataset["root"], "test", None)
    assert "captions_per_image=0" not in captions_per_image_mismatch(0, 5, "an ids file")


# ---------------------------------------------------------------------------- 8. Karpathy split names


def test_an_unknown_karpathy_split_names_the_key_and_the_json(tmp_path):
    path, images = _karpathy(tmp_path, [("train", 0, "0.png"), ("test", 1, "1.png")])
    dc = DataConfig(dataset="karpathy", root=str(path), image_root=str(images), test_split="testall")
    with pytest.raises(ConfigError) as err:
        load_raw_data(dc, ["test"], use_dense=False)
    assert err.value.key == "data.test_split"
    assert str(err.value).startswith(
        f"data.test_split: is 'testall', not a split of the Karpathy json {path}"
    )


# ---------------------------------------------------------------------------- 10. data.captions_per_image


@pytest.mark.parametrize("dataset", ["karpathy", "synthetic", "synthetic_regions"])
def test_captions_per_image_is_refused_where_nothing_reads_it(dataset):
    cfg = apply_overrides(RunConfig(), [f"data.dataset={dataset}", "data.captions_per_image=1"])
    with pytest.raises(ConfigError) as err:
        check_region_boxes(cfg)
    assert err.value.key == "data.captions_per_image"
    assert f"not {dataset}" in str(err.value)
    for fine in (["data.captions_per_image=5"], ["data.dataset=laps", "data.captions_per_image=1"]):
        check_region_boxes(apply_overrides(RunConfig(), [f"data.dataset={dataset}", *fine]))


def test_data_check_refuses_captions_per_image_for_karpathy(tmp_path, capsys):
    path, images = _karpathy(tmp_path, [("train", 0, "0.png"), ("val", 1, "1.png"), ("test", 2, "2.png")])
    args = [
        "data.dataset=karpathy",
        f"data.root={path}",
        f"data.image_root={images}",
        "data.captions_per_image=2",
    ]
    assert main(["data", "check", *args]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: data.captions_per_image: is read by ")


# ---------------------------------------------------------------------------- a directory as an image


def test_a_directory_listed_as_an_image_is_said_to_be_one(tmp_path):
    folder = tmp_path / "dir.png"
    folder.mkdir()
    assert image_problem(folder) == "a directory, not a file"
    assert find_bad_images([folder]) == [(str(folder), "a directory, not a file")]
    with pytest.raises(DataError, match="a directory, not a file"):
        load_image(folder)
    shutil.rmtree(folder)
