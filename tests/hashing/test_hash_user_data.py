"""User data that was read without complaint but meant nothing (or crashed): pair-only split folders of
unrelated pairs, labels without any 1, huge or column-vector class ids, complex or float32-overflowing
features, old-protocol pickles, ambiguous split files and ``.mat`` keys. Each is one clear error naming the
file (exit 2 at the CLI, nothing written) or, where the data is good, read as it says."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from conftest import TINY_HASH, one_error_line
from patchword.cli.hash import main
from patchword.errors import DataError
from patchword.hashing import load_mat, load_pairs, load_split, load_split_dir
from patchword.hashing.dataset import multi_hot_labels

pytestmark = pytest.mark.usefixtures("one_thread")

# TINY_HASH for split folders: the files decide the split sizes, and only generated data has synthetic_*
SPLIT_KEYS = [o for o in TINY_HASH if not o.startswith(("data.synthetic_", "data.num_"))]


def _pairs(n: int, seed: int, *, labels: bool = False, ids=None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {
        "image": rng.standard_normal((n, 8)).astype(np.float32),
        "text": rng.standard_normal((n, 8)).astype(np.float32),
    }
    if labels:
        out["label"] = np.eye(3, dtype=np.uint8)[np.arange(n) % 3]
    if ids is not None:
        out["ids"] = np.asarray(ids, dtype=np.int64)
    return out


def _write(root: Path, **splits: dict[str, np.ndarray]) -> Path:
    root.mkdir()
    for name, fields in splits.items():
        np.savez(root / f"{name}.npz", **fields)
    return root


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------ 1. pair-only splits


def test_pair_only_splits_of_unrelated_pairs_are_refused(tmp_path):
    """Position ids made query row i "the pair" of retrieval row i whatever the files held: a meaningless
    "relevance": "pair" mAP was trained and reported."""
    root = _write(tmp_path / "s", train=_pairs(20, 0), query=_pairs(5, 1), retrieval=_pairs(30, 2))
    with pytest.raises(DataError, match="query row 0 vs retrieval row 0") as err:
        load_split_dir(root)
    assert str(err.value).startswith(f"{root}: no labels and no `ids`")
    assert str(err.value).endswith(
        "give `ids` in query/retrieval, or make the query rows the retrieval pairs with the same ids"
    )


def test_pair_only_splits_holding_the_same_pairs_or_given_ids_are_read(tmp_path):
    retrieval = _pairs(30, 2)
    same = {k: v[:5] for k, v in retrieval.items()}  # query rows = the retrieval pairs of their position
    ds = load_split_dir(_write(tmp_path / "same", train=_pairs(20, 0), query=same, retrieval=retrieval))
    assert ds.query.ids.tolist() == [0, 1, 2, 3, 4] and not ds.has_labels
    # explicit ids declare which pairs are the same: trusted (other features of the same pair are allowed)
    ds = load_split_dir(
        _write(
            tmp_path / "ids",
            train=_pairs(20, 0, ids=range(100, 120)),
            query=_pairs(5, 1, ids=[7, 3, 9, 0, 1]),
            retrieval=_pairs(30, 2, ids=range(30)),
        )
    )
    assert ds.query.ids.tolist() == [7, 3, 9, 0, 1]


def test_pair_only_splits_need_every_query_id_in_the_retrieval_set(tmp_path):
    """Was accepted when any one query id occurred (.any()): the others had nothing relevant."""
    root = _write(
        tmp_path / "s",
        train=_pairs(20, 0, ids=range(100, 120)),
        query=_pairs(5, 1, ids=[0, 1, 2, 50, 51]),
        retrieval=_pairs(30, 2, ids=range(30)),
    )
    with pytest.raises(
        DataError, match=r"2 query pair id\(s\) occur in no retrieval pair \(first: query row 3"
    ):
        load_split_dir(root)


def test_pair_only_splits_whose_retrieval_ids_are_all_one_are_refused(tmp_path):
    """Accepted: every retrieval item was relevant to every query (an id column read as a constant), and
    every metric came out 1.0."""
    root = _write(
        tmp_path / "s",
        train=_pairs(20, 0, ids=range(100, 120)),
        query=_pairs(5, 1, ids=[4] * 5),
        retrieval=_pairs(30, 2, ids=[4] * 30),
    )
    with pytest.raises(DataError) as err:
        load_split_dir(root)
    assert str(err.value) == (
        f"{root}: no labels, and every retrieval pair has id 4, so every retrieval item is relevant to every "
        "query (every metric would be 1.0); give each pair its own id (pairs of one image may share one)"
    )


def test_hash_train_refuses_unrelated_pair_splits_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "s", train=_pairs(20, 0), query=_pairs(5, 1), retrieval=_pairs(30, 2))
    before = _snapshot(tmp_path)
    argv = [
        "train",
        "--data",
        "splits",
        "--root",
        "s",
        "--bits",
        "8",
        "--epochs",
        "1",
        "--output-dir",
        "runs",
    ]
    assert main([*argv, *SPLIT_KEYS]) == 2
    assert "give `ids` in query/retrieval" in one_error_line(capsys.readouterr().err)
    assert _snapshot(tmp_path) == before and not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ 2. labels


def test_labels_without_any_one_are_refused_naming_the_file(tmp_path):
    fields = _pairs(10, 0)
    np.savez(tmp_path / "query.npz", **fields, label=np.zeros((10, 3), np.uint8))
    with pytest.raises(DataError, match=r"query.npz: field 'label' has no 1 at all") as err:
        load_split(tmp_path / "query.npz")
    assert str(err.value).startswith(str(tmp_path / "query.npz"))


def test_unlabelled_rows_and_one_shared_label_are_warned(caplog):
    labels = np.array([[1, 0], [0, 0], [0, 0], [1, 1]], np.uint8)
    with caplog.at_level(logging.WARNING, logger="patchword.hashing.dataset"):
        multi_hot_labels(labels, "f.npz", "label", 4)
    assert "f.npz: 2 of 4 rows of field 'label' have no label" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="patchword.hashing.dataset"):
        out = multi_hot_labels(np.array([4, 4, 4]), "f.npz", "label", 3)
    assert out.tolist() == [[1], [1], [1]]
    assert "every pair shares a label" in caplog.text


def test_class_ids_map_to_columns_in_order_without_a_column_per_value():
    """A class id of 1e9 allocated an (N, 1e9 + 1) array (MemoryError traceback)."""
    out = multi_hot_labels(np.array([0, 2, 1, 2, 0]), "f", "label", 5)
    assert out.tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 1], [1, 0, 0]]  # column c = class c
    big = multi_hot_labels(np.array([3, 10**9, 3, 7]), "f", "label", 4)
    assert big.shape == (4, 3) and big.tolist() == [[1, 0, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0]]


@pytest.mark.parametrize("shape", [(-1, 1), (1, -1), (-1,)], ids=["column", "row", "vector"])
def test_matlab_column_of_class_ids_is_read_like_a_vector(shape):
    """The (n, 1) column was refused as "must be 0/1 multi-hot" while the (1, n) row was read as ids."""
    ids = np.array([1, 3, 2, 3, 1, 2]).reshape(shape)
    out = multi_hot_labels(ids, "m.mat", "LAll", 6)
    assert out.tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0]]
    # an (n, 1) column of 0/1 stays one multi-hot label column
    assert multi_hot_labels(np.array([[1], [0], [1]]), "m.mat", "LAll", 3).tolist() == [[1], [0], [1]]


def test_split_files_give_a_class_the_same_column(tmp_path):
    """Per-file class columns would give class 1e9 column 1 in one file and 2 in another."""
    root = _write(
        tmp_path / "s",
        train={**_pairs(4, 0), "label": np.array([0, 5, 10**9, 5])},
        query={**_pairs(2, 1), "label": np.array([0, 10**9])},
        retrieval={**_pairs(3, 2), "label": np.array([10**9, 5, 0])},
    )
    ds = load_split_dir(root)
    assert ds.query.labels.tolist() == [[1, 0, 0], [0, 0, 1]]
    assert ds.retrieval.labels.tolist() == [[0, 0, 1], [0, 1, 0], [1, 0, 0]]


def test_pre_split_mat_gives_a_class_the_same_column(tmp_path):
    arrays = {}
    for s, lab in (("tr", [0, 4, 9]), ("te", [9, 4]), ("db", [4, 0, 9])):
        fields = _pairs(len(lab), len(lab))
        arrays.update({f"I_{s}": fields["image"], f"T_{s}": fields["text"], f"L_{s}": np.array(lab)})
    scipy.io.savemat(tmp_path / "p.mat", arrays)  # MATLAB saves the vectors as (1, n) rows
    ds = load_mat(tmp_path / "p.mat")
    assert ds.query.labels.tolist() == [[0, 0, 1], [0, 1, 0]]


# ----------------------------------------------------------------------------------------- 3. pickles


@pytest.mark.parametrize("protocol", range(6))
def test_pickled_arrays_of_every_protocol_are_read(tmp_path, protocol):
    """Protocols 0-2 store array bytes via _codecs.encode: refused as code before."""
    fields = {**_pairs(6, 0), "label": np.eye(3, dtype=np.uint8)[[0, 1, 2, 0, 1, 2]]}
    path = tmp_path / "train.pkl"
    path.write_bytes(pickle.dumps(fields, protocol=protocol))
    split = load_split(path)
    np.testing.assert_array_equal(split.image, fields["image"])
    assert split.labels.tolist() == fields["label"].tolist()


def test_python2_pickle_is_read(tmp_path):
    """A Python 2 pickle keeps array bytes in a py2 str (BINSTRING): read with encoding="latin1"."""
    image = np.arange(6, dtype=np.float32).reshape(3, 2)
    raw = image.tobytes()
    py2 = (
        b"\x80\x02}q\x00(U\x05imageq\x01cnumpy.core.multiarray\n_reconstruct\nq\x02cnumpy\nndarray\nq\x03"
        b"K\x00\x85U\x01b\x87Rq\x04(K\x01K\x03K\x02\x86cnumpy\ndtype\nU\x02f4K\x00K\x01\x87Rq\x05(K\x03U\x01"
        b"<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89U" + bytes([len(raw)]) + raw + b"tbU\x04text"
        b"h\x04u."
    )
    path = tmp_path / "train.pkl"
    path.write_bytes(py2)
    split = load_split(path)
    np.testing.assert_array_equal(split.image, image)
    np.testing.assert_array_equal(split.text, image)


def test_codecs_encode_is_allowed_for_latin1_only(tmp_path):
    path = tmp_path / "train.pkl"
    # {"image": _codecs.encode("x", "zlib_codec")}: a codec other than latin-1 is refused
    path.write_bytes(b"(dp0\nVimage\np1\nc_codecs\nencode\np2\n(Vx\nVzlib_codec\ntRp3\ns.")
    with pytest.raises(DataError, match="refusing to unpickle _codecs.encode with codec 'zlib_codec'"):
        load_split(path)
    path.write_bytes(b"cos\nsystem\n(Vecho pwned\ntR.")  # still no code
    with pytest.raises(DataError, match="refusing to unpickle os.system"):
        load_split(path)


# ---------------------------------------------------------------------------------------- 4. features


def test_complex_features_are_refused(tmp_path):
    np.save(tmp_path / "img.npy", np.ones((4, 3), np.complex64))
    np.save(tmp_path / "txt.npy", np.ones((4, 3), np.float32))
    with pytest.raises(DataError, match=r"img.npy'? holds complex numbers \(complex64\)"):
        load_pairs(tmp_path / "img.npy", tmp_path / "txt.npy")


def test_float64_beyond_float32_range_is_not_called_nan(tmp_path):
    """The cast made infs, then the file was said to hold '320 NaN/inf value(s)'."""
    image = np.ones((40, 8))
    image[3:, :] = 1e39
    np.savez(tmp_path / "q.npz", image=image, text=np.ones((40, 8)))
    with pytest.raises(DataError, match=r"field 'image' values exceed float32's range \(first in row 3\)"):
        load_split(tmp_path / "q.npz")
    image[3:, :] = np.finfo(np.float32).max  # the largest float32 is fine
    np.savez(tmp_path / "q.npz", image=image, text=np.ones((40, 8)))
    assert np.isfinite(load_split(tmp_path / "q.npz").image).all()


def test_hash_search_query_file_names_the_flag(hash_run, tmp_path, capsys):
    huge = np.ones((2, 32))
    huge[1, 0] = 1e39
    np.save(tmp_path / "huge.npy", huge)
    nan = np.ones((2, 32), np.float32)
    nan[1, 3] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    for name, expected in (
        ("huge.npy", "values exceed float32's range (first in row 1)"),
        ("nan.npy", "has 1 NaN/inf value(s), first in row 1"),
    ):
        path = tmp_path / name
        assert main(["search", str(hash_run), "--modality", "image", "--query", str(path)]) == 2
        assert f"--query {path}: {expected}" in one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------- 5. split files


def test_two_files_of_one_split_are_refused(tmp_path):
    fields = {**_pairs(6, 0), "label": np.eye(3, dtype=np.uint8)[[0, 1, 2, 0, 1, 2]]}
    root = _write(tmp_path / "s", train=fields, query=fields, retrieval=fields)
    (root / "train.pkl").write_bytes(pickle.dumps(fields))
    with pytest.raises(DataError, match="both train.npz and train.pkl exist"):
        load_split_dir(root)
    (root / "train.pkl").unlink()
    (root / "train.npz").unlink()
    (root / "train.npz").mkdir()
    with pytest.raises(DataError, match=r"train.npz: is a directory, not a train split file"):
        load_split_dir(root)


# ----------------------------------------------------------------------------------------- 6. .mat keys


def test_half_pre_split_mat_lists_the_missing_keys(tmp_path):
    arrays = {}
    for s in ("tr", "te"):
        fields = _pairs(6, 0)
        arrays.update({f"I_{s}": fields["image"], f"T_{s}": fields["text"], f"L_{s}": np.eye(6)[:, :3]})
    scipy.io.savemat(tmp_path / "half.mat", arrays)
    with pytest.raises(DataError, match=r"half.mat: a pre-split file .* missing \['I_db', 'T_db', 'L_db'\]"):
        load_mat(tmp_path / "half.mat")


def test_mat_with_two_accepted_names_for_a_field_is_refused(tmp_path):
    fields = _pairs(30, 0)
    scipy.io.savemat(
        tmp_path / "both.mat",
        {
            "IAll": fields["image"],
            "YAll": fields["text"],
            "image": fields["image"][::-1],
            "text": fields["text"],
        },
    )
    with pytest.raises(
        DataError, match=r"both.mat: several fields could be the image features: \['image', 'IAll'\]"
    ):
        load_mat(tmp_path / "both.mat", num_query=5, num_train=10)
