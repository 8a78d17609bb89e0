"""Damaged image files in a LAPS-layout dataset: `data check` decodes every image completely and lists the
truncated ones, `train` and `eval` refuse a split holding one (one error line, nothing written), and
``data.skip_bad_images=true`` leaves them and their captions out, exactly as if they were not in the split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import laps_args, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _truncate(path: Path, keep: float = 0.6) -> None:
    """Cut a valid image file to ``keep`` of its bytes: the header stays readable, the pixels do not."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_data_check_decodes_every_image_and_lists_the_truncated_ones(laps_dataset, capsys):
    """It used to read headers only and answer "ok, bad_images 0" for truncated files."""
    images = laps_dataset["image_root"]
    _truncate(images / "train3.png")
    _truncate(images / "test1.png")
    _truncate(images / "test2.png", keep=0.9)
    assert main(["data", "check", *laps_args(laps_dataset)]) == 2
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] in (["train"], ["test"])
    }
    assert rows["train"][-1] == "1" and rows["test"][-1] == "2"  # the bad_images column
    listed = [line.strip() for line in out.splitlines() if line.startswith("    ")]
    assert [line.split(": ", 1)[0] for line in listed] == [
        str(images / name) for name in ("train3.png", "test1.png", "test2.png")
    ]
    assert all(": truncated file, cannot be decoded completely" in line for line in listed)
    assert out.strip().splitlines()[-1] == "2 split(s) with problems"


def test_train_refuses_truncated_images_before_writing_anything(laps_dataset, tmp_path, capsys):
    images, runs = laps_dataset["image_root"], tmp_path / "runs"
    for name in ("train1.png", "train3.png", "train4.png", "train6.png"):
        _truncate(images / name)
    assert main(["train", *laps_args(laps_dataset, f"output_dir={runs}", "name=r")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: 4 of 8 image files of the train split are unusable: ")
    assert f"{images / 'train1.png'}: truncated file" in line and str(images / "train4.png") in line
    assert "(and 1 more)" in line and "data.skip_bad_images=true" in line
    assert not runs.exists()


def test_skip_bad_images_leaves_them_and_their_captions_out(laps_dataset):
    from patchword.config import apply_overrides
    from patchword.data.prepare import load_raw_data
    from patchword.runs.config import RunConfig

    dense = [
        f"data.dense_train={laps_dataset['dense_train']}",
        f"data.dense_test={laps_dataset['dense_test']}",
    ]
    cfg = apply_overrides(RunConfig(), laps_args(laps_dataset, *dense))
    full = load_raw_data(cfg.data, ["train"], use_dense=True).splits["train"]
    _truncate(laps_dataset["image_root"] / "train2.png")
    (laps_dataset["image_root"] / "train5.png").unlink()  # missing files are left out too
    skipping = apply_overrides(cfg, ["data.skip_bad_images=true"])
    split = load_raw_data(skipping.data, ["train"], use_dense=True).splits["train"]
    expected = full.subset([0, 1, 3, 4, 6, 7])
    assert split.images == expected.images and split.image_ids == expected.image_ids
    assert split.captions == expected.captions and split.txt2img.tolist() == expected.txt2img.tolist()
    assert split.dense_captions == expected.dense_captions and split.name == full.name
    assert (split.num_images, split.num_captions) == (6, 12)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["data.dataset=synthetic", "data.synthetic_image_size=32"],
            "data.skip_bad_images: applies to image-file datasets",
        ),
        (["data.check_images=false"], "data.skip_bad_images: needs data.check_images=true"),
    ],
)
def test_skip_bad_images_is_validated(laps_dataset, tmp_path, capsys, extra, expected):
    runs = tmp_path / "runs"
    args = laps_args(laps_dataset, f"output_dir={runs}", "name=r", "data.skip_bad_images=true", *extra)
    assert main(["train", *args]) == 2
    assert expected in one_error_line(capsys.readouterr().err)
    assert not runs.exists()


def _without_image(paths: dict[str, Path], dest: Path, split: str, image_id: str) -> dict[str, Path]:
    """A copy of the dataset's caption files without ``image_id`` (its captions and dense caption)."""
    shutil.copytree(paths["root"], dest, ignore=shutil.ignore_patterns("images"))
    ids = (dest / f"{split}_ids.txt").read_text().splitlines()
    caps = (dest / f"{split}_caps.txt").read_text().splitlines()
    keep = [i for i, line in enumerate(ids) if line != image_id]
    (dest / f"{split}_ids.txt").write_text("".join(ids[i] + "\n" for i in keep))
    (dest / f"{split}_caps.txt").write_text("".join(caps[i] + "\n" for i in keep))
    return {**paths, "root": dest}


def test_eval_refuses_a_truncated_test_image_or_scores_the_split_without_it(laps_dataset, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", *laps_args(laps_dataset, f"output_dir={runs}", "name=r")]) == 0
    run = runs / "r"
    clean = _without_image(laps_dataset, tmp_path / "clean", "test", "test1")
    assert main(["eval", str(run), "--out", str(tmp_path / "ref.json"), f"data.root={clean['root']}"]) == 0
    reference = json.loads((tmp_path / "ref.json").read_text())
    _truncate(laps_dataset["image_root"] / "test1.png")
    capsys.readouterr()
    out = tmp_path / "e.json"
    assert main(["eval", str(run), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        f"1 of 4 image files of the test split are unusable: {laps_dataset['image_root'] / 'test1.png'}"
        in line
    )
    assert not out.exists()
    assert main(["eval", str(run), "--out", str(out), "data.skip_bad_images=true"]) == 0
    metrics = json.loads(out.read_text())
    for key in ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5", "rsum"):
        assert metrics[key] == pytest.approx(reference[key], abs=1e-9), key
    assert metrics["overrides"] == ["data.skip_bad_images=true"]
