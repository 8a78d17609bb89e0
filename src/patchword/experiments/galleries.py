"""Which test gallery a report row was scored on: rSum is comparable only between rows of one.

A gallery is the split of the dataset the evaluation read (:func:`patchword.imports.published.scored_split`:
the role an evaluation records, through the run's ``data.test_split`` / ``data.dev_split``), its size
(images x captions) and every ``data.*`` setting that changes what that split holds: its images, captions
and dense text. The settings are found by leaving out those known not to (how the data is read, cached,
tokenised and fed to the model; the other roles' files; the other kind of dataset's keys): a key added
later counts until it is left out here, so two galleries are never taken for one by a stale list.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from patchword.data.config import DataConfig
from patchword.imports.published import evaluated_role, scored_split

__all__ = ["SYNTHETIC", "dataset_label", "gallery_keys", "gallery_of_run", "run_dataset"]

#: The datasets generated from ``data.synthetic_*`` (the others are read from files under ``data.root``).
SYNTHETIC = ("synthetic", "synthetic_regions")

#: How a split is read, cached, tokenised and fed to the model: never what it holds.
_READING = frozenset(
    {
        "num_workers",
        "cache_dir",
        "mmap",
        "check_images",  # refuses a damaged file or not; data.skip_bad_images changes the split
        "tokenizer",
        "bert_vocab",
        "max_caption_len",
        "max_dense_len",
        "size_augment",  # training only
        "vocab_path",
        "vocab_min_count",
        "word_split",
        "image_size",
        "dense",  # whether the matcher reads the dense text (the protocol), not the text itself
    }
)
#: The split names (the scored one is part of the gallery) and the synthetic split sizes (the gallery's
#: size says it; a synthetic split is generated from its own seed, whatever the others' sizes).
_SPLITS = frozenset({"train_split", "dev_split", "test_split", "num_train", "num_dev", "num_test"})
_FILES_ONLY = frozenset(
    {
        "root",
        "image_root",
        "dense_train",
        "dense_dev",
        "dense_test",
        "captions_per_image",
        "dev_from_train",
        "skip_bad_images",
        "region_boxes",
    }
)
_SYNTHETIC_ONLY = frozenset(
    {"synthetic_seed", "synthetic_image_size", "synthetic_scenes", "dense_omit_prob", "dense_wrong_attr_prob"}
)
_REGIONS_ONLY = frozenset({"num_regions", "region_dim", "boxes_per_object", "region_noise"})
#: Per role, the files and settings of the other splits.
_OTHER_ROLES = {
    "test": frozenset({"dense_train", "dense_dev", "dev_from_train"}),
    "dev": frozenset({"dense_test"}),
}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DataConfig)}


def gallery_keys(data: DataConfig, role: str = "test") -> dict[str, Any]:
    """The ``data`` settings (without ``data.``) that change what the ``role`` split holds, with values; its
    file paths absolute (:meth:`~patchword.data.config.DataConfig.absolute_file_paths`, as a new run records
    them): a run made before config.yaml recorded them so is in the gallery of a new one on the same files,
    read from the directory it was made in."""
    data = data.absolute_file_paths()
    dropped = set(_READING | _SPLITS | _OTHER_ROLES.get(role, frozenset()))
    if data.dataset in SYNTHETIC:
        dropped |= _FILES_ONLY | (_REGIONS_ONLY if data.dataset == "synthetic" else frozenset())
    else:
        dropped |= _SYNTHETIC_ONLY | _REGIONS_ONLY
    if role == "dev" and not data.dev_from_train:
        dropped.add("dense_train")
    return {k: v for k, v in dataclasses.asdict(data).items() if k not in dropped}


def dataset_label(data: DataConfig, role: str = "test") -> str:
    """The data a run's ``role`` split came from, in words: a real dataset's reader and root directory,
    the synthetic scenes' preset, generator seed and image size; then every other setting of
    :func:`gallery_keys` that is not at its default (``data.dense_omit_prob=0.5``). Two configs give one
    label exactly when those settings are equal."""
    keys = gallery_keys(data, role)
    if data.dataset in SYNTHETIC:
        base = f"{data.synthetic_scenes} scenes, seed {data.synthetic_seed}, {data.synthetic_image_size} px"
        shown = {"dataset", "synthetic_scenes", "synthetic_seed", "synthetic_image_size"}
    else:
        base, shown = keys["root"], {"dataset", "root"}
    extra = [f"data.{k}={v}" for k, v in sorted(keys.items()) if k not in shown and v != _DEFAULTS.get(k)]
    return f"{data.dataset} ({', '.join([base, *extra])})"


def run_dataset(record: dict[str, Any], data: DataConfig | None) -> str | None:
    """The data one run's evaluation scored, in words: the ``"dataset"`` its ``record`` names, else
    :func:`dataset_label` of the data config it was made with; None for a run without an evaluation."""
    if not record:
        return None
    if record.get("dataset"):
        return str(record["dataset"])
    return None if data is None else dataset_label(data, evaluated_role(record, data) or "test")


def gallery_of_run(record: dict[str, Any], data: DataConfig | None) -> str | None:
    """One run's gallery: ``"<split> <images> x <captions> of <dataset>"`` (:func:`run_dataset`), from its
    evaluation ``record`` and the data config it was made with; None for a run without an evaluation."""
    if not record:
        return None
    split = scored_split(record, data) or "?"
    size = f"{split} {record.get('images') or '?'} x {record.get('captions') or '?'}"
    dataset = run_dataset(record, data)
    return f"{size} of {dataset}" if dataset else size
