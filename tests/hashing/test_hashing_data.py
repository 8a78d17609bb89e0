"""Hashing data: UCMFH split files (npz, restricted pickle), .mat layouts, paired .npy, protocols,
validation messages, the synthetic generator and the real data in ../shared/data."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from patchword.hashing import (
    load_mat,
    load_mirflickr25k_text,
    load_pairs,
    load_split,
    load_split_dir,
    make_split,
    make_synthetic_multilabel,
    map_at_k,
    recall_at_k,
    split_dataset,
    synthetic_dataset,
)
from project_paths import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")


SHARED = SHARED_DATA
CLIP_DIR = SHARED / "f30k_first1000_clipL14"
MIR_DIR = SHARED / "mirflickr25k_text"


def arrays(n: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.standard_normal((n, 8)).astype(np.float32),
        "text": rng.standard_normal((n, 6)),
        "label": (rng.random((n, 4)) < 0.4).astype(np.int64),
    }


def write_split_dir(root: Path, ext: str = ".npz") -> None:
    root.mkdir(exist_ok=True)
    for i, name in enumerate(("train", "query", "retrieval")):
        data = arrays(10 + i, seed=i)
        if ext == ".npz":
            np.savez(root / f"{name}.npz", **data)
        else:
            (root / f"{name}{ext}").write_bytes(pickle.dumps(data))


@pytest.mark.parametrize("ext", [".npz", ".pkl"])
def test_split_dir_roundtrip(tmp_path, ext):
    write_split_dir(tmp_path / "d", ext)
    ds = load_split_dir(tmp_path / "d")
    assert (len(ds.train), len(ds.query), len(ds.retrieval)) == (10, 11, 12)
    assert ds.image_dim == 8 and ds.text_dim == 6 and ds.has_labels
    assert ds.train.image.dtype == np.float32 and ds.train.labels.dtype == np.uint8
    np.testing.assert_allclose(ds.query.text, arrays(11, 1)["text"].astype(np.float32))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickle_reader_refuses_code(tmp_path):
    path = tmp_path / "train.pkl"
    path.write_bytes(pickle.dumps({"image": np.zeros((2, 2)), "text": _Evil(), "label": np.ones((2, 1))}))
    with pytest.raises(ValueError, match="refusing to unpickle posix.system|refusing to unpickle os.system"):
        load_split(path)
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match="dict of arrays"):
        load_split(path)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.pop("text"), "missing field 'text'"),
        (lambda d: d.update(text=d["text"][:-1]), "field 'text' has 9 rows but field 'image' has 10"),
        (
            lambda d: d["image"].__setitem__((3, 2), np.nan),
            "field 'image' has 1 NaN/inf value\\(s\\), first in row 3",
        ),
        (lambda d: d.update(label=d["label"][:7]), "field 'label' has 7 rows but the features have 10"),
        (lambda d: d.update(label=d["label"] * 2), "must be 0/1 multi-hot"),
        (lambda d: d.update(image=np.zeros((10, 3, 4, 4))), "raw images"),
    ],
)
def test_validation_messages_name_file_and_field(tmp_path, mutate, match):
    data = arrays()
    mutate(data)
    path = tmp_path / "query.npz"
    np.savez(path, **data)
    with pytest.raises(ValueError, match=match) as err:
        load_split(path)
    assert str(path) in str(err.value)


def test_missing_split_file(tmp_path):
    write_split_dir(tmp_path / "d")
    (tmp_path / "d" / "query.npz").unlink()
    with pytest.raises(FileNotFoundError, match="missing query.npz"):
        load_split_dir(tmp_path / "d")


def test_mat_layouts(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    whole = arrays(40)
    scipy_io.savemat(
        tmp_path / "whole.mat", {"IAll": whole["image"], "YAll": whole["text"], "LAll": whole["label"]}
    )
    ds = load_mat(tmp_path / "whole.mat", num_query=10, num_train=20, seed=0)
    assert (len(ds.train), len(ds.query), len(ds.retrieval)) == (20, 10, 30)
    # query and retrieval are disjoint, train is inside retrieval (DJSRH convention)
    assert not np.isin(ds.query.ids, ds.retrieval.ids).any() and np.isin(ds.train.ids, ds.retrieval.ids).all()
    pre = {}
    for s, n in (("tr", 5), ("te", 6), ("db", 7)):
        a = arrays(n, seed=n)
        pre.update({f"I_{s}": a["image"], f"T_{s}": a["text"], f"L_{s}": a["label"]})
    scipy_io.savemat(tmp_path / "split.mat", pre)
    ds = load_mat(tmp_path / "split.mat")
    assert (len(ds.train), len(ds.query), len(ds.retrieval)) == (5, 6, 7)
    scipy_io.savemat(tmp_path / "bad.mat", {"IAll": whole["image"], "LAll": whole["label"]})
    with pytest.raises(ValueError, match="bad.mat: missing field 'text'"):
        load_mat(tmp_path / "bad.mat")


def test_pairs_protocol(tmp_path):
    data = arrays(30)
    np.save(tmp_path / "img.npy", data["image"])
    np.save(tmp_path / "txt.npy", data["text"])
    full = load_pairs(tmp_path / "img.npy", tmp_path / "txt.npy")
    assert full.labels is None and full.relevance.tolist() == list(range(30))
    ds = split_dataset(full, num_query=8, num_train=100, seed=0)
    assert ds.query is ds.retrieval and len(ds.train) == 22  # train = all remaining pairs, disjoint
    assert not np.isin(ds.train.ids, ds.query.ids).any()
    np.save(tmp_path / "short.npy", data["text"][:29])
    with pytest.raises(ValueError, match="has 29 rows"):
        load_pairs(tmp_path / "img.npy", tmp_path / "short.npy")


def test_synthetic_generator():
    a, b = make_synthetic_multilabel(200, seed=3), make_synthetic_multilabel(200, seed=3)
    np.testing.assert_array_equal(a.image, b.image)
    assert a.image.shape == (200, 512) and a.labels.shape == (200, 24)
    assert a.labels.sum(1).min() >= 1 and a.labels.sum(1).max() <= 4
    np.testing.assert_allclose(np.linalg.norm(a.text, axis=1), 1, atol=1e-5)
    ds = synthetic_dataset(num_train=50, num_query=20, num_retrieval=100, seed=0)
    # same-modality search works from the features; raw cross-modal search is near chance (must be learned)
    same = map_at_k(
        ds.query.image, ds.retrieval.image, ds.query.labels, ds.retrieval.labels, 10, measure="cosine"
    )
    assert same > 0.8
    with pytest.raises(ValueError, match="field 'label' has 2 rows"):
        make_split(np.ones((3, 2)), np.ones((3, 2)), np.ones((2, 2)))


@pytest.mark.skipif(not CLIP_DIR.is_dir(), reason="shared CLIP embeddings not present")
def test_real_clip_pairs():
    full = load_pairs(CLIP_DIR / "flickr30k_image_embeddings.npy", CLIP_DIR / "flickr30k_text_embeddings.npy")
    assert full.image.shape == (1000, 768)
    # the documented reference recall of these embeddings (SOURCES.md): i2t R@1 74.7, t2i R@1 71.7. Ranked
    # in float32; no CPU's rounding can move them: no score lies within 1e-5 of a ground truth's at R@1/10
    # (measured in float64)
    i2t = recall_at_k(full.image, full.text, full.ids, full.ids, [1, 10], measure="cosine")
    t2i = recall_at_k(full.text, full.image, full.ids, full.ids, [1], measure="cosine")
    assert (
        i2t[1] == pytest.approx(0.747) and i2t[10] == pytest.approx(0.970) and t2i[1] == pytest.approx(0.717)
    )


@pytest.mark.skipif(not MIR_DIR.is_dir(), reason="shared MIRFlickr-25K text not present")
def test_real_mirflickr_text():
    bow, labels, vocab = load_mirflickr25k_text(MIR_DIR)
    assert bow.shape == (20015, 1386) and labels.shape == (20015, 24) and len(vocab) == 1386
    assert labels.sum(1).min() >= 1  # the cleaned set: every image has a label
