"""A dense-caption line that records its image file is paired by that file: a file naming another image
is refused even where the line's ``metadata.image_id`` equals the split's id at its position (ids ``0..N-1``,
or ids a dense file of another dataset shares, matched any split of that size). A folder densify's lines
(``image_id`` the relative path, never the dataset id) keep pairing by file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import laps_args, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.data.dense_gaps import attach_dense
from patchword.data.laps import load_laps_split
from patchword.data.prepare import load_raw_data
from patchword.errors import DataError
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SEPS = ("model.matcher=seps", "data.max_dense_len=64")  # a model that reads dense text


def _dense(path: Path, metadata: list[dict]) -> Path:
    lines = [
        json.dumps({"text": f"a photo {k}", "model_id": "m", "metadata": m}) for k, m in enumerate(metadata)
    ]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_line_whose_file_is_another_image_is_refused_although_its_id_matches(laps_dataset, tmp_path):
    """Old code: accepted (the id matched), pairing the test images with another dataset's descriptions."""
    dense = _dense(
        tmp_path / "other.jsonl",
        [{"image_id": f"test{k}", "file": f"flickr/{900 + k}.jpg"} for k in range(4)],
    )
    cfg = apply_overrides(RunConfig(), laps_args(laps_dataset, *SEPS, f"data.dense_test={dense}"))
    image = laps_dataset["image_root"] / "test0.png"
    with pytest.raises(DataError) as caught:
        load_raw_data(cfg.data, ["test"], use_dense=True)
    assert str(caught.value) == (
        f"{dense}:1: the line describes image_id 'test0', file 'flickr/900.jpg', but image 0 of the split is "
        f"id 'test0' ({image}); dense captions must follow the split's image order; its metadata.image_id "
        "is this image's id, but its metadata.file names another image; it is not an image of this split "
        "(a dense file of another split?)"
    )


def test_the_refusal_is_one_error_line_at_the_cli(laps_dataset, tmp_path, capsys):
    dense = _dense(
        tmp_path / "other.jsonl",
        [{"image_id": f"test{k}", "file": f"flickr/{900 + k}.jpg"} for k in range(4)],
    )
    args = laps_args(
        laps_dataset,
        *SEPS,
        "data.dev_from_train=2",
        f"data.dense_train={laps_dataset['dense_train']}",
        f"data.dense_test={dense}",
    )
    runs = tmp_path / "runs"
    assert main(["train", *args, f"output_dir={runs}", "name=r"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {dense}:1: the line describes image_id 'test0', file 'flickr/900.jpg', but image 0 "
    )
    assert not (runs / "r").exists()


def test_a_line_whose_file_is_the_image_at_another_place_names_where(laps_dataset, tmp_path):
    """The ids say 0, 1, 2, 3 but the files are in another order: the file decides, naming where it is."""
    files = ["test1.png", "test0.png", "test2.png", "test3.png"]
    dense = _dense(
        tmp_path / "swapped.jsonl", [{"image_id": f"test{k}", "file": f} for k, f in enumerate(files)]
    )
    with pytest.raises(
        DataError, match=r":1: .*; that is image 1 of the split, so the lines are in another order"
    ):
        load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"], dense_jsonl=dense)


def test_folder_densify_lines_still_pair_by_file(laps_dataset, tmp_path):
    """A folder densify records the relative path as its image_id, never the dataset id: the file pairs."""
    dense = _dense(
        tmp_path / "folder.jsonl", [{"image_id": f"test{k}.png", "file": f"test{k}.png"} for k in range(4)]
    )
    split = load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"], dense_jsonl=dense)
    assert split.dense_captions == [f"a photo {k}" for k in range(4)]
    # and lines that record only the dataset id pair by it, as before
    ids_only = _dense(tmp_path / "ids.jsonl", [{"image_id": f"test{k}"} for k in range(4)])
    split = load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"], dense_jsonl=ids_only)
    assert split.dense_captions == [f"a photo {k}" for k in range(4)]


def test_lines_missing_for_unusable_images_are_placed_by_file_too(laps_dataset, tmp_path):
    """data.skip_bad_images places a file of fewer lines by what each records: old code placed a line whose
    file is another image at the image its id names."""
    split = load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"])
    good = _dense(
        tmp_path / "good.jsonl", [{"image_id": f"test{k}", "file": f"test{k}.png"} for k in (0, 2, 3)]
    )
    assert attach_dense(split, good, missing_ok=True).dense_captions == [
        "a photo 0",
        "",
        "a photo 1",
        "a photo 2",
    ]
    other = _dense(
        tmp_path / "other.jsonl", [{"image_id": f"test{k}", "file": f"x/{k}.jpg"} for k in (0, 2, 3)]
    )
    with pytest.raises(ValueError, match=r"3 dense captions for a split of 4 images"):
        attach_dense(split, other, missing_ok=True)


def test_a_line_whose_file_is_its_id_pairs_by_the_id(laps_dataset, tmp_path):
    """``densify --synthetic`` records a scene's id as its file too (no extension): such a file, densified
    from the scenes a LAPS export of them holds as ``ID.png``, pairs by the id (as before the file rule)."""
    dense = _dense(
        tmp_path / "scenes.jsonl", [{"image_id": f"test{k}", "file": f"test{k}"} for k in range(4)]
    )
    split = load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"], dense_jsonl=dense)
    assert split.dense_captions == [f"a photo {k}" for k in range(4)]
    # a file-equals-id line of another image is still refused
    shifted = _dense(
        tmp_path / "shifted.jsonl", [{"image_id": f"test{k}", "file": f"test{k}"} for k in (1, 0, 2, 3)]
    )
    with pytest.raises(DataError, match="dense captions must follow the split's image order"):
        load_laps_split(laps_dataset["root"], "test", laps_dataset["image_root"], dense_jsonl=shifted)
