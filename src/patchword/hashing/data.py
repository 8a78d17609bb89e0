"""Data for cross-modal hashing: paired image / text feature matrices with optional multi-hot labels.

Formats read (every reader validates and raises ``ValueError`` naming the file and the field):

* **UCMFH splits** - a directory with ``train``, ``query`` and ``retrieval`` files, each ``.npz``
  (preferred) or ``.pkl`` holding ``image`` (N, d) features, ``text`` (N, d') features and ``label``
  (N, L) multi-hot labels (``labels`` is accepted too). :func:`load_split_dir`.
* **MATLAB** ``.mat`` files as used by the DJSRH / DCMH / DGCPN line (optional ``scipy``; v7.3 files also
  need ``h5py``): either one whole set (``IAll``/``YAll``/``LAll`` or ``image``/``text``/``label``), split
  here, or the pre-split ``I_tr T_tr L_tr I_te T_te L_te I_db T_db L_db`` layout. :func:`load_mat`.
  Only *feature* matrices are accepted; files with raw images (4-D ``IAll``) need feature extraction first.
* **Paired embeddings** - two ``.npy`` files, row i of one pairing with row i of the other, optionally a
  third with labels. Without labels the relevance is the pair itself. :func:`load_pairs`.
* **MIRFlickr-25K text side** - ``all_labels.txt`` / ``all_tags.txt`` (24 labels, raw tags; no image
  features). :func:`load_mirflickr25k_text`.
* **Synthetic multi-label** features for tests and benchmarks. :func:`make_synthetic_multilabel`.

Pickles: a pickle can run arbitrary code when loaded. The ``.pkl`` reader therefore uses a restricted
unpickler that only reconstructs numpy arrays, dtypes, scalars and plain containers and refuses
everything else (e.g. torch tensors, custom classes); object arrays are rejected too. Prefer ``.npz``:
``patchword.hashing.data.convert_pickle_to_npz`` converts a trusted pickle once.

Relevance. A :class:`HashSplit` carries ``labels`` (N, L) or, for pair-only data, ``ids`` (N,): item i of
a query split is relevant to item j of a database split when they share a label, or when
``ids[i] == ids[j]``. For pair-only data the query and database splits must therefore hold the *same*
pairs (query image i retrieves text i); :func:`split_dataset` builds that protocol.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "HashSplit",
    "HashDataset",
    "make_split",
    "load_split",
    "load_split_dir",
    "load_mat",
    "load_pairs",
    "load_mirflickr25k_text",
    "split_dataset",
    "make_synthetic_multilabel",
    "synthetic_dataset",
    "convert_pickle_to_npz",
    "SPLITS",
]

SPLITS = ("train", "query", "retrieval")
_IMAGE_KEYS = ("image", "images", "img", "IAll", "I")
_TEXT_KEYS = ("text", "texts", "txt", "YAll", "tags", "T")
_LABEL_KEYS = ("label", "labels", "LAll", "L")


# ------------------------------------------------------------------------------------------ containers


@dataclass(frozen=True, eq=False)
class HashSplit:
    """One set of N image-text pairs.

    Attributes:
        image: (N, d_img) float32 image features.
        text: (N, d_txt) float32 text features; row i pairs with ``image[i]``.
        labels: (N, L) uint8 multi-hot labels, or None for pair-only data.
        ids: (N,) int64 pair ids (relevance when there are no labels); positions in the source by default.
        source: where the data came from (file name), used in error messages.
    """

    image: np.ndarray
    text: np.ndarray
    labels: np.ndarray | None
    ids: np.ndarray
    source: str = "<memory>"

    def __len__(self) -> int:
        return int(self.image.shape[0])

    @property
    def relevance(self) -> np.ndarray:
        """What :func:`~patchword.hashing.map_at_k` compares: labels (N, L) if present, else ids (N,)."""
        return self.labels if self.labels is not None else self.ids

    def subset(self, index: np.ndarray | list[int]) -> HashSplit:
        """The pairs at ``index`` (ids travel with them, so pair relevance survives the subset)."""
        index = np.asarray(index, dtype=np.int64)
        labels = None if self.labels is None else self.labels[index]
        return HashSplit(self.image[index], self.text[index], labels, self.ids[index], self.source)

    def save_npz(self, path: str | Path) -> None:
        """Write the UCMFH fields (``image``, ``text``, ``label`` when present, ``ids``) to ``.npz``."""
        arrays = {"image": self.image, "text": self.text, "ids": self.ids}
        if self.labels is not None:
            arrays["label"] = self.labels
        np.savez(Path(path), **arrays)


@dataclass(frozen=True, eq=False)
class HashDataset:
    """The UCMFH protocol: train on ``train``, query with ``query``, search ``retrieval``."""

    train: HashSplit
    query: HashSplit
    retrieval: HashSplit
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def image_dim(self) -> int:
        return int(self.train.image.shape[1])

    @property
    def text_dim(self) -> int:
        return int(self.train.text.shape[1])

    @property
    def has_labels(self) -> bool:
        return self.train.labels is not None

    def summary(self) -> dict[str, Any]:
        """Sizes and dimensions, for logs and run directories."""
        return {
            "train": len(self.train),
            "query": len(self.query),
            "retrieval": len(self.retrieval),
            "image_dim": self.image_dim,
            "text_dim": self.text_dim,
            "num_labels": None if self.train.labels is None else int(self.train.labels.shape[1]),
            "relevance": "labels" if self.has_labels else "pair",
            **self.info,
        }


# ------------------------------------------------------------------------------------------ validation


def _matrix(value: Any, source: str, key: str) -> np.ndarray:
    """A finite 2-D float32 feature matrix, or ValueError naming ``source`` and ``key``."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: field {key!r} is not an array: {err}") from err
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{source}: field {key!r} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 2:
        hint = " (raw images? extract features first)" if arr.ndim == 4 else ""
        raise ValueError(f"{source}: field {key!r} must be a 2-D (N, d) matrix, got shape {arr.shape}{hint}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{source}: field {key!r} is empty, shape {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    bad = ~np.isfinite(arr)
    if bad.any():
        row = int(np.argwhere(bad)[0, 0])
        raise ValueError(f"{source}: field {key!r} has {int(bad.sum())} NaN/inf value(s), first in row {row}")
    return arr


def _labels(value: Any, source: str, key: str, n: int) -> np.ndarray:
    """(N, L) uint8 multi-hot labels; a 1-D integer vector is read as single-label class indices."""
    arr = np.asarray(value)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{source}: field {key!r} must be numeric, got dtype {arr.dtype}")
    if arr.ndim == 2 and 1 in arr.shape and arr.shape[0] != n and arr.size == n:
        arr = arr.reshape(-1)  # MATLAB row vector of class ids
    if arr.ndim == 1:
        if not np.issubdtype(arr.dtype, np.integer) and not np.all(arr == np.round(arr)):
            raise ValueError(f"{source}: 1-D field {key!r} must hold integer class indices")
        if arr.size and arr.min() < 0:
            raise ValueError(f"{source}: field {key!r} has negative class indices")
        classes = arr.astype(np.int64)
        arr = np.zeros((classes.size, int(classes.max(initial=-1)) + 1), dtype=np.uint8)
        arr[np.arange(classes.size), classes] = 1
    if arr.ndim != 2:
        raise ValueError(f"{source}: field {key!r} must be (N, L) multi-hot labels, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(
            f"{source}: field {key!r} has {arr.shape[0]} rows but the features have {n} "
            "(one label row per pair)"
        )
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise ValueError(f"{source}: field {key!r} has NaN/inf values")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{source}: field {key!r} must be 0/1 multi-hot, found other values")
    return np.ascontiguousarray(arr, dtype=np.uint8)


def make_split(
    image: Any,
    text: Any,
    labels: Any = None,
    ids: Any = None,
    *,
    source: str = "<memory>",
    keys: tuple[str, str, str] = ("image", "text", "label"),
) -> HashSplit:
    """Validate arrays into a :class:`HashSplit` (errors name ``source`` and the field ``keys``)."""
    img = _matrix(image, source, keys[0])
    txt = _matrix(text, source, keys[1])
    if img.shape[0] != txt.shape[0]:
        raise ValueError(
            f"{source}: field {keys[1]!r} has {txt.shape[0]} rows but field {keys[0]!r} has {img.shape[0]} "
            "(row i of each must be the same pair)"
        )
    lab = None if labels is None else _labels(labels, source, keys[2], img.shape[0])
    if ids is None:
        ids_arr = np.arange(img.shape[0], dtype=np.int64)
    else:
        ids_arr = np.asarray(ids)
        if ids_arr.shape != (img.shape[0],) or not np.issubdtype(ids_arr.dtype, np.integer):
            raise ValueError(
                f"{source}: ids must be ({img.shape[0]},) integers, got {ids_arr.dtype} {ids_arr.shape}"
            )
        ids_arr = ids_arr.astype(np.int64)
    return HashSplit(img, txt, lab, ids_arr, source)


# ------------------------------------------------------------------------------------------ readers


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Reconstructs numpy arrays, dtypes and scalars (and plain dict/list/tuple) only."""

    _ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
        *(
            (m, n)
            for m in ("numpy.core.multiarray", "numpy._core.multiarray")
            for n in ("_reconstruct", "scalar")
        ),
        *((m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name}: only numpy arrays and plain containers are loaded from "
            "pickles (convert the file to .npz with numpy arrays)"
        )


def _read_pickle(path: Path) -> dict[str, Any]:
    try:
        data = _ArraysOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as err:
        raise ValueError(f"{path}: cannot read the pickle safely: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a dict of arrays at the top level, got {type(data).__name__}")
    return data


def _read_mapping(path: Path) -> dict[str, Any]:
    """Fields of an ``.npz`` or ``.pkl`` file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}
        except ValueError as err:  # object arrays need pickle: refuse them
            raise ValueError(f"{path}: cannot read without pickle (object arrays?): {err}") from err
    if suffix in (".pkl", ".pickle"):
        return _read_pickle(path)
    raise ValueError(f"{path}: unsupported split file type {suffix!r} (use .npz, .pkl or .pickle)")


def _pick(
    data: dict[str, Any], candidates: tuple[str, ...], source: str, what: str, required: bool = True
) -> str | None:
    for key in candidates:
        if key in data:
            return key
    if required:
        raise ValueError(
            f"{source}: missing field {candidates[0]!r} ({what}); accepted names {list(candidates)}, found "
            f"{sorted(data)}"
        )
    return None


def load_split(path: str | Path, *, require_labels: bool = False) -> HashSplit:
    """Read one UCMFH split file (``.npz`` / ``.pkl``: ``image``, ``text``, optional ``label``, ``ids``)."""
    path = Path(path)
    data = _read_mapping(path)
    source = str(path)
    ki = _pick(data, _IMAGE_KEYS[:3], source, "image features")
    kt = _pick(data, _TEXT_KEYS[:3], source, "text features")
    kl = _pick(data, ("label", "labels"), source, "multi-hot labels", required=require_labels)
    return make_split(
        data[ki],
        data[kt],
        data[kl] if kl else None,
        data.get("ids"),
        source=source,
        keys=(ki, kt, kl or "label"),
    )


def _check_compatible(splits: dict[str, HashSplit], where: str) -> None:
    ref = splits["train"]
    for name, split in splits.items():
        for attr in ("image", "text"):
            if getattr(split, attr).shape[1] != getattr(ref, attr).shape[1]:
                raise ValueError(
                    f"{where}: {name} {attr} features have dimension {getattr(split, attr).shape[1]} but "
                    f"train has {getattr(ref, attr).shape[1]}"
                )
        if (split.labels is None) != (ref.labels is None):
            raise ValueError(f"{where}: {name} and train disagree on having labels")
        if split.labels is not None and split.labels.shape[1] != ref.labels.shape[1]:
            raise ValueError(
                f"{where}: {name} has {split.labels.shape[1]} label classes but train has "
                f"{ref.labels.shape[1]}"
            )
    if ref.labels is None and not np.isin(splits["query"].ids, splits["retrieval"].ids).any():
        raise ValueError(
            f"{where}: no labels and no query pair id occurs in the retrieval set, so nothing is relevant; "
            "pair-only data needs query and retrieval to hold the same pairs (ids)"
        )


def load_split_dir(root: str | Path) -> HashDataset:
    """Read ``root/{train,query,retrieval}.npz`` (or ``.pkl``), the official UCMFH layout."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"split directory {root} does not exist")
    splits = {}
    for name in SPLITS:
        found = [
            root / f"{name}{ext}" for ext in (".npz", ".pkl", ".pickle") if (root / f"{name}{ext}").is_file()
        ]
        if not found:
            raise FileNotFoundError(
                f"{root}: missing {name}.npz (or {name}.pkl); expected {', '.join(SPLITS)}"
            )
        splits[name] = load_split(found[0])
    _check_compatible(splits, str(root))
    return HashDataset(**splits, info={"source": str(root)})


def _loadmat(path: Path) -> dict[str, Any]:
    try:
        import scipy.io
    except ImportError as err:
        raise ImportError(f"reading {path} needs scipy: pip install scipy (or 'patchword[hashing]')") from err
    try:
        data = scipy.io.loadmat(path)
        return {k: v for k, v in data.items() if not k.startswith("__")}
    except NotImplementedError:
        pass  # MATLAB v7.3 is HDF5
    try:
        import h5py
    except ImportError as err:
        raise ImportError(
            f"{path} is a MATLAB v7.3 (HDF5) file; reading it needs h5py: pip install h5py"
        ) from err
    with h5py.File(path, "r") as f:
        # HDF5 stores MATLAB's column-major arrays transposed.
        return {k: np.asarray(f[k]).T for k in f if isinstance(f[k], h5py.Dataset)}


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
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    data = _loadmat(path)
    source = str(path)
    if all(f"{m}_{s}" in data for m in "ITL" for s in ("tr", "te", "db")):
        splits = {
            name: make_split(
                data[f"I_{s}"],
                data[f"T_{s}"],
                data[f"L_{s}"],
                source=source,
                keys=(f"I_{s}", f"T_{s}", f"L_{s}"),
            )
            for name, s in zip(SPLITS, ("tr", "te", "db"), strict=True)
        }
        _check_compatible(splits, source)
        return HashDataset(**splits, info={"source": source, "layout": "pre-split"})
    ki = image_key or _pick(data, _IMAGE_KEYS, source, "image features")
    kt = text_key or _pick(data, _TEXT_KEYS, source, "text features")
    kl = label_key or _pick(data, _LABEL_KEYS, source, "labels", required=False)
    for key in (ki, kt, kl):
        if key is not None and key not in data:
            raise ValueError(f"{source}: missing field {key!r}; found {sorted(data)}")
    full = make_split(
        data[ki], data[kt], data[kl] if kl else None, source=source, keys=(ki, kt, kl or "label")
    )
    return split_dataset(full, num_query=num_query, num_train=num_train, seed=seed)


def load_pairs(image: str | Path, text: str | Path, labels: str | Path | None = None) -> HashSplit:
    """Paired ``.npy`` embeddings (row i of ``image`` pairs with row i of ``text``), optional labels."""
    arrays = []
    for path in (image, text, labels):
        if path is None:
            arrays.append(None)
            continue
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except ValueError as err:
            raise ValueError(f"{path}: not a plain .npy array: {err}") from err
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
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist")
    try:
        labels = np.loadtxt(labels_path, dtype=np.int64, ndmin=2)
    except ValueError as err:
        raise ValueError(f"{labels_path}: not a whitespace-separated 0/1 matrix: {err}") from err
    lines = tags_path.read_text(encoding="utf-8").splitlines()
    if len(lines) != labels.shape[0]:
        raise ValueError(f"{tags_path} has {len(lines)} lines but {labels_path} has {labels.shape[0]} rows")
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
    return bow, _labels(labels, str(labels_path), "labels", len(docs)), vocab


# ------------------------------------------------------------------------------------------ protocols


def split_dataset(full: HashSplit, *, num_query: int, num_train: int, seed: int = 0) -> HashDataset:
    """Split one set of pairs into the UCMFH protocol (seeded random permutation).

    * With labels (DJSRH/DCMH convention): ``query`` = ``num_query`` random pairs, ``retrieval`` = all
      the others, ``train`` = ``num_train`` random pairs of the retrieval set.
    * Without labels (pair relevance): ``query`` and ``retrieval`` are the *same* ``num_query`` held-out
      pairs (query image i must find text i) and ``train`` = up to ``num_train`` of the remaining pairs,
      disjoint from them.
    """
    n = len(full)
    if not 0 < num_query < n:
        raise ValueError(f"num_query must be in [1, {n - 1}] for {n} pairs, got {num_query}")
    if num_train < 1:
        raise ValueError(f"num_train must be >= 1, got {num_train}")
    perm = np.random.default_rng(seed).permutation(n)
    query_idx, rest = perm[:num_query], perm[num_query:]
    info = {"source": full.source, "split_seed": seed}
    if full.labels is not None:
        if num_train > len(rest):
            raise ValueError(f"num_train={num_train} exceeds the {len(rest)} retrieval pairs")
        return HashDataset(
            full.subset(rest[:num_train]),
            full.subset(query_idx),
            full.subset(rest),
            info={**info, "protocol": "labels"},
        )
    test = full.subset(query_idx)
    return HashDataset(full.subset(rest[:num_train]), test, test, info={**info, "protocol": "pair"})


def make_synthetic_multilabel(
    num: int,
    *,
    num_labels: int = 24,
    image_dim: int = 512,
    text_dim: int = 512,
    latent_dim: int = 64,
    instance_noise: float = 1.0,
    feature_noise: float = 1.0,
    labels: np.ndarray | None = None,
    seed: int = 0,
) -> HashSplit:
    """Seeded multi-label image/text features whose cross-modal relation must be learned.

    Every sample gets 1-4 labels (Zipf-like label frequencies, or the given ``labels`` rows, e.g. the
    real MIRFlickr-25K matrix), a latent ``z = norm(sum of its label prototypes / sqrt(#labels) +
    instance_noise * e)``, an image feature ``norm(A z + feature_noise * e_i)`` and a text feature
    ``norm(tanh(2 B z) + feature_noise * e_t)`` with random maps A, B. The modalities live in unrelated
    spaces (raw cross-modal cosine is chance), the instance noise makes pairs distinguishable beyond their
    labels (so an unsupervised pair loss has signal), and label sharing makes latents similar.

    Returns:
        A :class:`HashSplit` with (num, image_dim), (num, text_dim) features and (num, L) labels.
    """
    rng = np.random.default_rng(seed)
    if labels is None:
        weights = 1.0 / np.arange(1, num_labels + 1) ** 0.7
        weights /= weights.sum()
        labels = np.zeros((num, num_labels), dtype=np.uint8)
        counts = rng.choice([1, 2, 3, 4], size=num, p=[0.4, 0.3, 0.2, 0.1])
        for c in (1, 2, 3, 4):  # vectorised per label count: draw without replacement by Gumbel top-c
            rows = np.flatnonzero(counts == c)
            keys = np.log(weights)[None, :] - np.log(-np.log(rng.random((rows.size, num_labels))))
            labels[rows[:, None], np.argsort(-keys, axis=1)[:, :c]] = 1
    else:
        labels = _labels(labels, "labels", "labels", num)
        num_labels = labels.shape[1]
    # Unit-norm label prototypes and instance noise of norm ~instance_noise: their ratio sets how much of a
    # sample is "its labels" versus "itself".
    protos = rng.standard_normal((num_labels, latent_dim)) / np.sqrt(latent_dim)
    z = labels.astype(np.float64) @ protos / np.sqrt(np.maximum(labels.sum(1, keepdims=True), 1))
    z += instance_noise * rng.standard_normal(z.shape) / np.sqrt(latent_dim)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    # Signals of unit norm, isotropic noise of norm ~feature_noise on top.
    image = z @ rng.standard_normal((latent_dim, image_dim))
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text = np.tanh(2 * z @ rng.standard_normal((latent_dim, text_dim)))
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    image += feature_noise * rng.standard_normal(image.shape) / np.sqrt(image_dim)
    text += feature_noise * rng.standard_normal(text.shape) / np.sqrt(text_dim)
    image /= np.linalg.norm(image, axis=1, keepdims=True)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    return make_split(image, text, labels, source=f"synthetic(seed={seed})")


def synthetic_dataset(
    *, num_train: int = 2000, num_query: int = 500, num_retrieval: int = 4000, seed: int = 0, **kwargs: Any
) -> HashDataset:
    """A labelled synthetic :class:`HashDataset`: disjoint query / retrieval, train a subset of retrieval."""
    if num_train > num_retrieval:
        raise ValueError(f"num_train ({num_train}) cannot exceed num_retrieval ({num_retrieval})")
    full = make_synthetic_multilabel(num_query + num_retrieval, seed=seed, **kwargs)
    query = full.subset(np.arange(num_query))
    retrieval = full.subset(np.arange(num_query, num_query + num_retrieval))
    train = retrieval.subset(np.arange(num_train))
    return HashDataset(train, query, retrieval, info={"source": full.source, "protocol": "labels"})


def convert_pickle_to_npz(pkl_path: str | Path, npz_path: str | Path) -> None:
    """Rewrite a (trusted) UCMFH split pickle as ``.npz`` (loaded without pickle from then on)."""
    load_split(pkl_path).save_npz(npz_path)
