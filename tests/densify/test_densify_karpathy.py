"""``patchword densify --karpathy dataset_*.json --split S --image-root DIR``: the images of a Karpathy split
in the order the ``karpathy`` loader reads them, each line recording the loader's image id and file, so the
output is accepted as ``data.dense_<split>`` with ``data.dataset=karpathy``.

Defect: densify read only the LAPS layout (``--data-root``) or a folder (``--images``, sorted by file name),
so a Karpathy user had no way to write a dense file in the split's own order; the loader refused the folder
output and its hint (``--data-root/--split``) was one they could not follow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import one_error_line
from densify_support import RUN, write_images
from patchword.cli.densify import main
from patchword.data.config import DataConfig
from patchword.data.karpathy import load_karpathy_json
from patchword.data.prepare import load_raw_data
from patchword.densify.store import read_records

pytestmark = pytest.mark.usefixtures("one_thread")

# The json's images[], in json order: (split, filepath, filename, id field). Each split's json order is
# neither its file-name order nor its id order; train takes the restval image (as the loader does), two
# train images sit in a COCO-style sub-folder with a ``cocoid``, and ``dev`` is the json's ``val``.
ENTRIES = [
    ("train", "train2014", "30.png", {"cocoid": 9030}),
    ("test", "", "4.png", {"imgid": 101}),
    ("test", "", "10.png", {"imgid": 102}),
    ("val", "", "7.png", {"imgid": 103}),
    ("restval", "val2014", "11.png", {"cocoid": 9011}),
    ("test", "", "2.png", {"imgid": 105}),
    ("train", "", "3.png", {"imgid": 106}),
    ("test", "", "1.png", {"imgid": 99}),
    ("val", "", "8.png", {"imgid": 100}),
]
#: What the loader makes of ENTRIES, split by split: (image id, file relative to the image root).
EXPECTED = {
    "test": [("101", "4.png"), ("102", "10.png"), ("105", "2.png"), ("99", "1.png")],
    "train": [("9030", "train2014/30.png"), ("9011", "val2014/11.png"), ("106", "3.png")],
    "dev": [("103", "7.png"), ("100", "8.png")],
}


@pytest.fixture
def karpathy(tmp_path) -> tuple[Path, Path]:
    """``(dataset json, image root)`` of ENTRIES with two captions per image."""
    images = []
    for k, (split, filepath, filename, ids) in enumerate(ENTRIES):
        entry = {"split": split, "filename": filename, **ids}
        if filepath:
            entry["filepath"] = filepath
        entry["sentences"] = [{"raw": f"photo {k} caption {j}"} for j in range(2)]
        images.append(entry)
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": images}))
    root = tmp_path / "images"
    write_images(root, [str(Path(filepath, filename)) for _, filepath, filename, _ in ENTRIES])
    return path, root


def _densify(path: Path, root: Path, split: str, out: Path) -> int:
    return main(
        ["--karpathy", str(path), "--split", split, "--image-root", str(root), "--out", str(out), *RUN]
    )


@pytest.mark.parametrize("split", ["test", "train", "dev", "val", "restval"])
def test_the_karpathy_source_is_the_loaders_split_in_its_order(karpathy, split):
    from patchword.densify.sources import images_from_karpathy  # the source the old code lacked

    path, root = karpathy
    images = images_from_karpathy(path, split, root)
    loaded = load_karpathy_json(path, split, root)  # the call data.dataset=karpathy makes (defaults)
    assert images.image_ids == loaded.image_ids
    assert [str(item.path) for item in images.items] == loaded.images
    assert [item.file for item in images.items] == [
        Path(image).relative_to(root).as_posix() for image in loaded.images
    ]
    if split in EXPECTED:
        assert (
            list(zip(images.image_ids, [item.file for item in images.items], strict=True)) == EXPECTED[split]
        )
    assert images.source == {
        "kind": "karpathy",
        "json": str(path.resolve()),
        "split": split,
        "image_root": str(root.resolve()),
    }


def test_karpathy_dense_files_are_accepted_as_the_splits_dense_captions(karpathy, tmp_path):
    """Each role's densify output, given as data.dense_<role> with data.dataset=karpathy, loads through
    load_raw_data (the reader of train, eval and `data check`), one text per image in the split's order."""
    path, root = karpathy
    dense = {role: tmp_path / f"{role}_dense.jsonl" for role in EXPECTED}
    for role, out in dense.items():
        assert _densify(path, root, role, out) == 0
        records = read_records(out)[0]
        assert [(r.image_id, r.metadata["file"]) for r in records] == EXPECTED[role]
    dc = DataConfig(
        dataset="karpathy",
        root=str(path),
        image_root=str(root),
        **{f"dense_{role}": str(out) for role, out in dense.items()},
    )
    raw = load_raw_data(dc)  # every image decoded (data.check_images), every line's identity checked
    for role, out in dense.items():
        split = raw.splits[role]
        assert split.image_ids == [image_id for image_id, _ in EXPECTED[role]]
        assert split.dense_captions == [r.text for r in read_records(out)[0]]


def test_data_check_accepts_the_karpathy_dense_file(karpathy, tmp_path):
    """`patchword data check` (its check_dataset) on the test split with the densify output as dense_test."""
    from patchword.cli.data import check_dataset
    from patchword.config import apply_overrides
    from patchword.runs.config import RunConfig

    path, root = karpathy
    out = tmp_path / "test_dense.jsonl"
    assert _densify(path, root, "test", out) == 0
    cfg = apply_overrides(
        RunConfig(),
        ["data.dataset=karpathy", f"data.root={path}", f"data.image_root={root}", f"data.dense_test={out}"],
    )
    (row,) = check_dataset(cfg, ["test"])
    assert "error" not in row, row["error"]
    assert (row["images"], row["dense"], row["bad_images"]) == (4, "4/4", 0)


def _documented_karpathy_training() -> list[str]:
    """The ``patchword train data.dataset=karpathy ...`` command of docs/densify.md, as its words (the lines
    it continues with ``\\`` joined)."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / "densify.md").read_text().splitlines()
    start = next(
        k for k, line in enumerate(lines) if line.startswith("patchword train data.dataset=karpathy")
    )
    words = []
    for line in lines[start:]:
        words += line.rstrip("\\").split()
        if not line.endswith("\\"):
            return words
    raise AssertionError("the command's last line ends with a backslash")


def test_the_documented_karpathy_training_command_runs(karpathy, tmp_path):
    """Old docs: the command lacked data.dense_dev, and training refused it (`error: data.dense_dev: is not
    set ...`). Each data.dense_<role> it names is densified with ``--split <role>`` into a file of that name,
    the json and image folder are the tiny ones, and ``...`` is a one-step tiny SEPS model."""
    from patchword.cli import main as patchword_main

    path, root = karpathy
    words = _documented_karpathy_training()
    assert words[:2] == ["patchword", "train"] and words[-1] == "..."
    here = {"data.root": str(path), "data.image_root": str(root)}
    overrides = []
    for word in words[2:-1]:
        key, _, value = word.partition("=")
        if key.startswith("data.dense_"):
            here[key] = str(tmp_path / Path(value).name)
            assert _densify(path, root, key.removeprefix("data.dense_"), Path(here[key])) == 0
        overrides.append(f"{key}={here.get(key, value)}")
    tiny = [
        "model.name=seps-tiny-32",
        "data.image_size=32",
        "train.batch_size=2",
        "train.max_steps=1",
        "train.num_threads=1",
        "data.num_workers=0",
        "eval.max_memory_mb=1",
    ]
    assert patchword_main(["train", *overrides, *tiny, f"output_dir={tmp_path / 'runs'}", "name=k"]) == 0
    assert (tmp_path / "runs" / "k" / "best.pt").is_file()


# --------------------------------------------------------------------------------------------------------
# refusals: nothing is written
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "other", [["--images", "imgs"], ["--data-root", "laps"], ["--synthetic", "test"]], ids=lambda o: o[0]
)
def test_karpathy_with_another_source_is_refused_naming_both(other, karpathy, tmp_path, capsys):
    path, root = karpathy
    out = tmp_path / "out" / "d.jsonl"
    argv = ["--karpathy", str(path), *other, "--split", "test", "--image-root", str(root), "--out", str(out)]
    with pytest.raises(SystemExit) as stop:
        main([*argv, *RUN])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"patchword densify: error: argument {other[0]}: not allowed with argument --karpathy"
    )
    assert not out.parent.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--synthetic-seed", "3"],
            "--synthetic-seed: is read only with --synthetic; --karpathy does not read it",
        ),
        (
            ["--synthetic-num-images", "2"],
            "--synthetic-num-images: is read only with --synthetic; --karpathy does not read it",
        ),
    ],
)
def test_karpathy_refuses_an_option_of_another_source(flags, expected, karpathy, tmp_path, capsys):
    path, root = karpathy
    out = tmp_path / "out" / "d.jsonl"
    argv = ["--karpathy", str(path), "--split", "test", "--image-root", str(root), *flags, "--out", str(out)]
    assert main([*argv, *RUN]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {expected}: drop it"
    assert not out.parent.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--split", "test"],
            "--split: is read only with --data-root or --karpathy; --images does not read it",
        ),
        (
            ["--image-root", "x"],
            "--image-root: is read only with --data-root or --karpathy; --images does not",
        ),
    ],
)
def test_an_option_both_splits_read_names_both_when_refused(flags, expected, tmp_path, capsys):
    """--split and --image-root belong to --data-root and --karpathy alike: the refusal names both."""
    images = tmp_path / "imgs"
    write_images(images, ["a.png"])
    out = tmp_path / "out" / "d.jsonl"
    assert main(["--images", str(images), *flags, "--out", str(out), *RUN]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {expected}")
    assert not out.parent.exists()


@pytest.mark.parametrize(
    ("drop", "expected"),
    [
        ("--split", "--karpathy needs --split"),
        ("--image-root", "--karpathy needs --image-root"),
    ],
)
def test_karpathy_without_its_split_or_image_root_is_refused(drop, expected, karpathy, tmp_path, capsys):
    """No default image root: a Karpathy json does not sit with its images (data.image_root is separate)."""
    path, root = karpathy
    given = {"--split": "test", "--image-root": str(root)}
    out = tmp_path / "out" / "d.jsonl"
    argv = ["--karpathy", str(path), *(x for k, v in given.items() if k != drop for x in (k, v))]
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--out", str(out), *RUN])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"patchword densify: error: {expected}")
    assert not out.parent.exists()


def test_an_unknown_karpathy_split_is_one_line_naming_the_json(karpathy, tmp_path, capsys):
    path, root = karpathy
    out = tmp_path / "out" / "d.jsonl"
    assert _densify(path, root, "testall", out) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: ") and "unknown Karpathy split 'testall'" in line
    assert not out.parent.exists()


@pytest.mark.parametrize("what", ["missing", "folder"])
def test_a_karpathy_json_that_is_not_a_file_names_the_flag(what, karpathy, tmp_path, capsys):
    _, root = karpathy
    path = tmp_path / ("nope.json" if what == "missing" else "images")
    out = tmp_path / "out" / "d.jsonl"
    assert _densify(path, root, "test", out) == 2
    expected = {
        "missing": f"error: --karpathy: Karpathy dataset json not found: {path}",
        "folder": f"error: --karpathy: {path} is a folder: --karpathy names the dataset_*.json file",
    }[what]
    assert one_error_line(capsys.readouterr().err) == expected
    assert not out.parent.exists()
