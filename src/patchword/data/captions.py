"""Readers that turn real caption files into a :class:`~patchword.data.split.RetrievalSplit`.

Two on-disk layouts are supported:

* the LAPS / SEPS (and SCAN / VSE++) layout: ``{split}_caps.txt`` with one caption per line,
  ``{split}_ids.txt`` with the image id of each line, and ``id_mapping.json`` from id to file name;
* Karpathy's ``dataset_{coco,flickr30k}.json``.

Both can attach SEPS dense (MLLM) captions from a ``.jsonl`` file with one line per image in image order.
The readers only build the text side and the file list; pixels are read lazily by
:mod:`patchword.data.images`. With ``image_root=None`` the split is text only and ``images`` holds the
relative file names (or the bare ids when no id mapping is known), so the shipped caption files can be
used without the image archives.

Every malformed input raises an error that names the file and, where it applies, the line or field, so a
broken download is diagnosed without a debugger.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from patchword.data.split import RetrievalSplit

__all__ = ["load_laps_split", "load_karpathy_json", "load_dense_jsonl", "load_id_mapping", "read_lines"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

# Karpathy's json calls the dev split "val"; LAPS/SCAN file names call it "dev".
_KARPATHY_SPLITS = ("train", "val", "test", "restval")
_SPLIT_ALIASES = {"dev": "val"}


# --------------------------------------------------------------------------------------------------------
# Plain file readers
# --------------------------------------------------------------------------------------------------------


def _require_file(path: PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(1-based line number, line without its newline)``.

    Iterating the text file splits on newlines only (universal newlines, like the official loaders);
    ``str.splitlines`` would also split on form feeds and Unicode separators and shift every later line.
    """
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                yield lineno, line.rstrip("\n")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not valid UTF-8: {err}") from err


def read_lines(path: PathLike, what: str = "line") -> list[str]:
    """Read a one-item-per-line text file, stripping whitespace.

    Args:
        path: the text file.
        what: what a line holds (``"caption"``, ``"image id"``), used in error messages.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is empty after stripping (named by file and line number).
    """
    path = _require_file(path, f"{what} file")
    lines = []
    for lineno, line in _iter_lines(path):
        item = line.strip()
        if not item:
            raise ValueError(f"{path}:{lineno}: empty {what}")
        lines.append(item)
    return lines


def _load_json(path: Path) -> object:
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON at line {err.lineno}: {err.msg}") from err
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not valid UTF-8: {err}") from err


def load_dense_jsonl(path: PathLike) -> list[str]:
    """Read SEPS dense captions: one ``{"text": ..., "model_id": ..., "metadata": {...}}`` per line.

    Only ``text`` is kept; lines stay in file order, which is image order in the SEPS release.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is blank, is not valid JSON, or lacks a non-empty string ``text`` field.
    """
    path = _require_file(path, "dense caption file")
    texts = []
    for lineno, line in _iter_lines(path):
        if not line.strip():
            raise ValueError(f"{path}:{lineno}: empty line (expected one JSON object per image)")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{lineno}: malformed JSON: {err.msg}") from err
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{lineno}: expected an object with a non-empty string field 'text'")
        texts.append(text.strip())
    return texts


def load_id_mapping(path: PathLike) -> dict[str, str]:
    """Read an ``id_mapping.json`` (image id -> file name relative to the image root).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: malformed JSON, not an object, or a value that is not a non-empty string.
    """
    path = _require_file(path, "id mapping")
    mapping = _load_json(path)
    if not isinstance(mapping, dict):
        raise ValueError(f"{path}: expected a JSON object mapping image id -> file name")
    for key, name in mapping.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{path}: id {key!r} maps to {name!r}, expected a non-empty file name")
    return mapping


# --------------------------------------------------------------------------------------------------------
# Shared split assembly
# --------------------------------------------------------------------------------------------------------


def _unique_in_order(keys: Sequence[str]) -> tuple[list[str], np.ndarray, list[int]]:
    """Unique keys in first-appearance order.

    Returns:
        uniques: the U distinct keys.
        inverse: (len(keys),) int64 position of each key in ``uniques``.
        first: U indices into ``keys`` where each unique key first appears.
    """
    position: dict[str, int] = {}
    first: list[int] = []
    inverse = np.empty(len(keys), dtype=np.int64)
    for i, key in enumerate(keys):
        if key not in position:
            position[key] = len(first)
            first.append(i)
        inverse[i] = position[key]
    return list(position), inverse, first


def _resolve_images(names: Sequence[str], image_root: PathLike | None, check_images: bool) -> list[str]:
    """Join relative image names to ``image_root`` and, if asked, check that every file exists.

    Without a root the names are returned unchanged (a text-only split).
    """
    if image_root is None:
        return list(names)
    root = Path(image_root)
    paths = [str(root / name) for name in names]
    if check_images:
        if not root.is_dir():
            raise FileNotFoundError(f"image root is not a directory: {root}")
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            shown = ", ".join(missing[:3])
            raise FileNotFoundError(
                f"{len(missing)} of {len(paths)} image files are missing under {root}, e.g. {shown} "
                "(pass check_images=False to build the split anyway)"
            )
    return paths


def _load_dense_for(path: PathLike, num_images: int, num_captions: int) -> list[str]:
    """Dense captions for a split of ``num_images`` images, checked to be one per image."""
    dense = load_dense_jsonl(path)
    if len(dense) != num_images:
        hint = ""
        if len(dense) == num_captions:
            hint = " (it has one line per caption; store one line per image, in image order)"
        raise ValueError(
            f"{path}: {len(dense)} dense captions for a split of {num_images} images; expected one line "
            f"per image in image order{hint}"
        )
    return dense


def _make_split(
    name: str,
    images: list[str],
    captions: list[str],
    txt2img: np.ndarray,
    image_ids: list[str],
    dense_jsonl: PathLike | None,
) -> RetrievalSplit:
    dense = None if dense_jsonl is None else _load_dense_for(dense_jsonl, len(images), len(captions))
    split = RetrievalSplit(
        name=name,
        images=images,
        captions=captions,
        txt2img=txt2img,
        image_ids=image_ids,
        dense_captions=dense,
    )
    logger.info(
        "loaded split %r: %d images, %d captions%s",
        name,
        split.num_images,
        split.num_captions,
        "" if dense is None else ", dense captions",
    )
    return split


# --------------------------------------------------------------------------------------------------------
# LAPS / SEPS layout
# --------------------------------------------------------------------------------------------------------


def _caption_to_id_line(n_caps: int, n_ids: int, caps_file: Path, ids_file: Path) -> np.ndarray:
    """(n_caps,) index of the ids-file line that gives each caption's image.

    dev/test ids files repeat each id once per caption (same length as the captions); train files list each
    image once and its ``im_div`` captions are consecutive, so caption ``i`` belongs to line ``i // im_div``.
    """
    if n_ids == n_caps:
        return np.arange(n_caps, dtype=np.int64)
    if n_ids == 0 or n_ids > n_caps or n_caps % n_ids:
        raise ValueError(
            f"{caps_file} has {n_caps} captions but {ids_file} has {n_ids} ids: expected one id per caption "
            "or one id per image with the same whole number of consecutive captions per image"
        )
    im_div = n_caps // n_ids
    return np.arange(n_caps, dtype=np.int64) // im_div


def _image_names(
    ids: list[str],
    first_lines: list[int],
    ids_file: Path,
    data_dir: Path,
    id_mapping: PathLike | Mapping[str, str] | None,
    image_root: PathLike | None,
) -> list[str]:
    """Relative file names of the unique image ids (or the ids themselves for a text-only split)."""
    if id_mapping is None:
        default = data_dir / "id_mapping.json"
        if not default.is_file():
            if image_root is not None:
                raise FileNotFoundError(
                    f"id mapping not found: {default}; pass id_mapping= (a json file or a dict id -> file "
                    "name) to locate the images, or image_root=None for a text-only split"
                )
            return list(ids)
        id_mapping = default
    if isinstance(id_mapping, Mapping):
        mapping, source = id_mapping, "the id_mapping dict"
    else:
        mapping, source = load_id_mapping(id_mapping), str(id_mapping)
    names = []
    for image_id, line in zip(ids, first_lines, strict=True):
        if image_id not in mapping:
            raise ValueError(f"image id {image_id!r} ({ids_file}:{line + 1}) is missing from {source}")
        names.append(mapping[image_id])
    return names


def load_laps_split(
    data_dir: PathLike,
    split: str,
    image_root: PathLike | None,
    *,
    dense_jsonl: PathLike | None = None,
    id_mapping: PathLike | Mapping[str, str] | None = None,
    check_images: bool = True,
) -> RetrievalSplit:
    """Load a split in the official LAPS / SEPS layout.

    ``data_dir`` holds ``{split}_caps.txt`` (one caption per line) and ``{split}_ids.txt``. The ids file
    either has one line per caption (dev/test: each id repeated 5x) or one line per image (train: each
    image's ``im_div = n_caps / n_ids`` captions are consecutive). Images are the distinct ids in order of
    first appearance.

    Args:
        data_dir: folder with the caption and id files (``data/f30k`` in the official repos).
        split: file prefix: ``train``, ``dev``, ``test`` or ``testall`` (COCO 5K).
        image_root: folder the mapped file names are relative to; ``None`` for a text-only split.
        dense_jsonl: optional SEPS dense captions, one JSON line per image in image order (the official
            code repeats them per caption; here they are stored once per image).
        id_mapping: ``id_mapping.json`` path or a dict from id (a string, as in the file) to file name;
            defaults to ``data_dir/id_mapping.json``. COCO's mapping is not distributed with the repos, so
            without it (and without an image root) the ids themselves are used as image names.
        check_images: with an ``image_root``, raise if any image file is missing.

    Returns:
        a split whose ``images`` are file paths (``image_root / name``), or the relative names / ids when
        ``image_root`` is None; ``image_ids`` are the dataset ids as strings; ``txt2img`` is (N_txt,).
    """
    data_dir = Path(data_dir)
    caps_file = data_dir / f"{split}_caps.txt"
    ids_file = data_dir / f"{split}_ids.txt"
    captions = read_lines(caps_file, "caption")
    id_lines = read_lines(ids_file, "image id")
    line_of_caption = _caption_to_id_line(len(captions), len(id_lines), caps_file, ids_file)
    image_ids, line_to_image, first_lines = _unique_in_order(id_lines)
    names = _image_names(image_ids, first_lines, ids_file, data_dir, id_mapping, image_root)
    return _make_split(
        name=split,
        images=_resolve_images(names, image_root, check_images),
        captions=captions,
        txt2img=line_to_image[line_of_caption],
        image_ids=image_ids,
        dense_jsonl=dense_jsonl,
    )


# --------------------------------------------------------------------------------------------------------
# Karpathy json
# --------------------------------------------------------------------------------------------------------


def _karpathy_splits(split: str, restval_into_train: bool) -> set[str]:
    wanted = _SPLIT_ALIASES.get(split, split)
    if wanted not in _KARPATHY_SPLITS:
        choices = ", ".join((*_KARPATHY_SPLITS, *_SPLIT_ALIASES))
        raise ValueError(f"unknown Karpathy split {split!r}; expected one of {choices}")
    if wanted == "train" and restval_into_train:
        return {"train", "restval"}
    return {wanted}


def _karpathy_field(entry: object, key: str, path: Path, index: int) -> object:
    if not isinstance(entry, dict) or key not in entry:
        raise ValueError(f"{path}: images[{index}] has no {key!r} field")
    return entry[key]


def _karpathy_image(entry: dict, path: Path, index: int) -> tuple[str, str, list[str]]:
    """``(relative file path, image id, raw captions)`` of one ``images[]`` entry."""
    filename = _karpathy_field(entry, "filename", path, index)
    # COCO entries keep the sub-folder (train2014 / val2014) in "filepath"; Flickr30K has none.
    name = str(Path(entry.get("filepath", "")) / str(filename))
    # LAPS identifies COCO images by COCO id and Flickr30K images by Karpathy index (``imgid``).
    image_id = str(entry.get("cocoid", entry.get("imgid", name)))
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
        (``cocoid``), else Karpathy indices (``imgid``), else the relative file names.
    """
    path = _require_file(path, "Karpathy split file")
    data = _load_json(path)
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a JSON object with an 'images' list")
    wanted = _karpathy_splits(split, restval_into_train)
    names, image_ids, captions, txt2img = [], [], [], []
    for index, entry in enumerate(entries):
        if _karpathy_field(entry, "split", path, index) not in wanted:
            continue
        name, image_id, sentences = _karpathy_image(entry, path, index)
        txt2img.extend([len(names)] * len(sentences))
        names.append(name)
        image_ids.append(image_id)
        captions.extend(sentences)
    if not names:
        raise ValueError(f"{path}: no images in split {split!r} (looked for split in {sorted(wanted)})")
    return _make_split(
        name=split,
        images=_resolve_images(names, image_root, check_images),
        captions=captions,
        txt2img=np.asarray(txt2img, dtype=np.int64),
        image_ids=image_ids,
        dense_jsonl=dense_jsonl,
    )
