"""Readers of the feature formats used for cross-modal hashing, each into a :class:`HashSplit` or
:class:`HashDataset` (every reader validates and raises :class:`~patchword.errors.DataError` naming the
file and the field):

* **UCMFH splits** - a directory with ``train``, ``query`` and ``retrieval`` files, each ``.npz``
  (preferred) or ``.pkl`` holding ``image`` (N, d) features, ``text`` (N, d') features and ``label``
  (N, L) multi-hot labels (``labels`` is accepted too). :func:`load_split_dir`. Pickles are read with a
  restricted unpickler (:mod:`patchword.hashing.unpickle`); :func:`convert_pickle_to_npz` converts one.
* **MATLAB** ``.mat`` files as used by the DJSRH / DCMH / DGCPN line (optional ``scipy``; v7.3 files also
  need ``h5py``): either one whole set (``IAll``/``YAll``/``LAll`` or ``image``/``text``/``label``), split
  here, or the pre-split ``I_tr T_tr L_tr I_te T_te L_te I_db T_db L_db`` layout. :func:`load_mat`.
  Only *feature* matrices are accepted; files with raw images (4-D ``IAll``) need feature extraction first.
* **Paired embeddings** - two ``.npy`` files, row i of one pairing with row i of the other, optionally a
  third with labels. Without labels the relevance is the pair itself. :func:`load_pairs`.
* **MIRFlickr-25K text side** - ``all_labels.txt`` / ``all_tags.txt`` (24 labels, raw tags; no image
  features). :func:`load_mirflickr25k_text`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import DataError, MissingExtraError, MissingFileError
from patchword.hashing.dataset import (
    SPLITS,
    HashDataset,
    HashSplit,
    check_compatible_splits,
    class_ids,
    make_split,
    multi_hot_labels,
    split_dataset,
)
from patchword.hashing.unpickle import read_array_pickle
from patchword.readers import describe_content, require_file

__all__ = [
    "read_npy",
    "load_split",
    "load_split_dir",
    "load_mat",
    "read_mat",
    "load_pairs",
    "load_mirflickr25k_text",
    "convert_pickle_to_npz",
]

_IMAGE_KEYS = ("image", "images", "img", "IAll", "I")
_TEXT_KEYS = ("text", "texts", "txt", "YAll", "tags", "T")
_LABEL_KEYS = ("label", "labels", "LAll", "L")
_PICKLE_PROTO = b"\x80"  # the first byte of every pickle of protocol 2 or later


def _unreadable(path: Path, kind: str, err: BaseException) -> DataError:
    """The one-line error for a ``kind`` file (``.npy``, ``.npz``, ``.mat``) its library could not read."""
    if path.stat().st_size == 0:
        return DataError(f"{path}: not a readable {kind} file: the file is empty")
    text = str(err).strip()
    if isinstance(err, ValueError) and "allow_pickle" in text:  # numpy refusing object arrays, or taking
        with open(path, "rb") as fh:  # whatever is neither .npy nor .zip for a pickle
            pickled = "Object arrays" in text or fh.read(1) == _PICKLE_PROTO
        if pickled:
            return DataError(
                f"{path}: holds pickled (object) data, not read without pickle: save numeric arrays"
            )
        return DataError(f"{path}: not a {kind} file ({describe_content(path)})")
    detail = text.splitlines()[0] if text else type(err).__name__
    return DataError(
        f"{path}: not a readable {kind} file (damaged, truncated or another format): {detail} "
        f"({describe_content(path)})"
    )


def read_npy(path: str | Path) -> np.ndarray:
    """The array of a ``.npy`` file, read without pickle.

    Raises:
        MissingFileError: no such file.
        DataError: empty, truncated, damaged, an ``.npz`` archive or pickled objects; names the file.
    """
    path = Path(path)
    require_file(path, ".npy file")
    try:
        array = np.load(path, allow_pickle=False)
    except MemoryError:
        raise
    except Exception as err:  # numpy raises EOFError, ValueError, tokenize errors... on a damaged file
        raise _unreadable(path, ".npy", err) from None
    if not isinstance(array, np.ndarray):  # an .npz archive under another name
        array.close()
        raise DataError(f"{path}: an .npz archive, not a .npy array: save one array with np.save")
    return array


def _read_npz(path: Path) -> dict[str, Any]:
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise DataError(f"{path}: a single .npy array, not an .npz archive of named fields")
        with data:
            return {k: data[k] for k in data.files}
    except (MemoryError, DataError):
        raise
    except Exception as err:  # EOFError, BadZipFile, zlib.error, ValueError (object arrays)...
        raise _unreadable(path, ".npz", err) from None


def _read_mapping(path: Path) -> dict[str, Any]:
    """Fields of an ``.npz`` or ``.pkl`` file."""
    require_file(path, "split file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _read_npz(path)
    if suffix in (".pkl", ".pickle"):
        return read_array_pickle(path)
    raise DataError(f"{path}: unsupported split file type {suffix!r} (use .npz, .pkl or .pickle)")


def _pick(
    data: dict[str, Any], candidates: tuple[str, ...], source: str, what: str, required: bool = True
) -> str | None:
    """The one key of ``candidates`` in ``data``; several are refused (which one holds the data?)."""
    present = [key for key in candidates if key in data]
    if len(present) > 1:
        raise DataError(
            f"{source}: several fields could be the {what}: {present}; keep one of them (accepted names "
            f"{list(candidates)})"
        )
    if present:
        return present[0]
    if required:
        raise DataError(
            f"{source}: missing field {candidates[0]!r} ({what}); accepted names {list(candidates)}, found "
            f"{sorted(data)}"
        )
    return None


def _split_fields(path: Path, require_labels: bool) -> tuple[dict[str, Any], tuple[str, str, str | None]]:
    """The fields of one split file and its (image, text, label) keys (label None when absent)."""
    data = _read_mapping(path)
    source = str(path)
    ki = _pick(data, _IMAGE_KEYS[:3], source, "image features")
    kt = _pick(data, _TEXT_KEYS[:3], source, "text features")
    kl = _pick(data, ("label", "labels"), source, "multi-hot labels", required=require_labels)
    return data, (ki, kt, kl)


def _make(
    data: dict[str, Any], keys: tuple[str, str, str | None], source: str, classes: np.ndarray | None = None
) -> HashSplit:
    ki, kt, kl = keys
    return make_split(
        data[ki],
        data[kt],
        data[kl] if kl else None,
        data.get("ids"),
        source=source,
        keys=(ki, kt, kl or "label"),
        classes=classes,
    )


def load_split(path: str | Path, *, require_labels: bool = False) -> HashSplit:
    """Read one UCMFH split file (``.npz`` / ``.pkl``: ``image``, ``text``, optional ``label``, ``ids``)."""
    path = Path(path)
    data, keys = _split_fields(path, require_labels)
    return _make(data, keys, str(path))


def _split_file(root: Path, name: str) -> Path:
    """``root/name.npz`` (or ``.pkl`` / ``.pickle``): exactly one of them, a file."""
    candidates = [root / f"{name}{ext}" for ext in (".npz", ".pkl", ".pickle")]
    present = [p for p in candidates if p.exists()]
    if len(present) > 1:
        raise DataError(
            f"{root}: both {' and '.join(p.name for p in present)} exist; keep one {name} split file "
            "(which one holds the data?)"
        )
    if not present:
        raise MissingFileError(f"{root}: missing {name}.npz (or {name}.pkl); expected {', '.join(SPLITS)}")
    if not present[0].is_file():
        raise DataError(f"{present[0]}: is a directory, not a {name} split file")
    return present[0]


def load_split_dir(root: str | Path) -> HashDataset:
    """Read ``root/{train,query,retrieval}.npz`` (or ``.pkl``), the official UCMFH layout.

    1-D class-id labels get the same column for a class in every split (the classes of all three files).
    Pair-only splits (no labels) must hold the same pairs in query and retrieval:
    :func:`~patchword.hashing.dataset.check_compatible_splits`.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise MissingFileError(f"split directory {root} is a file, not a directory")
    if not root.is_dir():
        raise MissingFileError(f"split directory {root} does not exist")
    read = {name: _split_fields(_split_file(root, name), False) for name in SPLITS}
    classes = _shared_classes([(data, keys) for data, keys in read.values()])
    splits = {
        name: _make(data, keys, str(_split_file(root, name)), classes) for name, (data, keys) in read.items()
    }
    ids_given = all("ids" in read[name][0] for name in ("query", "retrieval"))
    check_compatible_splits(splits, str(root), ids_given=ids_given)
    return HashDataset(**splits, info={"source": str(root)})


def _shared_classes(fields: list[tuple[dict[str, Any], tuple[str, str, str | None]]]) -> np.ndarray | None:
    """The class ids of all splits' 1-D class-id labels (None unless every split has such labels)."""
    if any(keys[2] is None for _, keys in fields):
        return None
    ns = [_rows(data[keys[0]]) for data, keys in fields]
    return class_ids([data[keys[2]] for data, keys in fields], ns)


def _loadmat(path: Path) -> dict[str, Any]:
    try:
        import scipy.io
    except ImportError as err:
        raise MissingExtraError(f"reading {path} needs scipy: pip install 'patchword[hashing]'") from err
    try:
        data = scipy.io.loadmat(path)
        return {k: v for k, v in data.items() if not k.startswith("__")}
    except NotImplementedError:
        pass  # MATLAB v7.3 is HDF5
    except MemoryError:
        raise
    except Exception as err:  # MatReadError, OSError, IndexError, TypeError... on a damaged file
        raise _unreadable(path, ".mat", err) from None
    try:
        import h5py
    except ImportError as err:
        raise MissingExtraError(
            f"{path} is a MATLAB v7.3 (HDF5) file; reading it needs h5py: pip install h5py"
        ) from err
    try:
        with h5py.File(path, "r") as f:
            # HDF5 stores MATLAB's column-major arrays transposed.
            return {k: np.asarray(f[k]).T for k in f if isinstance(f[k], h5py.Dataset)}
    except MemoryError:
        raise
    except Exception as err:  # h5py raises OSError, KeyError... on a damaged HDF5 file
        raise _unreadable(path, "MATLAB v7.3 (HDF5) .mat", err) from None


def load_mat(
    path: str | Path,
    *,
    num_query: int = 2000,
    num_train: int = 5000,
    seed: int = 0,
    image_key: str | None = None,
    text_key: str | None = None,
    label_key: str | None = None,
) -> HashDataset:
    """Read a DJSRH/DCMH-style ``.mat`` file of features into a :class:`HashDataset`.

    Pre-split files (``I_tr T_tr L_tr``, ``I_te T_te L_te``, ``I_db T_db L_db``) keep their split (``te``
    = query, ``db`` = retrieval). Whole-set files (``IAll YAll LAll`` or ``image text label``, or the
    keys given) are split by :func:`split_dataset` with ``num_query``, ``num_train`` and ``seed``.
    """
    data = read_mat(path, image_key=image_key, text_key=text_key, label_key=label_key)
    if isinstance(data, HashDataset):
        return data
    return split_dataset(data, num_query=num_query, num_train=num_train, seed=seed)


def read_mat(
    path: str | Path,
    *,
    image_key: str | None = None,
    text_key: str | None = None,
    label_key: str | None = None,
) -> HashDataset | HashSplit:
    """A ``.mat`` file as :func:`load_mat` reads it, before any split is made: a pre-split file as its
    :class:`HashDataset`, a whole-set file as one :class:`HashSplit` (for a caller that checks the split
    sizes it will ask of it first)."""
    path = Path(path)
    require_file(path, ".mat file")
    data = _loadmat(path)
    source = str(path)
    split_keys = [f"{m}_{s}" for s in ("tr", "te", "db") for m in "ITL"]
    if any(key in data for key in split_keys):
        missing = [key for key in split_keys if key not in data]
        if missing:
            raise DataError(
                f"{source}: a pre-split file (it has {[k for k in split_keys if k in data]}) needs "
                f"{' '.join(split_keys)}; missing {missing}"
            )
        classes = class_ids(
            [data[f"L_{s}"] for s in ("tr", "te", "db")], [_rows(data[f"I_{s}"]) for s in ("tr", "te", "db")]
        )
        splits = {
            name: make_split(
                data[f"I_{s}"],
                data[f"T_{s}"],
                data[f"L_{s}"],
                source=source,
                keys=(f"I_{s}", f"T_{s}", f"L_{s}"),
                classes=classes,
            )
            for name, s in zip(SPLITS, ("tr", "te", "db"), strict=True)
        }
        check_compatible_splits(splits, source)
        return HashDataset(**splits, info={"source": source, "layout": "pre-split"})
    ki = image_key or _pick(data, _IMAGE_KEYS, source, "image features")
    kt = text_key or _pick(data, _TEXT_KEYS, source, "text features")
    kl = label_key or _pick(data, _LABEL_KEYS, source, "labels", required=False)
    for key in (ki, kt, kl):
        if key is not None and key not in data:
            raise DataError(f"{source}: missing field {key!r}; found {sorted(data)}")
    return make_split(
        data[ki], data[kt], data[kl] if kl else None, source=source, keys=(ki, kt, kl or "label")
    )


def _rows(value: Any) -> int:
    """The row count of a feature field (0 for a scalar: make_split then names the field)."""
    shape = np.shape(value)
    return int(shape[0]) if shape else 0


def load_pairs(image: str | Path, text: str | Path, labels: str | Path | None = None) -> HashSplit:
    """Paired ``.npy`` embeddings (row i of ``image`` pairs with row i of ``text``), optional labels."""
    arrays = [None if path is None else read_npy(path) for path in (image, text, labels)]
    return make_split(
        arrays[0], arrays[1], arrays[2], source=f"{image} + {text}", keys=(str(image), str(text), str(labels))
    )


def load_mirflickr25k_text(
    root: str | Path, vocab_size: int = 1386
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The MIRFlickr-25K text side (``all_tags.txt``, ``all_labels.txt``): tag bag-of-words and labels.

    Args:
        root: directory with ``all_tags.txt`` (comma-separated tags per line) and ``all_labels.txt``
            (24 space-separated 0/1 per line), one line per image, in the same order.
        vocab_size: keep the most frequent tags (1386, the DCMH/DJSRH MIRFlickr text dimension; ties by tag).

    Returns:
        ``(bow (N, V) float32 binary, labels (N, 24) uint8, vocabulary)``.
    """
    root = Path(root)
    tags_path, labels_path = root / "all_tags.txt", root / "all_labels.txt"
    for p in (tags_path, labels_path):
        require_file(p, "MIRFlickr-25K text file")
    try:
        labels = np.loadtxt(labels_path, dtype=np.int64, ndmin=2)
    except ValueError as err:
        raise DataError(f"{labels_path}: not a whitespace-separated 0/1 matrix: {err}") from err
    lines = tags_path.read_text(encoding="utf-8").splitlines()
    if len(lines) != labels.shape[0]:
        raise DataError(f"{tags_path} has {len(lines)} lines but {labels_path} has {labels.shape[0]} rows")
    docs = [{t.strip().lower() for t in line.split(",") if t.strip()} for line in lines]
    counts: dict[str, int] = {}
    for doc in docs:
        for tag in doc:
            counts[tag] = counts.get(tag, 0) + 1
    vocab = sorted(counts, key=lambda t: (-counts[t], t))[:vocab_size]
    index = {t: i for i, t in enumerate(vocab)}
    rows = [i for i, doc in enumerate(docs) for t in doc if t in index]
    cols = [index[t] for doc in docs for t in doc if t in index]
    bow = np.zeros((len(docs), len(vocab)), dtype=np.float32)
    bow[rows, cols] = 1.0
    return bow, multi_hot_labels(labels, str(labels_path), "labels", len(docs)), vocab


def convert_pickle_to_npz(pkl_path: str | Path, npz_path: str | Path) -> None:
    """Rewrite a (trusted) UCMFH split pickle as ``.npz`` (loaded without pickle from then on)."""
    load_split(pkl_path).save_npz(npz_path)
