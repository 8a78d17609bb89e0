"""Caption readers (LAPS/SEPS layout, Karpathy json, dense jsonl) and image loading.

Small generated fixtures cover every error path; the real Flickr30K / COCO test files in shared/data check
the readers against the actual SEPS release (skipped when that folder is absent).
"""

from __future__ import annotations

import gzip
import html
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from patchword.data.images import ImageFolderSplit, load_image
from patchword.data.karpathy import load_karpathy_json
from patchword.data.laps import load_laps_split
from patchword.data.split import RetrievalSplit
from patchword.data.textfiles import load_dense_jsonl, read_lines
from patchword.data.transforms import test_transform as make_test_transform
from project_paths import SHARED_DATA

SHARED = SHARED_DATA
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"real caption files not available ({SHARED} is absent)"
)


# --------------------------------------------------------------------------------------------------------
# Fixture builders
# --------------------------------------------------------------------------------------------------------


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _dense_line(text: str) -> str:
    return json.dumps({"text": text, "model_id": "llava", "metadata": {"length": len(text)}})


def _save_image(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (20, 16)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


@pytest.fixture
def laps_dir(tmp_path: Path) -> Path:
    """A LAPS-style folder: a test split (ids repeated per caption) and a train split (ids once per image)."""
    data = tmp_path / "f30k"
    data.mkdir()
    _write_lines(data / "test_caps.txt", [f"test caption {i} ." for i in range(6)])
    _write_lines(data / "test_ids.txt", ["7", "7", "7", "3", "3", "3"])
    _write_lines(data / "train_caps.txt", [f"train caption {i}" for i in range(6)])
    _write_lines(data / "train_ids.txt", ["3", "9"])
    (data / "id_mapping.json").write_text(json.dumps({"3": "b.jpg", "7": "a.jpg", "9": "sub/c.jpg"}))
    _write_lines(data / "test_dense.jsonl", [_dense_line("dense a"), _dense_line("dense b")])
    return data


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    for name, color in [("a.jpg", (255, 0, 0)), ("b.jpg", (0, 255, 0)), ("sub/c.jpg", (0, 0, 255))]:
        _save_image(root / name, color)
    return root


# --------------------------------------------------------------------------------------------------------
# LAPS / SEPS layout
# --------------------------------------------------------------------------------------------------------


def test_laps_test_split_with_repeated_ids(laps_dir: Path, image_root: Path) -> None:
    split = load_laps_split(laps_dir, "test", image_root, dense_jsonl=laps_dir / "test_dense.jsonl")
    assert isinstance(split, RetrievalSplit) and split.name == "test"
    assert split.image_ids == ["7", "3"]  # first-appearance order, not sorted
    assert split.images == [str(image_root / "a.jpg"), str(image_root / "b.jpg")]
    assert split.captions[0] == "test caption 0 ." and split.num_captions == 6
    assert split.txt2img.tolist() == [0, 0, 0, 1, 1, 1]
    assert split.dense_captions == ["dense a", "dense b"]


def test_laps_train_split_uses_im_div(laps_dir: Path, image_root: Path) -> None:
    split = load_laps_split(laps_dir, "train", image_root, captions_per_image=3)
    assert split.image_ids == ["3", "9"]
    assert split.images[1] == str(image_root / "sub" / "c.jpg")
    assert split.txt2img.tolist() == [0, 0, 0, 1, 1, 1]  # im_div = 6 captions / 2 ids = 3
    assert split.dense_captions is None


def test_laps_text_only_splits(laps_dir: Path) -> None:
    split = load_laps_split(laps_dir, "test", None)
    assert split.images == ["a.jpg", "b.jpg"]  # relative names from the mapping
    split = load_laps_split(laps_dir, "test", None, id_mapping={"7": "x/7.jpg", "3": "x/3.jpg"})
    assert split.images == ["x/7.jpg", "x/3.jpg"]
    (laps_dir / "id_mapping.json").unlink()  # as for COCO, whose mapping is not distributed
    assert load_laps_split(laps_dir, "test", None).images == ["7", "3"]


def test_laps_unchecked_image_root(laps_dir: Path, tmp_path: Path) -> None:
    split = load_laps_split(laps_dir, "test", tmp_path / "nowhere", check_images=False)
    assert split.images == [str(tmp_path / "nowhere" / "a.jpg"), str(tmp_path / "nowhere" / "b.jpg")]


@pytest.mark.parametrize("missing", ["test_caps.txt", "test_ids.txt"])
def test_laps_missing_split_file(laps_dir: Path, missing: str) -> None:
    (laps_dir / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing):
        load_laps_split(laps_dir, "test", None)


def test_laps_missing_id_mapping_with_image_root(laps_dir: Path, image_root: Path) -> None:
    (laps_dir / "id_mapping.json").unlink()
    with pytest.raises(FileNotFoundError, match="id_mapping.json"):
        load_laps_split(laps_dir, "test", image_root)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (["7", "3", "9", "1"], "6 captions but .*test_ids.txt has 4 ids"),  # 6 / 4 is not whole
        (["7"] * 7, "6 captions but .*test_ids.txt has 7 ids"),  # more ids than captions
    ],
)
def test_laps_caption_id_count_mismatch(laps_dir: Path, ids: list[str], match: str) -> None:
    _write_lines(laps_dir / "test_ids.txt", ids)
    with pytest.raises(ValueError, match=match):
        load_laps_split(laps_dir, "test", None)


def test_laps_empty_caption_names_file_and_line(laps_dir: Path) -> None:
    _write_lines(laps_dir / "test_caps.txt", ["a", "b", "   ", "d", "e", "f"])
    with pytest.raises(ValueError, match=r"test_caps.txt:3: empty caption"):
        load_laps_split(laps_dir, "test", None)


def test_laps_trailing_blank_line_is_an_empty_caption(laps_dir: Path) -> None:
    (laps_dir / "test_caps.txt").write_text("a\nb\nc\nd\ne\nf\n\n")
    with pytest.raises(ValueError, match=r"test_caps.txt:7: empty caption"):
        load_laps_split(laps_dir, "test", None)


def test_laps_id_missing_from_mapping(laps_dir: Path) -> None:
    _write_lines(laps_dir / "test_ids.txt", ["7", "7", "7", "5", "5", "5"])
    with pytest.raises(ValueError, match=r"'5' \(.*test_ids.txt:4\) is missing from .*id_mapping.json"):
        load_laps_split(laps_dir, "test", None)
    with pytest.raises(ValueError, match="'5'.*missing from the id_mapping dict"):
        load_laps_split(laps_dir, "test", None, id_mapping={"7": "a.jpg"})


def test_laps_malformed_id_mapping(laps_dir: Path) -> None:
    (laps_dir / "id_mapping.json").write_text('{"7": "a.jpg",')
    with pytest.raises(ValueError, match="id_mapping.json: malformed JSON"):
        load_laps_split(laps_dir, "test", None)
    (laps_dir / "id_mapping.json").write_text('["a.jpg"]')
    with pytest.raises(ValueError, match="id_mapping.json: expected a JSON object"):
        load_laps_split(laps_dir, "test", None)


def test_laps_missing_image_file(laps_dir: Path, image_root: Path) -> None:
    (image_root / "b.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of 2 image files are missing .*b\.jpg"):
        load_laps_split(laps_dir, "test", image_root)
    assert load_laps_split(laps_dir, "test", image_root, check_images=False).num_images == 2
    with pytest.raises(FileNotFoundError, match="image root is not a directory"):
        load_laps_split(laps_dir, "test", image_root / "absent")


# --------------------------------------------------------------------------------------------------------
# Dense captions
# --------------------------------------------------------------------------------------------------------


def test_dense_count_must_match_images(laps_dir: Path) -> None:
    dense = _write_lines(laps_dir / "three.jsonl", [_dense_line(t) for t in "abc"])
    with pytest.raises(ValueError, match=r"three.jsonl: 3 dense captions for a split of 2 images"):
        load_laps_split(laps_dir, "test", None, dense_jsonl=dense)
    # The official code's per-caption repetition is recognised and explained.
    dense = _write_lines(laps_dir / "per_caption.jsonl", [_dense_line(t) for t in "abcdef"])
    with pytest.raises(ValueError, match="one line per caption"):
        load_laps_split(laps_dir, "test", None, dense_jsonl=dense)


@pytest.mark.parametrize(
    ("second_line", "match"),
    [
        ('{"text": "unterminated', r"bad.jsonl:2: malformed JSON"),
        ('{"caption": "no text field"}', r"bad.jsonl:2: .*'text'"),
        ('{"text": "   "}', r"bad.jsonl:2: .*'text'"),
        ('["text"]', r"bad.jsonl:2: .*'text'"),
        ("", r"bad.jsonl:2: empty line"),
    ],
)
def test_dense_jsonl_errors_name_file_and_line(tmp_path: Path, second_line: str, match: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", [_dense_line("fine"), second_line, _dense_line("fine")])
    with pytest.raises(ValueError, match=match):
        load_dense_jsonl(path)


def test_dense_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        load_dense_jsonl(tmp_path / "absent.jsonl")


def test_read_lines_rejects_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "caps.txt"
    path.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(ValueError, match="caps.txt is not valid UTF-8"):
        read_lines(path, "caption")


# --------------------------------------------------------------------------------------------------------
# Karpathy json
# --------------------------------------------------------------------------------------------------------


def _karpathy_image(index: int, split: str, n_sentences: int = 2) -> dict:
    folder = "val2014" if split != "train" else "train2014"
    return {
        "filepath": folder,
        "filename": f"COCO_{folder}_{index:012d}.jpg",
        "imgid": index,
        "cocoid": 1000 + index,
        "split": split,
        "sentences": [{"raw": f" image {index} sentence {k}. ", "tokens": []} for k in range(n_sentences)],
    }


@pytest.fixture
def karpathy_json(tmp_path: Path) -> Path:
    splits = ["train", "restval", "val", "test", "train", "test", "restval"]
    data = {"dataset": "coco", "images": [_karpathy_image(i, s) for i, s in enumerate(splits)]}
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    return path


def test_karpathy_train_takes_restval(karpathy_json: Path, tmp_path: Path) -> None:
    split = load_karpathy_json(karpathy_json, "train", tmp_path / "coco", check_images=False)
    assert split.image_ids == ["1000", "1001", "1004", "1006"]  # COCO ids, json order
    assert split.images[0] == str(tmp_path / "coco" / "train2014" / "COCO_train2014_000000000000.jpg")
    assert split.captions[:2] == ["image 0 sentence 0.", "image 0 sentence 1."]  # stripped raw text
    assert split.txt2img.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    no_restval = load_karpathy_json(karpathy_json, "train", None, restval_into_train=False)
    assert no_restval.image_ids == ["1000", "1004"]
    assert no_restval.images == [
        "train2014/COCO_train2014_000000000000.jpg",
        "train2014/COCO_train2014_000000000004.jpg",
    ]


def test_karpathy_dev_is_val_and_dense(karpathy_json: Path, tmp_path: Path) -> None:
    dense = _write_lines(tmp_path / "dev.jsonl", [_dense_line("the val image")])
    split = load_karpathy_json(karpathy_json, "dev", None, dense_jsonl=dense)
    assert split.name == "dev" and split.image_ids == ["1002"] and split.dense_captions == ["the val image"]
    assert load_karpathy_json(karpathy_json, "test", None).image_ids == ["1003", "1005"]


def test_karpathy_flickr_style_ids_and_image_check(tmp_path: Path) -> None:
    image = {"filename": "42.jpg", "imgid": 5, "split": "test", "sentences": [{"raw": "a dog"}]}
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": [image]}))
    root = tmp_path / "flickr30k-images"
    root.mkdir()
    with pytest.raises(FileNotFoundError, match="42.jpg"):
        load_karpathy_json(path, "test", root)
    _save_image(root / "42.jpg", (1, 2, 3))
    split = load_karpathy_json(path, "test", root)
    assert split.image_ids == ["5"] and split.images == [str(root / "42.jpg")]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "malformed JSON"),
        ('{"pictures": []}', "'images' list"),
        ('{"images": [{"split": "test", "sentences": [{"raw": "x"}]}]}', r"images\[0\] has no 'filename'"),
        ('{"images": [{"filename": "a.jpg", "sentences": [{"raw": "x"}]}]}', r"images\[0\] has no 'split'"),
        (
            '{"images": [{"filename": "a.jpg", "split": "test", "sentences": [{"raw": "x"}, {"raw": " "}]}]}',
            r"images\[0\]\.sentences\[1\] \(a\.jpg\) has an empty",
        ),
        ('{"images": [{"filename": "a.jpg", "split": "test", "sentences": []}]}', "no sentences"),
        (
            '{"images": [{"filename": "a.jpg", "split": "train", "sentences": [{"raw": "x"}]}]}',
            "no images in split",
        ),
    ],
)
def test_karpathy_errors(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "dataset.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_karpathy_json(path, "test", None)


def test_karpathy_unknown_split_and_missing_file(karpathy_json: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown Karpathy split 'testall'"):
        load_karpathy_json(karpathy_json, "testall", None)
    with pytest.raises(FileNotFoundError, match="dataset_f8k.json"):
        load_karpathy_json(tmp_path / "dataset_f8k.json", "test", None)


# --------------------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------------------


def _truncated_jpeg(path: Path) -> Path:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) * 2 // 3])
    return path


def test_load_image_converts_to_rgb(tmp_path: Path) -> None:
    path = tmp_path / "gray.png"
    Image.new("L", (5, 4), 100).save(path)
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (5, 4) and image.getpixel((0, 0)) == (100, 100, 100)


def _truncated_png(path: Path, keep: float = 0.6) -> Path:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue()[: int(len(buffer.getvalue()) * keep)])
    return path


@pytest.mark.parametrize("process_flag", [False, True], ids=["flag off", "flag on in the process"])
def test_load_image_refuses_truncated_files_and_restores_the_flag(tmp_path: Path, monkeypatch, process_flag):
    """A truncated file used to be decoded as far as it goes (grey-padded) with only a log warning."""
    from patchword.errors import DataError

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", process_flag)  # an embedding app may set it
    for path in (_truncated_jpeg(tmp_path / "cut.jpg"), _truncated_png(tmp_path / "cut.png")):
        with Image.open(path) as image:
            assert image.size in ((64, 64), (32, 32))  # the header alone looks fine
        with pytest.raises(DataError, match=rf"cannot read image {re.escape(str(path))}: truncated file"):
            load_image(path)
        assert ImageFile.LOAD_TRUNCATED_IMAGES is process_flag  # restored


def test_find_bad_images_decodes_every_file_completely(tmp_path: Path) -> None:
    """Only headers were read: a file cut after its header counted as a good image."""
    from patchword.data.images import find_bad_images

    good = [tmp_path / f"good{i}.png" for i in range(5)]
    for i, path in enumerate(good):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(path)
    cut_png, cut_jpg = _truncated_png(tmp_path / "cut.png"), _truncated_jpeg(tmp_path / "cut.jpg")
    (tmp_path / "empty.png").write_bytes(b"")
    paths = [good[0], cut_png, *good[1:3], tmp_path / "gone.png", cut_jpg, tmp_path / "empty.png", *good[3:]]
    bad = find_bad_images(paths)
    assert [(Path(p).name, why.split(" ")[0]) for p, why in bad] == [
        ("cut.png", "truncated"),
        ("gone.png", "missing"),
        ("cut.jpg", "truncated"),
        ("empty.png", "empty"),
    ]
    assert find_bad_images(paths, workers=1) == find_bad_images(paths, workers=3) == bad
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_file_images_never_decode_a_damaged_file_half(tmp_path: Path) -> None:
    """With data.check_images=false nothing is checked up front: the batch that reaches the file fails
    naming it (it used to train on the grey-padded remainder)."""
    from patchword.data.pipeline import FileImages
    from patchword.errors import DataError

    good = tmp_path / "good.png"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(good)
    images = FileImages([str(good), str(_truncated_png(tmp_path / "cut.png"))], 32)
    assert images.batch(torch.tensor([0]), train=False).shape == (1, 3, 32, 32)
    for train in (False, True):
        with pytest.raises(DataError, match="cut.png: truncated"):
            images.batch(torch.tensor([0, 1]), train=train)


def test_load_image_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        load_image(tmp_path / "missing.jpg")
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"this is not an image")
    with pytest.raises(ValueError, match="cannot read image .*corrupt.jpg"):
        load_image(corrupt)


def test_image_folder_split_feeds_a_dataloader(laps_dir: Path, image_root: Path) -> None:
    split = load_laps_split(laps_dir, "test", image_root)
    dataset = ImageFolderSplit.from_split(split, make_test_transform(8))
    assert len(dataset) == 2
    image, index = dataset[1]
    assert image.shape == (3, 8, 8) and index == 1
    images, indices = next(iter(torch.utils.data.DataLoader(dataset, batch_size=2)))
    assert images.shape == (2, 3, 8, 8) and indices.tolist() == [0, 1]
    # a.jpg is pure red: the red channel is the highest value after normalisation
    assert bool((images[0, 0] > images[0, 1]).all())


def test_image_folder_split_rejects_in_memory_images() -> None:
    split = RetrievalSplit("s", np.zeros((1, 4, 4, 3), np.uint8), ["a cap"], np.zeros(1))
    with pytest.raises(ValueError, match="in-memory images"):
        ImageFolderSplit.from_split(split, make_test_transform(4))


# --------------------------------------------------------------------------------------------------------
# Real SEPS / SCAN files
# --------------------------------------------------------------------------------------------------------


def _link_laps_dir(tmp_path: Path, files: dict[str, Path]) -> Path:
    """A LAPS data folder of symlinks: the shared caption and id files live in different folders."""
    data = tmp_path / "data"
    data.mkdir()
    for name, target in files.items():
        (data / name).symlink_to(target)
    return data


@needs_shared
def test_real_flickr30k_test_with_seps_dense_captions(tmp_path: Path) -> None:
    dense_dir = SHARED / "seps_dense_llava"
    data = _link_laps_dir(
        tmp_path,
        {
            "test_caps.txt": SHARED / "f30k_1k_test" / "test_caps.txt",
            "test_ids.txt": dense_dir / "test_ids.txt",
            "id_mapping.json": dense_dir / "id_mapping.json",
        },
    )
    split = load_laps_split(data, "test", None, dense_jsonl=dense_dir / "f30k_test.jsonl")
    assert (split.num_images, split.num_captions) == (1000, 5000)
    assert np.array_equal(split.txt2img, torch.arange(1000).repeat_interleave(5).numpy())
    # The ids resolve, through the SEPS id mapping, to the standard 1K test file list, in order.
    assert split.images == read_lines(SHARED / "f30k_1k_test" / "test_images.txt")
    assert split.image_ids[:2] == ["25", "34"] and split.images[0] == "1007129816.jpg"
    assert split.captions[0] == "The man with pierced ears is wearing glasses and an orange hat ."
    assert len(split.dense_captions) == 1000
    assert split.dense_captions[0].startswith("The image features a man wearing a beer hat")

    rooted = load_laps_split(data, "test", tmp_path / "flickr30k-images", check_images=False)
    assert rooted.images[0] == str(tmp_path / "flickr30k-images" / "1007129816.jpg")


@needs_shared
def test_real_coco_5k_test_with_seps_dense_captions(tmp_path: Path) -> None:
    dense_dir = SHARED / "seps_dense_llava"
    data = _link_laps_dir(
        tmp_path,
        {
            "testall_caps.txt": SHARED / "coco_5k_test" / "testall_caps.txt",
            "testall_ids.txt": dense_dir / "testall_ids.txt",
        },
    )
    split = load_laps_split(data, "testall", None, dense_jsonl=dense_dir / "coco_testall.jsonl")
    assert (split.num_images, split.num_captions) == (5000, 25000)
    assert np.array_equal(split.txt2img, np.repeat(np.arange(5000), 5))
    # No COCO id mapping is distributed: the images are the COCO ids, in the 5K test order.
    assert split.image_ids == read_lines(SHARED / "coco_5k_test" / "coco5k_test_image_ids.txt")
    assert split.images[:3] == ["391895", "60623", "483108"]
    assert split.captions[0] == "A man with a red helmet on a small moped on a dirt road ."
    assert len(split.dense_captions) == 5000
    assert split.dense_captions[0].startswith("The image shows a man riding a motorcycle down a dirt road")


def _gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _letters(text: str) -> str:
    """Lower-cased letters and digits only: SCAN tokenisation ("hat .", "ca n't") compares equal to raw."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


@needs_shared
def test_real_multi30k_as_karpathy_json_matches_the_scan_test_files(tmp_path: Path) -> None:
    """The Karpathy Flickr30K test split, rebuilt from Multi30K's raw captions, lines up with SCAN's."""
    multi = SHARED / "f30k_karpathy_multi30k"
    names = read_lines(multi / "test_2016_flickr.txt")
    columns = [_gz_lines(multi / f"test_2016.{k}.en.gz") for k in range(1, 6)]  # file k = caption k-1
    entries = [
        {
            "filename": name,
            "imgid": i,
            "split": "test",
            "sentences": [{"raw": html.unescape(c[i])} for c in columns],
        }
        for i, name in enumerate(names)
    ]
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": entries}))
    split = load_karpathy_json(path, "test", None)
    assert (split.num_images, split.num_captions) == (1000, 5000)
    assert split.images == read_lines(SHARED / "f30k_1k_test" / "test_images.txt")
    assert np.array_equal(split.txt2img, np.repeat(np.arange(1000), 5))
    scan = read_lines(SHARED / "f30k_1k_test" / "test_caps.txt")
    assert [_letters(c) for c in split.captions] == [_letters(c) for c in scan]
