"""Karpathy's ``dataset_{coco,flickr30k,flickr8k}.json`` split files."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from patchword.data.split import RetrievalSplit, TextOrigin, qualified_ids
from patchword.data.textfiles import assemble_split, first_repeat, load_json, require_file, resolve_images
from patchword.errors import ConfigError, DataError

__all__ = ["load_karpathy_json", "karpathy_split_reader", "require_karpathy_split"]

PathLike = str | os.PathLike[str]

# Karpathy's json calls the dev split "val"; LAPS/SCAN file names call it "dev".
_KARPATHY_SPLITS = ("train", "val", "test", "restval")
_SPLIT_ALIASES = {"dev": "val"}


_SPLIT_NAMES = ", ".join((*_KARPATHY_SPLITS, *_SPLIT_ALIASES))


def karpathy_split_name(split: str) -> str:
    """The json's own name of ``split`` (``dev`` is ``val``): two names of one Karpathy split compare equal
    through it."""
    return _SPLIT_ALIASES.get(split, split)


def require_karpathy_split(split: str, key: str, path: PathLike) -> None:
    """Refuse a split name :func:`load_karpathy_json` does not read, naming the config ``key`` that set it.

    Raises:
        ConfigError: naming ``key``, the json file and the names it reads.
    """
    if karpathy_split_name(split) not in _KARPATHY_SPLITS:
        raise ConfigError(
            key, f"is {split!r}, not a split of the Karpathy json {path}: expected one of {_SPLIT_NAMES}"
        )


def _karpathy_splits(split: str, restval_into_train: bool, path: Path) -> set[str]:
    wanted = karpathy_split_name(split)
    if wanted not in _KARPATHY_SPLITS:
        raise ValueError(f"{path}: unknown Karpathy split {split!r}; expected one of {_SPLIT_NAMES}")
    if wanted == "train" and restval_into_train:
        return {"train", "restval"}
    return {wanted}


def _karpathy_field(entry: object, key: str, path: Path, index: int) -> object:
    if not isinstance(entry, dict) or key not in entry:
        raise ValueError(f"{path}: images[{index}] has no {key!r} field")
    return entry[key]


def _string_field(entry: dict, key: str, path: Path, index: int, default: str | None = None) -> str:
    """A field that must be a non-empty string (``split``, ``filename``; ``filepath`` when present)."""
    value = entry.get(key, default) if default is not None else _karpathy_field(entry, key, path, index)
    if not isinstance(value, str) or (not value and default is None):
        raise ValueError(f"{path}: images[{index}] field {key!r} is {value!r}, expected a non-empty string")
    return value


def _image_id(entry: dict, name: str, path: Path, index: int) -> tuple[str, str]:
    """``(field, id)``: LAPS identifies COCO images by COCO id and Flickr30K images by Karpathy index
    (``imgid``); an image with neither is named by its file (field ``file``). The field qualifies the id:
    COCO id 5 and Karpathy index 5 are different images."""
    for key in ("cocoid", "imgid"):
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
                raise ValueError(
                    f"{path}: images[{index}] field {key!r} is {value!r}, expected an integer or string id"
                )
            return key, str(value)
    return "file", name


def _karpathy_image(entry: dict, path: Path, index: int) -> tuple[str, tuple[str, str], list[str]]:
    """``(relative file path, (id field, image id), raw captions)`` of one ``images[]`` entry."""
    filename = _string_field(entry, "filename", path, index)
    # COCO entries keep the sub-folder (train2014 / val2014) in "filepath"; Flickr30K has none.
    name = str(Path(_string_field(entry, "filepath", path, index, default="")) / filename)
    image_id = _image_id(entry, name, path, index)
    sentences = _karpathy_field(entry, "sentences", path, index)
    if not isinstance(sentences, list) or not sentences:
        raise ValueError(f"{path}: images[{index}] ({name}) has no sentences")
    captions = []
    for k, sentence in enumerate(sentences):
        raw = sentence.get("raw") if isinstance(sentence, dict) else None
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(f"{path}: images[{index}].sentences[{k}] ({name}) has an empty or missing 'raw'")
        captions.append(raw.strip())
    return name, image_id, captions


def load_karpathy_json(
    path: PathLike,
    split: str,
    image_root: PathLike | None,
    *,
    restval_into_train: bool = True,
    dense_jsonl: PathLike | None = None,
    check_images: bool = True,
) -> RetrievalSplit:
    """Load one split of a Karpathy ``dataset_{coco,flickr30k,flickr8k}.json``.

    Args:
        path: the json file (``{"images": [{"split", "filename", "filepath"?, "sentences": [{"raw"}]}]}``).
        split: ``train``, ``val`` (alias ``dev``), ``test`` or ``restval``.
        image_root: folder holding ``filepath/filename``; ``None`` for a text-only split.
        restval_into_train: COCO convention: ``train`` also takes the ``restval`` images (113,287 total).
        dense_jsonl: optional dense captions, one JSON line per image of this split, in json order.
        check_images: with an ``image_root``, raise if any image file is missing.

    Returns:
        a split with images in json order, each image's sentences consecutive; ``image_ids`` are COCO ids
        (``cocoid``), else Karpathy indices (``imgid``), else the relative file names, and
        ``image_id_fields`` says which of the three each is.

    Raises:
        DataError: an entry whose ``split`` is none of train, val, test, restval (it would be in no
            split), or two entries of the split with the same id or file.
    """
    path = require_file(path, "Karpathy split file")
    return _split_of(path, _entries(path), split, image_root, restval_into_train, dense_jsonl, check_images)


def karpathy_split_reader(
    path: PathLike, image_root: PathLike | None, *, restval_into_train: bool = True
) -> Callable[[str], RetrievalSplit]:
    """Parse the json once (a COCO json is 140 MB) and return ``split -> load_karpathy_json(path, split,
    image_root, check_images=False)`` without dense captions, for a caller that reads several splits'
    image lists (each call raises as :func:`load_karpathy_json` does)."""
    path = require_file(path, "Karpathy split file")
    entries = _entries(path)
    return lambda split: _split_of(path, entries, split, image_root, restval_into_train, None, False)


def _entries(path: Path) -> list:
    """The ``images`` list of the json at ``path``."""
    data = load_json(path)
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON object with an 'images' list")
    return entries


def _split_of(
    path: Path,
    entries: list,
    split: str,
    image_root: PathLike | None,
    restval_into_train: bool,
    dense_jsonl: PathLike | None,
    check_images: bool,
) -> RetrievalSplit:
    """:func:`load_karpathy_json` of the parsed ``entries``."""
    wanted = _karpathy_splits(split, restval_into_train, path)
    names, image_ids, fields, captions, txt2img, entry_of, places = [], [], [], [], [], [], []
    for index, entry in enumerate(entries):
        entry_split = _string_field(entry, "split", path, index)
        if entry_split not in _KARPATHY_SPLITS:
            # skipping it ('Test', 'testing') would leave the image out of every split without a word
            raise DataError(
                f"{path}: images[{index}] has split {entry_split!r}, not one of {', '.join(_KARPATHY_SPLITS)}"
            )
        if entry_split not in wanted:
            continue
        name, (field, image_id), sentences = _karpathy_image(entry, path, index)
        txt2img.extend([len(names)] * len(sentences))
        names.append(name)
        image_ids.append(image_id)
        fields.append(field)
        entry_of.append(index)
        captions.extend(sentences)
        places.extend((index, k) for k in range(len(sentences)))
    if not names:
        raise ValueError(f"{path}: no images in split {split!r} (looked for split in {sorted(wanted)})")
    _refuse_repeated_images(path, names, image_ids, fields, entry_of)
    return assemble_split(
        name=split,
        images=resolve_images(names, image_root, check_images),
        captions=captions,
        txt2img=np.asarray(txt2img, dtype=np.int64),
        image_ids=image_ids,
        dense_jsonl=dense_jsonl,
        caption_origin=TextOrigin(str(path), np.asarray(places, dtype=np.int64).reshape(-1, 2)),
        image_id_fields=fields,
    )


def _refuse_repeated_images(
    path: Path, names: list[str], image_ids: list[str], fields: list[str], entry_of: list[int]
) -> None:
    """Two ``images[]`` entries of the split with the same id (read from the same field) or file are one
    image under two indices, tied in every ranking (a tie ranks the ground truth behind the other copy):
    refused, naming both.

    Raises:
        DataError: naming the json file, both entries and what they share.
    """
    files = [os.path.normpath(name) for name in names]
    qualified = qualified_ids(image_ids, fields)
    for what, keys, shown in (("id", qualified, image_ids), ("file", files, files)):
        repeat = first_repeat(keys)
        if repeat is not None:
            i, j = repeat
            raise DataError(
                f"{path}: images[{entry_of[i]}] and images[{entry_of[j]}] have the same {what} {shown[j]!r}; "
                "each image of the split needs its own id and file (one image under two entries ties with "
                "itself in every ranking)"
            )
