"""Query images shared with the retrieval or training split (identical image feature rows).

Old code: a query split built as a subset of the retrieval split was read and scored without a word (each
query's own pair in the database inflates mAP), and ``--data pairs`` with one row per caption (each image
row repeated, MS-COCO style) put a query image's other captions in the retrieval and training splits. Now
pre-split files that share query images are refused (one line naming the files, the count and the first
row pair), and a split made here takes whole images (one image's captions never straddle query /
retrieval / train)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY_HASH, one_error_line
from patchword.checkpoint import atomic_save, load_checkpoint
from patchword.cli.hash import main
from patchword.errors import DataError
from patchword.hashing import load_split_dir, split_dataset
from patchword.hashing.dataset import make_split

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = [o for o in TINY_HASH if not o.startswith(("data.synthetic_", "data.num_"))]


def _pairs(n: int, seed: int, labels: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        "image": rng.standard_normal((n, 8)).astype(np.float32),
        "text": rng.standard_normal((n, 8)).astype(np.float32),
    }
    if labels:
        out["label"] = np.eye(3, dtype=np.uint8)[np.arange(n) % 3]
    return out


def _write(root: Path, **splits: dict[str, np.ndarray]) -> Path:
    root.mkdir()
    for name, fields in splits.items():
        np.savez(root / f"{name}.npz", **fields)
    return root


def test_shared_rows_and_groups_compare_whole_rows():
    from patchword.hashing.rows import row_groups, shared_rows  # new module

    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.concatenate([a[[2]] + 100, a[[3, 1]]])
    rows, found = shared_rows(a, b)
    assert rows.tolist() == [1, 3] and found.tolist() == [2, 1]
    assert [x.size for x in shared_rows(a, b[:, :2])] == [0, 0]  # other widths share nothing
    groups, n = row_groups(np.concatenate([a[[1, 0, 1]], a[[3, 0]]]))
    assert groups.tolist() == [0, 1, 0, 2, 1] and n == 3


def test_a_query_split_inside_the_retrieval_split_is_refused(tmp_path, capsys):
    retrieval = _pairs(40, 1)
    query = {k: v[[5, 9, 12]] for k, v in retrieval.items()}  # three retrieval pairs as queries
    root = _write(tmp_path / "s", train=_pairs(20, 0), query=query, retrieval=retrieval)
    with pytest.raises(DataError) as err:
        load_split_dir(root)
    assert str(err.value) == (
        f"{root / 'query.npz'} and {root / 'retrieval.npz'}: 3 of the 3 query image rows are also retrieval "
        "image rows (identical features; first: query row 0 = retrieval row 5), so queries find their own "
        "pairs in the database, which inflates mAP; remove them from the query or the retrieval split "
        "(each image, with all its captions, belongs to one split)"
    )
    out = tmp_path / "runs"
    argv = ["train", "--data", "splits", "--root", str(root), "--output-dir", str(out), "--name", "r", *MODEL]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {root / 'query.npz'} and ")
    assert not (out / "r").exists()


def test_a_query_image_in_the_training_split_is_refused_with_or_without_labels(tmp_path):
    train = _pairs(20, 0)
    query = {k: np.concatenate([v[:2], _pairs(3, 2)[k]]) for k, v in train.items()}  # rows 0, 1: training
    root = _write(tmp_path / "lab", train=train, query=query, retrieval=_pairs(30, 1))
    with pytest.raises(
        DataError,
        match=r"2 of the 5 query image rows are also train image rows .*query row "
        r"0 = train row 0\), so the model trains on query images",
    ):
        load_split_dir(root)
    # pair-only data search the query pairs themselves (query = retrieval), but not training ones
    plain = {k: v for k, v in train.items() if k != "label"}
    held = _pairs(6, 3, labels=False)
    held["image"][4] = plain["image"][7]  # one caption of training image 7 among the queries
    root = _write(tmp_path / "pair", train=plain, query=held, retrieval=held)
    with pytest.raises(
        DataError,
        match=r"1 of the 6 query image rows are also train image rows .*query row 4 "
        r"= train row 7",
    ):
        load_split_dir(root)
    load_split_dir(
        _write(tmp_path / "ok", train=plain, query=_pairs(6, 4, False), retrieval=_pairs(6, 4, False))
    )


def _captions(images: int, per: int, seed: int = 0, labels: bool = True):
    """One row per caption: each of ``images`` image rows repeated ``per`` times, other text each row."""
    rng = np.random.default_rng(seed)
    image = np.repeat(rng.standard_normal((images, 8)).astype(np.float32), per, axis=0)
    text = rng.standard_normal((images * per, 8)).astype(np.float32)
    lab = np.repeat(np.eye(4, dtype=np.uint8)[np.arange(images) % 4], per, axis=0) if labels else None
    return make_split(image, text, lab, source="coco")


def _images(split) -> set[bytes]:
    return {row.tobytes() for row in split.image}


def test_one_image_per_caption_rows_are_split_by_image():
    full = _captions(60, 5)
    ds = split_dataset(full, num_query=10, num_train=20, seed=0)
    # the counts are images, every caption of an image goes with it
    assert (len(ds.query), len(ds.retrieval), len(ds.train)) == (50, 250, 100)
    assert not _images(ds.query) & _images(ds.retrieval) and not _images(ds.query) & _images(ds.train)
    assert _images(ds.train) <= _images(ds.retrieval)  # DJSRH / DCMH: training pairs are retrieval pairs
    assert ds.info["split_by"] == "image" and ds.info["images"] == 60
    # pair-only: query = retrieval, relevant by image (a query image finds all 5 of its captions)
    ds = split_dataset(_captions(60, 5, labels=False), num_query=10, num_train=20, seed=0)
    assert ds.query is ds.retrieval and len(ds.query) == 50 and len(ds.train) == 100
    assert not _images(ds.query) & _images(ds.train)
    assert sorted(np.bincount(ds.query.ids)[np.unique(ds.query.ids)].tolist()) == [5] * 10
    # distinct image rows: split as before, row by row
    plain = split_dataset(_captions(60, 1), num_query=10, num_train=20, seed=0)
    assert len(plain.query) == 10 and "split_by" not in plain.info


def test_hash_train_on_caption_rows_and_a_run_split_row_by_row(tmp_path, capsys):
    """``--data pairs`` of caption rows: the split counts images; a run whose last.pt says it was split row
    by row (an older version) is refused on eval: its query images were training images."""
    full = _captions(40, 5)
    np.save(tmp_path / "img.npy", full.image)
    np.save(tmp_path / "txt.npy", full.text)
    np.save(tmp_path / "lab.npy", full.labels)
    out = tmp_path / "runs"
    argv = [
        "train",
        "--data",
        "pairs",
        "--image",
        str(tmp_path / "img.npy"),
        "--text",
        str(tmp_path / "txt.npy"),
    ]
    argv += ["--labels", str(tmp_path / "lab.npy"), "--output-dir", str(out), "--name", "r", "--epochs", "1"]
    argv += [*MODEL, "data.num_query=8", "data.num_train=16"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert (data["query"], data["retrieval"], data["train"]) == (40, 160, 80)
    assert data["split_by"] == "image" and data["images"] == 40
    assert main(["eval", str(out / "r")]) == 0  # the same split by image again
    assert json.loads(capsys.readouterr().out)["data"]["query"] == 40
    state = load_checkpoint(out / "r" / "last.pt", map_location="cpu")
    del state["data_fingerprint"]["split_by"]
    atomic_save(state, out / "r" / "last.pt")
    assert main(["eval", str(out / "r")]) == 2
    assert "was trained by an older version that split these data row by row" in one_error_line(
        capsys.readouterr().err
    )
