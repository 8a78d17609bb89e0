"""A researcher's own dataset, second review: what a reader merged, dropped or refused wrongly, and what
failed far from the file at fault.

* LAPS ids per caption whose runs are not contiguous (a run relabelled), or repeated with
  ``data.captions_per_image=1``, merged two images;
* ``patchword eval`` and ``data check --split test`` let a test split share images with the training split;
* Karpathy entries of an unknown split ('Test') were dropped; ids of different fields (``cocoid`` 5,
  ``imgid`` 5) were taken for one image;
* SCAN features of another shape in the test split failed after training; two equal rows with one caption
  per image were read as a run of copies;
* a damaged image found by a DataLoader worker was a 30-line message;
* captions cut at ``data.max_caption_len`` were not counted.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import laps_args, one_error_line, write_laps_dataset
from patchword.cli import main
from patchword.data.config import DataConfig
from patchword.data.karpathy import load_karpathy_json
from patchword.data.laps import load_laps_split
from patchword.data.pipeline import ArrayImages, encode_split
from patchword.data.precomp import load_precomp_split, write_precomp_split
from patchword.data.prepare import load_raw_data
from patchword.data.tokenizers import WordVocab
from patchword.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _set_lines(path: Path, replace: dict[int, str]) -> None:
    """Replace lines (0-based) of a one-item-per-line file."""
    lines = path.read_text().splitlines()
    for index, text in replace.items():
        lines[index] = text
    _write_lines(path, lines)


# ---------------------------------------------------------------------------- 1. LAPS ids out of runs


def test_a_laps_id_starting_a_second_run_is_refused_not_merged(laps_dataset, capsys):
    """Test image 3's run relabelled as image 1 made image 1 four captions and dropped image 3."""
    root = laps_dataset["root"]
    ids = root / "test_ids.txt"
    _set_lines(ids, {6: "test1", 7: "test1"})
    with pytest.raises(DataError) as err:
        load_laps_split(root, "test", None)
    assert str(err.value).startswith(
        f"{ids}:7: id 'test1' starts a second run (the first at line 3); with one id per caption each "
        "image's captions are consecutive lines repeating its id"
    )
    assert main(["data", "check", "--split", "test", *laps_args(laps_dataset)]) == 2
    assert f"error: {ids}:7: id 'test1' starts a second run" in capsys.readouterr().out


def test_laps_ids_repeated_with_one_caption_per_image_are_refused(tmp_path):
    """With data.captions_per_image=1 every line is an image: two lines of one id merged two images."""
    _write_lines(tmp_path / "train_caps.txt", ["a dog", "a cat", "a bird"])
    ids = _write_lines(tmp_path / "train_ids.txt", ["7", "7", "8"])
    with pytest.raises(DataError) as err:
        load_laps_split(tmp_path, "train", None, captions_per_image=1)
    assert str(err.value).startswith(
        f"{ids}:2: image id '7' repeats line 1; with data.captions_per_image=1 (one caption per image, 3 ids "
        "for 3 captions) every line must be a distinct image"
    )
    # distinct ids read as before; ids in runs still group with the default count
    _write_lines(ids, ["7", "8", "9"])
    assert load_laps_split(tmp_path, "train", None, captions_per_image=1).num_images == 3
    _write_lines(ids, ["7", "7", "8"])
    assert load_laps_split(tmp_path, "train", None).txt2img.tolist() == [0, 0, 1]


# ---------------------------------------------------------------------------- 2. eval and shared images


def test_eval_refuses_a_test_split_sharing_training_images(laps_dataset, tmp_path, capsys):
    """eval read the test split alone and scored it as held out (split_use null)."""
    runs = tmp_path / "runs"
    assert main(["train", *laps_args(laps_dataset, f"output_dir={runs}", "name=r")]) == 0
    other = tmp_path / "other"
    shutil.copytree(laps_dataset["root"], other, ignore=shutil.ignore_patterns("images"))
    _set_lines(other / "test_ids.txt", {0: "train5", 1: "train5"})
    capsys.readouterr()
    out = tmp_path / "e.json"
    assert main(["eval", str(runs / "r"), "--out", str(out), f"data.root={other}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: {other / 'test_ids.txt'}:1: image id 'train5' of the test split is also image 5 of the "
        f"train split ({other / 'train_ids.txt'}:11)"
    )
    assert not out.exists()
    # data check of the test split alone refuses it too
    assert main(["data", "check", "--split", "test", *laps_args(laps_dataset, f"data.root={other}")]) == 2
    assert "image id 'train5' of the test split is also image 5" in capsys.readouterr().out
    # a root holding the test split only has nothing to compare with: scored
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("test_ids.txt", "test_caps.txt", "id_mapping.json"):
        shutil.copy(laps_dataset["root"] / name, alone / name)
    assert main(["eval", str(runs / "r"), "--out", str(out), f"data.root={alone}"]) == 0
    assert json.loads(out.read_text())["split_use"] is None


def test_karpathy_and_precomp_test_splits_read_alone_are_compared(tmp_path):
    images = tmp_path / "kimages"
    entries = [("train", 0, "0.png"), ("val", 1, "1.png"), ("test", 2, "0.png")]
    path = tmp_path / "k.json"
    data = {
        "images": [
            {"split": s, "imgid": i, "filename": f, "sentences": [{"raw": f"a picture {i}"}]}
            for s, i, f in entries
        ]
    }
    path.write_text(json.dumps(data))
    dc = DataConfig(
        dataset="karpathy", root=str(path), image_root=str(images), dense=False, check_images=False
    )
    with pytest.raises(
        DataError, match=r"images\[2\]: image file '.*0.png' of the test split is also image 0"
    ):
        load_raw_data(dc, ["test"])
    feats = np.random.default_rng(0).random((2, 3, 8), dtype=np.float32)
    caps = [f"caption {k} of image {i}" for i in range(2) for k in range(5)]
    write_precomp_split(tmp_path / "p", "train", feats, caps, image_ids=["11", "12"])
    write_precomp_split(tmp_path / "p", "test", feats, caps, image_ids=["12", "13"])
    with pytest.raises(DataError, match=r"test_ids.txt:1: image id '12' of the test split is also image 1"):
        load_raw_data(DataConfig(dataset="precomp", root=str(tmp_path / "p")), ["test"])


@pytest.mark.parametrize("roles", [["test"], ["train", "dev", "test"]])
def test_a_karpathy_json_is_parsed_once_per_load_with_the_overlap_check(tmp_path, monkeypatch, roles):
    """Old code parsed the json once per split read and once more for the overlap check of a split read
    alone (COCO's is 140 MB): an evaluation parsed it twice, a training run three times."""
    from patchword.data import karpathy

    path = _karpathy(
        tmp_path / "k.json",
        [{"split": split, "imgid": k} for k, split in enumerate(["train", "train", "val", "test", "test"])],
    )
    parsed = []
    real = karpathy.load_json
    monkeypatch.setattr(karpathy, "load_json", lambda p: parsed.append(p) or real(p))
    dc = DataConfig(
        dataset="karpathy", root=str(path), image_root=str(tmp_path), dense=False, check_images=False
    )
    raw = load_raw_data(dc, roles)
    assert parsed == [path] and [raw.splits[r].num_images for r in roles] == [2, 1, 2][-len(roles) :]


# ---------------------------------------------------------------------------- 3, 6. Karpathy json


def _karpathy(path: Path, entries: list[dict]) -> Path:
    for k, entry in enumerate(entries):
        entry.setdefault("filename", f"{k}.jpg")
        entry.setdefault("sentences", [{"raw": f"a photo number {k}"}])
    path.write_text(json.dumps({"images": entries}))
    return path


@pytest.mark.parametrize("name", ["Test", "testing"])
def test_a_karpathy_entry_of_an_unknown_split_is_refused_not_dropped(tmp_path, name):
    path = _karpathy(tmp_path / "k.json", [{"split": "train", "imgid": 0}, {"split": name, "imgid": 1}])
    for split in ("train", "test"):
        with pytest.raises(DataError) as err:
            load_karpathy_json(path, split, None)
        assert str(err.value) == f"{path}: images[1] has split {name!r}, not one of train, val, test, restval"


def test_karpathy_ids_of_different_fields_are_different_images(tmp_path):
    """COCO id 5 and Karpathy index 5 were one id '5': refused as a shared (or repeated) image."""
    path = _karpathy(
        tmp_path / "k.json",
        [{"split": "train", "cocoid": 5}, {"split": "test", "imgid": 5}, {"split": "test", "cocoid": 5}],
    )
    dc = DataConfig(
        dataset="karpathy", root=str(path), image_root=str(tmp_path), dense=False, check_images=False
    )
    with pytest.raises(DataError, match=r"images\[2\]: image id '5' of the test split is also image 0"):
        load_raw_data(dc, ["train", "test"])  # the same field: the same image
    path = _karpathy(
        tmp_path / "k.json",
        [{"split": "train", "cocoid": 5}, {"split": "test", "imgid": 5}, {"split": "test", "cocoid": 6}],
    )
    raw = load_raw_data(dc, ["train", "test"]).splits
    assert raw["test"].image_ids == ["5", "6"] and raw["test"].image_id_fields == ["imgid", "cocoid"]
    assert raw["test"].image_keys() == ["imgid:5", "cocoid:6"]
    test = load_karpathy_json(
        _karpathy(tmp_path / "k.json", [{"split": "test", "cocoid": 5}, {"split": "test", "imgid": 5}]),
        "test",
        None,
    )
    assert test.image_ids == ["5", "5"] and test.num_images == 2
    assert test.subset([1]).image_id_fields == ["imgid"]


# ---------------------------------------------------------------------------- 4, 7. SCAN features


PRECOMP_TRAIN = [
    "data.dataset=precomp",
    "model.image_encoder=precomp",
    "model.text_encoder=gru",
    "model.matcher=scan",
    "model.embed_dim=8",
    "model.gru.word_dim=8",
    "model.precomp.region_dim=16",
    "model.precomp.num_regions=14",
    "train.max_steps=1",
    "train.batch_size=4",
    "train.num_threads=1",
]


def test_a_test_split_of_another_region_shape_is_refused_before_training(tmp_path, capsys):
    """Only the first split was checked: training ran, then the test split failed without its file."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    for split, regions in (("train", 14), ("dev", 14), ("test", 12)):
        caps = [f"a {split} dog {i} number {k}" for i in range(4) for k in range(5)]
        write_precomp_split(data, split, rng.random((4, regions, 16), dtype=np.float32), caps)
    runs = tmp_path / "runs"
    args = ["train", *PRECOMP_TRAIN, f"data.root={data}", f"output_dir={runs}", "name=r"]
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {data / 'test_ims.npy'}: the test split has 12 regions of 16 dims, but the train split has "
        "14 of 16 (model.precomp.num_regions=14, model.precomp.region_dim=16); every split needs the same "
        "region features (the same detector and number of boxes)"
    )
    assert not runs.exists()


def test_equal_rows_with_one_caption_per_image_are_images_not_copies(tmp_path):
    """Two zero placeholder rows were taken for a run of copies and refused as rows that differ."""
    feats = np.random.default_rng(0).random((4, 2, 3), dtype=np.float32)
    feats[:2] = 0
    write_precomp_split(tmp_path, "test", feats, ["a b", "c d", "e f", "g h"])
    split = load_precomp_split(tmp_path, "test", captions_per_image=1)
    assert split.num_images == 4 and split.txt2img.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(split.images, feats)
    # ids repeated on consecutive rows are repeated ids with one caption per image
    write_precomp_split(tmp_path, "test", feats, ["a b", "c d", "e f", "g h"], image_ids=list("aabc"))
    with pytest.raises(DataError, match=r"test_ids.txt:2: image id 'a' repeats line 1"):
        load_precomp_split(tmp_path, "test", captions_per_image=1)


# ---------------------------------------------------------------------------- 5. DataLoader workers


def test_a_damaged_image_found_by_a_worker_is_one_line(tmp_path, capsys):
    paths = write_laps_dataset(tmp_path / "laps")
    image = paths["image_root"] / "train2.png"
    image.write_bytes(image.read_bytes()[:60])
    runs = tmp_path / "runs"
    args = ["data.check_images=false", "data.num_workers=1", "train.batch_size=16", "data.dense=false"]
    assert main(["train", *laps_args(paths, f"output_dir={runs}", "name=r", *args)]) == 2
    err = capsys.readouterr().err
    line = one_error_line(err)
    assert line.startswith(f"error: cannot read image {image}: truncated file") and "DataLoader" not in err


# ---------------------------------------------------------------------------- 8. captions cut short


def test_captions_reaching_max_caption_len_are_counted_once(caplog):
    from patchword.data.split import RetrievalSplit

    captions = ["a dog", "a dog runs on the grass", "a cat sits on a mat", "a bird"]
    split = RetrievalSplit("test", list(range(4)), captions, np.arange(4))
    vocab = WordVocab.build(captions)
    images = ArrayImages(np.zeros((4, 4, 4, 3), np.uint8))
    with caplog.at_level(logging.INFO, logger="patchword.data.pipeline"):
        encode_split(split, vocab, images, max_caption_len=5, max_dense_len=5, use_dense=False)
    assert [r.getMessage() for r in caplog.records] == [
        "test: 2 of 4 captions reach max_caption_len=5 (longer ones are cut to it)"
    ]


def test_a_worker_error_comes_back_with_its_type_and_message():
    """Errors that do not unpickle (ConfigError takes two arguments) and OS errors (errno, path) alike."""
    import pickle

    from patchword.errors import ConfigError
    from patchword.train.feed import WorkerError

    for err in (ConfigError("data.x", "is bad"), PermissionError(13, "Permission denied", "/d/x.png")):
        sent = pickle.loads(pickle.dumps(WorkerError.of(err)))
        with pytest.raises(type(err)) as back:
            sent.reraise()
        assert str(back.value) == str(err)
    assert back.value.filename == "/d/x.png"
