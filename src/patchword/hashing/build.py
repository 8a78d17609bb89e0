"""From a :class:`~patchword.hashing.config.HashRunConfig` section to the objects it describes.

The checks that need the data (how many pairs a file holds, the feature widths) are made here, naming the
config key (or the file) they concern, before a run directory is written.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from patchword.errors import ConfigError, DataError
from patchword.hashing.config import FORMAT_READS, HashDataConfig, HashModelConfig
from patchword.hashing.dataset import HashDataset, HashSplit, split_dataset
from patchword.hashing.model import UCMFH
from patchword.hashing.readers import load_pairs, load_split_dir, read_mat
from patchword.hashing.rows import row_groups
from patchword.hashing.synthetic import synthetic_dataset

__all__ = [
    "SPLIT_KEYS",
    "SYNTHETIC_KEYS",
    "SOURCE_KEYS",
    "build_hashing_dataset",
    "build_hashing_model",
    "changed_data_keys",
    "changed_data_parts",
    "data_fingerprint",
    "refuse_ignored_keys",
    "refuse_resplit",
    "resolved_data_path",
]

#: The keys that split one set of pairs (``data.format=pairs``, a whole-set ``.mat``) into train / query /
#: retrieval: pre-split files (a ``splits`` directory, a pre-split ``.mat``) bring their own splits.
SPLIT_KEYS = ("data.num_query", "data.num_train", "data.split_seed")

#: The keys that shape the features ``data.format=synthetic`` generates: every other format reads its
#: features (and their widths) from files.
SYNTHETIC_KEYS = (
    "data.synthetic_num_retrieval",
    "data.synthetic_seed",
    "data.synthetic_image_dim",
    "data.synthetic_text_dim",
)


#: The keys that say which features a run reads: a trained run evaluated with one of them changed is
#: evaluated on other data, which its split and generation keys may then split as it needs. Not
#: ``data.labels``: the split permutes the rows whatever the labels say, so other labels of the run's own
#: features keep its split (:func:`~patchword.hashing.rundir.check_evaluated_data`).
SOURCE_KEYS = ("data.format", "data.image", "data.text", "data.root")

_logger = logging.getLogger(__name__)


def changed_data_keys(dc: HashDataConfig) -> set[str]:
    """The :data:`SPLIT_KEYS` and :data:`SYNTHETIC_KEYS` whose values in ``dc`` differ from the defaults:
    set by whoever built the config (a key left at its default cannot be told from one given at that
    value, nor from one a saved config.yaml holds, which holds every key)."""
    defaults = {f"data.{f.name}": f.default for f in fields(HashDataConfig)}
    keys = (*SPLIT_KEYS, *SYNTHETIC_KEYS)
    return {key for key in keys if getattr(dc, key.removeprefix("data.")) != defaults[key]}


def build_hashing_dataset(
    dc: HashDataConfig, given: Collection[str] = (), *, training: bool = True
) -> HashDataset:
    """The train / query / retrieval :class:`HashDataset` described by ``dc`` (read or generated).

    Args:
        dc: the data section.
        given: the keys the caller set (``hash train``'s overrides, values other than the defaults:
            :func:`changed_data_keys`); one the format would ignore is refused: a :data:`SPLIT_KEYS` one for
            pre-split data, ``data.split_seed`` for synthetic data (taken in order, never shuffled), a
            :data:`SYNTHETIC_KEYS` one for any format that reads files.
        training: the data are built to train on (``hash train``). False (``hash eval`` / ``hash search`` of
            a trained run): the training split is not used, and a default ``data.num_train`` capped to the
            pairs is said at debug level only (the run's split is the run's own; the user set nothing).

    Raises:
        ConfigError: ``data.root`` missing, or not the directory (``splits``) or file (``mat``) its format
            reads; a split size (``data.num_query`` / ``data.num_train``) the data cannot give, naming the
            key; a training set of fewer than two pairs (no contrastive batch) names the keys too; a key of
            ``given`` the format ignores, naming it.
        DataError: a split file whose training split holds fewer than two pairs, naming it.
    """
    _refuse_format_ignored(dc, given)  # before any file is read or pair generated
    if dc.format == "synthetic":
        return synthetic_dataset(
            num_train=dc.num_train,
            num_query=dc.num_query,
            num_retrieval=dc.synthetic_num_retrieval,
            seed=dc.synthetic_seed,
            image_dim=dc.synthetic_image_dim,
            text_dim=dc.synthetic_text_dim,
        )
    data: HashDataset | HashSplit
    if dc.format == "pairs":
        missing = "data.image" if not dc.image else "data.text" if not dc.text else ""
        if missing:  # the key left empty, not always data.image
            raise ConfigError(missing, f"is empty: data.format=pairs {FORMAT_READS['pairs']}, two .npy files")
        data = load_pairs(dc.image, dc.text, dc.labels or None)
    elif dc.format == "splits":
        _check_root(dc.root, "splits", "the directory of train / query / retrieval .npz (or .pkl) files")
        data = load_split_dir(dc.root)
    elif dc.format == "mat":
        _check_root(dc.root, "mat", "a .mat file of features")
        data = read_mat(dc.root)
    else:
        raise ConfigError("data.format", f"must be synthetic, pairs, splits or mat, got {dc.format!r}")
    fingerprint = data_fingerprint(data, dc.format)
    if isinstance(data, HashSplit):  # one set of pairs, split here: the sizes asked of it, checked first
        # rows that repeat an image (one per caption) are split by image: the sizes count images
        groups = row_groups(data.image)
        unit, source = "pairs", data.source
        if groups[1] < len(data):
            unit, source = (
                "images",
                f"{source} ({len(data)} rows of {groups[1]} distinct images: split by image)",
            )
        _check_split_sizes(groups[1], unit, data.labels is not None, dc, source, given, training)
        built = split_dataset(
            data, num_query=dc.num_query, num_train=dc.num_train, seed=dc.split_seed, groups=groups
        )
        if "split_by" in built.info:  # a run split so is not the run an older version split by row
            fingerprint["split_by"] = built.info["split_by"]
        built.info.update(source=_source(dc), fingerprint=fingerprint)
        return built
    _refuse_pre_split(dc, given)  # a .mat is known to be pre-split only once read
    if len(data.train) < 2:  # the file's own training split: all batches were dropped, 0 steps and exit 0
        raise DataError(
            f"{data.train.source}: {len(data.train)} training pair(s); a contrastive batch needs 2"
        )
    data.info.update(source=_source(dc), fingerprint=fingerprint)
    return data


def _source(dc: HashDataConfig) -> str:
    """The data block's ``source``: the files by absolute path, as ``hash train`` (paths as typed) and
    ``hash eval`` (the run's recorded absolute paths) read them alike; errors name the paths as given."""
    if dc.format == "pairs":
        return f"{resolved_data_path(dc, 'data.image')} + {resolved_data_path(dc, 'data.text')}"
    return resolved_data_path(dc, "data.root")


def resolved_data_path(dc: HashDataConfig, key: str) -> str:
    """The value of ``key`` (``data.image``, ``data.root``, ...) in ``dc``, a path absolute (``~`` expanded,
    links resolved: one file spelt two ways is the same data); ``data.format`` and an empty value as given."""
    raw = getattr(dc, key.removeprefix("data."))
    return str(Path(raw).expanduser().resolve()) if raw and key != "data.format" else raw


def _sha256(*arrays: np.ndarray | None) -> str:
    """sha256 of the shapes, dtypes and bytes of ``arrays`` (None: absent), in order."""
    digest = hashlib.sha256()
    for arr in arrays:
        if arr is None:
            digest.update(b"none;")
            continue
        arr = np.ascontiguousarray(arr)
        digest.update(f"{arr.dtype.str}{arr.shape};".encode())
        digest.update(memoryview(arr).cast("B"))
    return digest.hexdigest()


def data_fingerprint(data: HashSplit | HashDataset, fmt: str) -> dict[str, Any]:
    """What a run read, before any split: ``{"rows": n or {split: n}, "sha256": {part: hex}}``.

    The parts are what the user names: ``data.image`` / ``data.text`` / ``data.labels`` for
    ``data.format=pairs``, ``data.root`` for one set of pairs in a ``.mat``, ``train`` / ``query`` /
    ``retrieval`` for pre-split data (a ``splits`` directory, a pre-split ``.mat``). Two reads with the same
    fingerprint are the same data wherever the files lie (a copy, a moved directory); added rows or changed
    contents under the same file names are not (the seed-0 split of 41 pairs differs from that of 40).
    """
    if isinstance(data, HashSplit):
        if fmt == "pairs":
            parts = {
                "data.image": _sha256(data.image),
                "data.text": _sha256(data.text),
                **({"data.labels": _sha256(data.labels)} if data.labels is not None else {}),
            }
        else:
            parts = {"data.root": _sha256(data.image, data.text, data.labels, data.ids)}
        return {"rows": len(data), "sha256": parts}
    splits = {"train": data.train, "query": data.query, "retrieval": data.retrieval}
    return {
        "rows": {name: len(split) for name, split in splits.items()},
        "sha256": {name: _sha256(s.image, s.text, s.labels, s.ids) for name, s in splits.items()},
    }


def changed_data_parts(recorded: dict[str, Any], read: dict[str, Any] | None) -> list[str]:
    """The parts of :func:`data_fingerprint` ``read`` whose rows or contents differ from ``recorded`` (a
    run's), in the order of ``recorded`` (``["data.image"]``); every part when ``read`` is None."""
    if read is None:
        return list(recorded.get("sha256", {})) or ["data"]
    old, new = recorded.get("sha256", {}), read.get("sha256", {})
    parts = [part for part in {**old, **new} if old.get(part) != new.get(part)]
    if not parts and recorded.get("rows") != read.get("rows"):
        parts = list(old)
    return parts


def refuse_ignored_keys(dc: HashDataConfig, given: Collection[str]) -> None:
    """The refusals of :func:`build_hashing_dataset` that need no data: a key of ``given`` that
    ``dc.format`` ignores whatever its files hold (``data.split_seed`` for synthetic data, a
    :data:`SYNTHETIC_KEYS` one for any format that reads files, a :data:`SPLIT_KEYS` one for a ``splits``
    directory). Whether a ``.mat`` file is pre-split is known once it is read (:func:`build_hashing_dataset`).

    Raises:
        ConfigError: naming the first such key and why it would be ignored.
    """
    _refuse_format_ignored(dc, given)
    # build_hashing_dataset refuses it after reading the directory: hash train names a damaged file first
    if dc.format == "splits":
        _refuse_pre_split(dc, given)


def _refuse_format_ignored(dc: HashDataConfig, given: Collection[str]) -> None:
    """A key of ``given`` that ``dc.format`` ignores, whichever files it reads (no split key: a ``.mat``
    may be split here)."""
    if dc.format == "synthetic":
        # the generated pairs are taken in order (query, then retrieval; training pairs the first of the
        # retrieval set): no permutation is drawn for a split seed to seed
        _refuse_ignored(
            given,
            ("data.split_seed",),
            "data.format=synthetic takes its splits in order from the generated pairs (data.synthetic_seed "
            "seeds them): no split is drawn",
        )
    elif dc.format in FORMAT_READS:  # a file's features are its own, whatever these keys say
        _refuse_ignored(
            given,
            SYNTHETIC_KEYS,
            f"data.format={dc.format} {FORMAT_READS[dc.format]}: the data.synthetic_* keys shape generated "
            "features only (data.format=synthetic)",
        )


def _refuse_pre_split(dc: HashDataConfig, given: Collection[str]) -> None:
    _refuse_ignored(
        given,
        SPLIT_KEYS,
        f"data.format={dc.format} reads pre-split files ({dc.root}: train / query / retrieval): the "
        "pre-split files decide the splits",
    )


def _refuse_ignored(given: Collection[str], keys: tuple[str, ...], why: str) -> None:
    """The first of ``keys`` (in their order) that is in ``given``, refused: ``{key}: {why}, so {key} would
    be ignored; drop it``."""
    refused = [key for key in keys if key in given]
    if refused:
        raise ConfigError(refused[0], f"{why}, so {refused[0]} would be ignored; drop it")


def _check_root(root: str, fmt: str, expected: str) -> None:
    """``data.root`` (``--root``) is given and is what ``data.format=fmt`` reads, ``expected`` (a directory
    for ``splits``, a file for ``mat``): an empty root would read the working directory."""
    if not root:
        raise ConfigError("data.root", f"data.format={fmt} needs data.root (--root): {expected}")
    path = Path(root).expanduser()
    if not path.exists():
        raise ConfigError("data.root", f"{root} does not exist; data.format={fmt} reads {expected}")
    if path.is_dir() != (fmt == "splits"):
        found = "a directory" if path.is_dir() else "a file"
        raise ConfigError("data.root", f"{root} is {found}; data.format={fmt} reads {expected}")


def _check_split_sizes(
    n: int,
    unit: str,
    labelled: bool,
    dc: HashDataConfig,
    source: str,
    given: Collection[str],
    training: bool,
) -> None:
    """The sizes :func:`split_dataset` is asked for fit the ``n`` pairs of ``source`` (``unit``: "pairs", or
    "images": the distinct images of rows that repeat one, which the split counts) and leave a contrastive
    batch to train on: the one check of them, before the split (its own errors name its arguments, not the
    config keys).

    Pair-only data train on the pairs the queries leave: a ``data.num_train`` the caller set (in ``given``)
    that exceeds them is refused, as labelled data refuse it (60 pairs, ``data.num_query=50``,
    ``data.num_train=40`` trained on 10); one it did not set (the default 2000 with a 1000-pair file) is
    capped to them, with a warning when ``training`` (at debug level otherwise: an evaluation of a trained
    run, which the cap was said to when it trained, does not use the training split)."""
    if not 0 < dc.num_query < n:
        raise ConfigError("data.num_query", f"must lie in [1, {n - 1}] for the {n} {unit} of {source}")
    rest = n - dc.num_query
    if labelled and dc.num_train > rest:
        raise ConfigError(
            "data.num_train",
            f"{dc.num_train} exceeds the {rest} retrieval {unit} of {source} (n - data.num_query)",
        )
    # labelled data train on num_train of the retrieval pairs, pair-only data on what the queries leave
    train = dc.num_train if labelled else min(dc.num_train, rest)
    if train < 2:  # all batches would be dropped: the run reported 0 steps and exit 0
        raise ConfigError(
            "data.num_train" if dc.num_train < 2 else "data.num_query",
            f"data.num_query={dc.num_query} of the {n} {unit} of {source} leaves {train} training "
            f"{unit[:-1]}(s) (data.num_train={dc.num_train}); a contrastive batch needs at least 2",
        )
    if not labelled and dc.num_train > rest:
        if "data.num_train" in given:
            raise ConfigError(
                "data.num_train",
                f"{dc.num_train} exceeds the {rest} {unit} of {source} that data.num_query={dc.num_query} "
                "leaves to train on (pair-only data train on the pairs the queries do not hold)",
            )
        _logger.log(
            logging.WARNING if training else logging.DEBUG,
            "data.num_train=%d (not given) capped to the %d %s of %s that data.num_query=%d leaves",
            dc.num_train,
            rest,
            unit,
            source,
            dc.num_query,
        )


def refuse_resplit(
    run: HashDataConfig, dc: HashDataConfig, same_data: bool | None = None, command: str = "hash eval"
) -> None:
    """``command`` (``hash eval`` / ``hash search``) of a trained run: ``dc`` (the run's data section ``run``
    with the overrides) splits and generates the run's data as it did. A :data:`SPLIT_KEYS` value other
    than the run's re-split its pairs (``data.split_seed=1`` put 13 of 20 training pairs in the query set);
    a :data:`SYNTHETIC_KEYS` one generated another synthetic set. Either is accepted for other data than
    the run's (its own split of those pairs is then the user's to choose).

    Args:
        same_data: whether ``dc`` reads the data the run trained on, known once they were read (their
            :func:`data_fingerprint` equals the run's: a copy of its files is its data). None (before the
            data are read, or a run that recorded no fingerprint): the data are the run's when every
            :data:`SOURCE_KEYS` value names the run's (the files the paths resolve to).
        command: the verb the refusal names (it said hash eval when hash search was refused).

    Raises:
        ConfigError: naming the first such key, its two values and why.
    """
    if same_data is None:
        same_data = all(resolved_data_path(run, key) == resolved_data_path(dc, key) for key in SOURCE_KEYS)
    if not same_data:
        return
    split = "it re-splits the run's pairs, so its query set may hold pairs the run trained on"
    if dc.format == "mat":  # refused before the file is read: whether it is pre-split is not known yet
        split += " (a pre-split .mat ignores it: its splits are its own)"
    why = {
        "data.num_train": "the training split is the run's own (it trained on it)",
        "data.num_query": split,
        "data.split_seed": split,
        **{key: "it generates another synthetic set than the run's" for key in SYNTHETIC_KEYS},
    }
    for key in (*SPLIT_KEYS, *SYNTHETIC_KEYS):
        old, new = getattr(run, key.removeprefix("data.")), getattr(dc, key.removeprefix("data."))
        if old != new:
            raise ConfigError(
                key,
                f"cannot change on {command} of a trained run ({old} -> {new}): {why[key]}; drop it, or "
                "evaluate other data (data.format / data.image / data.text / data.root)",
            )


def build_hashing_model(mc: HashModelConfig, image_dim: int, text_dim: int) -> UCMFH:
    """A freshly initialised :class:`UCMFH` for ``image_dim`` / ``text_dim`` input features.

    Raises:
        ConfigError: ``model.nhead`` does not divide an encoder width (known only with the data).
    """
    widths = [image_dim + text_dim] if mc.fusion == "official_fused" else [image_dim, text_dim]
    for width in widths:
        if mc.nhead < 1 or width % mc.nhead:
            raise ConfigError(
                "model.nhead",
                f"must divide the encoder width {width} (model.fusion={mc.fusion}), got {mc.nhead}",
            )
    return UCMFH(
        image_dim,
        text_dim,
        mc.bits,
        fusion=mc.fusion,
        nhead=mc.nhead,
        num_layers=mc.num_layers,
        dim_feedforward=mc.dim_feedforward,
        dropout=mc.dropout,
        hidden=mc.hidden,
        head_dropout=mc.head_dropout,
        eval_batch_size=mc.eval_batch_size,
    )
