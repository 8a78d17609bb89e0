"""Readers keep captions, dense captions and ids aligned with the right image, or refuse the file.

(The official SEPS dense files, which record no image ids, are loaded by test_loaders.py's real-data tests.)

Each test is named after a defect where a reader silently paired data with the wrong image (or crashed,
or pointed at the wrong place) and pins the one-line error or the correct pairing instead.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from patchword.data.export import export_synthetic_split
from patchword.data.images import image_problem, load_image
from patchword.data.karpathy import load_karpathy_json
from patchword.data.laps import load_laps_split
from patchword.data.precomp import load_precomp_split, write_precomp_split
from patchword.data.synthetic import SyntheticConfig
from patchword.data.textfiles import load_dense_jsonl, read_lines
from patchword.errors import DataError


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _dense(text: str, **metadata: object) -> str:
    return json.dumps({"text": text, "model_id": "m", "metadata": {"length": len(text), **metadata}})


def _laps(data: Path, split: str, ids: list[int], per_image: int = 2, one_id_per_image: bool = False) -> Path:
    """A LAPS-layout split: image ``i`` is ``imgs/{i}.png`` with captions ``cap {i} {k}``."""
    data.mkdir(parents=True, exist_ok=True)
    caps = [f"cap {i} {k}" for i in ids for k in range(per_image)]
    id_lines = [str(i) for i in ids] if one_id_per_image else [str(i) for i in ids for _ in range(per_image)]
    _write_lines(data / f"{split}_caps.txt", caps)
    _write_lines(data / f"{split}_ids.txt", id_lines)
    mapping_file = data / "id_mapping.json"
    mapping = json.loads(mapping_file.read_text()) if mapping_file.is_file() else {}
    mapping.update({str(i): f"imgs/{i}.png" for i in ids})
    mapping_file.write_text(json.dumps(mapping))
    return data


# ---------------------------------------------------------------------------------- 1. dense identities


def test_dense_lines_in_folder_sort_order_are_refused_not_paired_by_position(tmp_path: Path) -> None:
    """A folder densify of 0..11.png lists 0, 1, 10, 11, 2...: image 2 used to get image 10's text."""
    data = _laps(tmp_path / "data", "train", list(range(12)))
    folder_order = sorted(f"imgs/{i}.png" for i in range(12))  # what densify --images writes
    dense = _write_lines(
        tmp_path / "d.jsonl", [_dense(f"about {f}", image_id=f, file=f) for f in folder_order]
    )
    with pytest.raises(DataError) as err:
        load_laps_split(data, "train", None, dense_jsonl=dense)
    message = str(err.value)
    assert message.startswith(f"{dense}:3: the line describes image_id 'imgs/10.png', file 'imgs/10.png'")
    assert "image 2 of the split is id '2' (imgs/2.png)" in message
    assert "that is image 10 of the split" in message


def test_dense_files_of_two_splits_swapped_are_refused(tmp_path: Path) -> None:
    """dev and test dense files (4 images each, written by densify --data-root/--split) swapped."""
    data = _laps(tmp_path / "data", "dev", [12, 13, 14, 15])
    _laps(data, "test", [16, 17, 18, 19])
    test_dense = [_dense(f"about {i}", image_id=str(i), file=f"imgs/{i}.png") for i in range(16, 20)]
    wrong = _write_lines(tmp_path / "test.jsonl", test_dense)
    with pytest.raises(
        DataError, match=r"test\.jsonl:1: .*'16'.* image 0 of the split is id '12'.*another split"
    ):
        load_laps_split(data, "dev", None, dense_jsonl=wrong)
    split = load_laps_split(data, "test", None, dense_jsonl=wrong)
    assert split.dense_captions == ["about 16", "about 17", "about 18", "about 19"]


def test_dense_lines_match_by_dataset_id_or_by_file_suffix(tmp_path: Path) -> None:
    """A LAPS-split densify records dataset ids; a folder densify records paths relative to its folder,
    which may sit above or below the image root: both identify the image."""
    data = _laps(tmp_path / "data", "test", [5, 7])
    root = tmp_path / "images"
    by_id = _write_lines(tmp_path / "a.jsonl", [_dense("five", image_id=5), _dense("seven", image_id="7")])
    by_file = _write_lines(
        tmp_path / "b.jsonl",
        [_dense("five", image_id="x/5.png", file="images/imgs/5.png"), _dense("seven", file="7.png")],
    )
    for dense in (by_id, by_file):
        split = load_laps_split(data, "test", root, dense_jsonl=dense, check_images=False)
        assert split.dense_captions == ["five", "seven"]
    partial_name = _write_lines(
        tmp_path / "c.jsonl", [_dense("five", file="5.png"), _dense("x", file="17.png")]
    )
    with pytest.raises(DataError, match=r"c\.jsonl:2: .*file '17\.png'"):
        load_laps_split(data, "test", root, dense_jsonl=partial_name, check_images=False)


def test_dense_lines_without_identity_keep_order_pairing(tmp_path: Path) -> None:
    data = _laps(tmp_path / "data", "test", [5, 7])
    dense = _write_lines(tmp_path / "d.jsonl", [_dense("first"), json.dumps({"text": "second"})])
    assert load_laps_split(data, "test", None, dense_jsonl=dense).dense_captions == ["first", "second"]


def test_dense_identity_checked_for_karpathy_splits(tmp_path: Path) -> None:
    images = [
        {"split": "test", "filename": f"{i}.jpg", "cocoid": i, "sentences": [{"raw": f"c{i}"}]}
        for i in (3, 4)
    ]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images}))
    swapped = _write_lines(tmp_path / "d.jsonl", [_dense("four", image_id=4), _dense("three", image_id=3)])
    with pytest.raises(
        DataError, match=r"d\.jsonl:1: .*image 0 of the split is id '3'.*image 1 of the split"
    ):
        load_karpathy_json(path, "test", None, dense_jsonl=swapped)


def test_dense_bad_metadata_identity_is_one_line(tmp_path: Path) -> None:
    dense = _write_lines(tmp_path / "d.jsonl", [_dense("a", image_id=["x"])])
    with pytest.raises(DataError, match=r"d\.jsonl:1: metadata\.image_id is \['x'\]"):
        load_dense_jsonl(dense)


def test_synthetic_export_dense_file_lines_up_with_its_split(tmp_path: Path) -> None:
    summary = export_synthetic_split(
        tmp_path / "ex", "test", config=SyntheticConfig(num_test=6), progress=False
    )
    split = load_laps_split(
        summary.out_dir, "test", summary.files["images"], dense_jsonl=summary.files["dense"]
    )
    assert split.num_images == 6
    assert split.dense_captions == load_dense_jsonl(summary.files["dense"])


# ---------------------------------------------------------------------------- 2. repeated id per image


def test_repeated_id_in_one_id_per_image_file_is_refused_not_merged(tmp_path: Path) -> None:
    data = _laps(tmp_path / "data", "train", list(range(6)), per_image=5, one_id_per_image=True)
    ids = read_lines(data / "train_ids.txt")
    ids[5] = "2"  # line 6 changed from 5 to 2
    _write_lines(data / "train_ids.txt", ids)
    with pytest.raises(DataError) as err:
        load_laps_split(data, "train", None)
    assert str(err.value).startswith(f"{data / 'train_ids.txt'}:6: image id '2' repeats line 3;")


def test_one_id_per_caption_files_keep_their_repeats(tmp_path: Path) -> None:
    data = _laps(tmp_path / "data", "test", [4, 9], per_image=5)
    split = load_laps_split(data, "test", None)
    assert split.image_ids == ["4", "9"]
    assert split.txt2img.tolist() == [0] * 5 + [1] * 5


# ---------------------------------------------------------------------------- 3. decompression bombs


def test_decompression_bomb_is_a_data_error_in_load_image(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "b.png"
    Image.new("L", (40, 40)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 1600 px > 2 x 100: refused as a bomb
    with pytest.raises(DataError, match=rf"^cannot read image {path}: refused as a decompression bomb \("):
        load_image(path)
    assert image_problem(path).startswith("refused as a decompression bomb (")


# ---------------------------------------------------------------------------- 4. Karpathy field types


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("split", ["test"], "field 'split' is ['test'], expected a non-empty string"),
        ("filename", None, "field 'filename' is None, expected a non-empty string"),
        ("filepath", None, "field 'filepath' is None, expected a non-empty string"),
        ("cocoid", None, "field 'cocoid' is None, expected an integer or string id"),
    ],
)
def test_karpathy_field_of_wrong_type_is_one_line(tmp_path: Path, field: str, value, expected: str) -> None:
    good = {"split": "test", "filename": "a.jpg", "cocoid": 1, "sentences": [{"raw": "a cat"}]}
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": [good, {**good, "cocoid": 2, field: value}]}))
    with pytest.raises(ValueError) as err:
        load_karpathy_json(path, "test", None)
    assert str(err.value) == f"{path}: images[1] {expected}"


# ---------------------------------------------------------------------------- 5. non-UTF-8 line numbers


def test_non_utf8_byte_is_located_by_file_line_and_file_offset(tmp_path: Path) -> None:
    lines = [f"caption number {i:05d} of the file" for i in range(2000)]
    body = "".join(line + "\n" for line in lines).encode()
    offset = len("".join(line + "\n" for line in lines[:1500])) + 3  # inside line 1501
    path = tmp_path / "caps.txt"
    path.write_bytes(body[:offset] + b"\xe9" + body[offset + 1 :])
    with pytest.raises(DataError) as err:
        read_lines(path, "caption")
    assert f"{path} is not valid UTF-8: line 1501, byte 0xe9 at byte offset {offset} of the file" in str(
        err.value
    )


def test_non_utf8_line_count_follows_universal_newlines(tmp_path: Path) -> None:
    path = tmp_path / "caps.txt"
    path.write_bytes(b"a\r\nb\rc\n\xff\n")
    with pytest.raises(DataError, match=r"line 4, byte 0xff at byte offset 7 "):
        read_lines(path)


# ---------------------------------------------------------------------------- 6. export permissions


def test_export_directory_gets_umask_permissions_not_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        summary = export_synthetic_split(
            tmp_path / "ex", "test", config=SyntheticConfig(num_test=2), progress=False
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE(summary.out_dir.stat().st_mode) == 0o755


# ---------------------------------------------------------------------------- 7. precomp ids per caption


def _precomp(root: Path, ids: list[str]) -> Path:
    write_precomp_split(root, "test", np.zeros((3, 2, 4), np.float32), [f"c{k}" for k in range(6)])
    _write_lines(root / "test_ids.txt", ids)
    return root / "test_ids.txt"


def test_precomp_per_caption_ids_must_come_in_runs(tmp_path: Path) -> None:
    ids_file = _precomp(tmp_path, ["a", "a", "b", "b", "c", "c"])
    assert load_precomp_split(tmp_path, "test").image_ids == ["a", "b", "c"]
    _precomp(tmp_path, ["a", "b", "a", "b", "c", "c"])  # ids[::2] would say a, a, c
    with pytest.raises(DataError, match=rf"^{ids_file}:2: id 'b' breaks the run of 'a' from line 1"):
        load_precomp_split(tmp_path, "test")
    _precomp(tmp_path, ["a", "a", "b", "b", "a", "a"])
    with pytest.raises(DataError, match=rf"^{ids_file}:5: id 'a' starts a second run of 2 lines"):
        load_precomp_split(tmp_path, "test")
