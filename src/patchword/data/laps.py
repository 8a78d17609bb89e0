"""The official LAPS / SEPS (and SCAN / VSE++) caption layout: ``{split}_caps.txt`` with one caption per
line, ``{split}_ids.txt`` with the image id of each line, and ``id_mapping.json`` from id to file name.

Dense (MLLM) captions attach from a SEPS ``.jsonl`` file with one line per image in image order. Only the
text side and the file list are read here; pixels are decoded lazily by :mod:`patchword.data.images`.
With ``image_root=None`` the split is text only and ``images`` holds the relative file names (or the bare
ids when no id mapping is known), so the shipped caption files can be used without the image archives.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from patchword.data.split import RetrievalSplit
from patchword.data.textfiles import (
    assemble_split,
    captions_per_image_mismatch,
    first_repeat,
    line_origin,
    load_json,
    read_lines,
    require_file,
    resolve_images,
    second_run,
)
from patchword.errors import DataError

__all__ = ["load_laps_split", "load_id_mapping"]

PathLike = str | os.PathLike[str]


def load_id_mapping(path: PathLike) -> dict[str, str]:
    """Read an ``id_mapping.json`` (image id -> file name relative to the image root).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: malformed JSON, not an object, or a value that is not a non-empty string.
    """
    path = require_file(path, "id mapping")
    mapping = load_json(path)
    if not isinstance(mapping, dict):
        raise ValueError(f"{path}: expected a JSON object mapping image id -> file name")
    for key, name in mapping.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{path}: id {key!r} maps to {name!r}, expected a non-empty file name")
    return mapping


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


def _caption_to_id_line(
    n_caps: int, id_lines: Sequence[str], caps_file: Path, ids_file: Path, captions_per_image: int | None
) -> np.ndarray:
    """(n_caps,) index of the ids-file line that gives each caption's image.

    dev/test ids files repeat each id once per caption (same length as the captions, some id repeated):
    the ids group the captions. Train files list each image once and its ``im_div = n_caps / n_ids``
    captions are consecutive, so caption ``i`` belongs to line ``i // im_div``; ``im_div`` must be exactly
    ``captions_per_image`` (the official loaders hard-code 5). More would let an ids file of only part of
    the images give each image other images' captions; fewer, a captions file cut short at a multiple of
    the image count. As many distinct ids as captions is the one-id-per-image layout with one caption
    each (``captions_per_image=1``): with 5, it is 5 captions per image cut to one line per image.
    ``captions_per_image=None`` checks no count (a caller that reads only the images).

    Raises:
        ValueError: a caption count that is not a whole multiple of the id count.
        DataError: ``im_div != captions_per_image``, naming both files, the counts and the setting.
    """
    n_ids = len(id_lines)
    if n_ids == n_caps and (captions_per_image in (None, 1) or first_repeat(id_lines) is not None):
        return np.arange(n_caps, dtype=np.int64)
    if n_ids == 0 or n_ids > n_caps or n_caps % n_ids:
        raise ValueError(
            f"{caps_file} has {n_caps} captions but {ids_file} has {n_ids} ids: expected one id per caption "
            "or one id per image with the same whole number of consecutive captions per image"
        )
    im_div = n_caps // n_ids
    if captions_per_image is not None and im_div != captions_per_image:
        raise DataError(
            f"{caps_file} has {n_caps} captions but {ids_file} has {n_ids} ids (one per image): "
            + captions_per_image_mismatch(im_div, captions_per_image, "an ids file")
        )
    return np.arange(n_caps, dtype=np.int64) // im_div


def _check_image_lines(
    id_lines: Sequence[str], n_caps: int, ids_file: Path, captions_per_image: int | None
) -> None:
    """Each image's lines in the ids file are one block: ids that could merge two images are refused.

    With one id per caption (dev / test) each image's captions are consecutive lines repeating its id, as
    the official evaluation assumes (image ``i``'s captions are lines ``5i..5i+4``): an id that starts a
    second run is two images under one id (a run relabelled, a file of two splits) or captions out of
    order, and grouping by id would silently merge them. In the one-id-per-image layout (fewer ids than
    captions), and with ``captions_per_image=1`` (one caption per image), every line is its own image, so
    any repeated id would merge two images (the second one's captions joining the first's, its file
    dropped).

    Raises:
        DataError: naming the ids file, the line of the second run (or repeat) and the first one.
    """
    n_ids = len(id_lines)
    if n_ids == n_caps and captions_per_image != 1:
        split = second_run(id_lines)
        if split is not None:
            first, line = split
            raise DataError(
                f"{ids_file}:{line + 1}: id {id_lines[line]!r} starts a second run (the first at line "
                f"{first + 1}); with one id per caption each image's captions are consecutive lines "
                "repeating its id: give each image its own id, and its captions one block of lines"
            )
        return
    repeat = first_repeat(id_lines)
    if repeat is None:
        return
    first, line = repeat
    layout = (
        f"data.captions_per_image=1 (one caption per image, {n_ids} ids for {n_caps} captions) every "
        "line must be a distinct image; if the ids repeat once per caption of each image, set "
        "data.captions_per_image to that count"
        if n_ids == n_caps
        else f"one id per image ({n_ids} ids for {n_caps} captions) every line must be a distinct image"
    )
    raise DataError(
        f"{ids_file}:{line + 1}: image id {id_lines[line]!r} repeats line {first + 1}; with {layout}"
    )


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
                # Said for data.* users; a library caller may instead pass id_mapping= or image_root=None.
                raise FileNotFoundError(
                    f"id mapping not found: {default}; put id_mapping.json (a JSON object: image id -> file "
                    f"name relative to data.image_root) in {data_dir}"
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
    # One file under two ids would be two images of the split, tied in every ranking (a tie ranks the
    # ground truth behind the other copy).
    repeat = first_repeat([os.path.normpath(name) for name in names])
    if repeat is not None:
        i, j = repeat
        raise DataError(
            f"{source}: ids {ids[i]!r} ({ids_file}:{first_lines[i] + 1}) and {ids[j]!r} "
            f"({ids_file}:{first_lines[j] + 1}) both map to {names[j]!r}: one image under two ids; map each "
            "id of the split to its own file"
        )
    return names


def load_laps_split(
    data_dir: PathLike,
    split: str,
    image_root: PathLike | None,
    *,
    dense_jsonl: PathLike | None = None,
    id_mapping: PathLike | Mapping[str, str] | None = None,
    check_images: bool = True,
    captions_per_image: int | None = 5,
) -> RetrievalSplit:
    """Load a split in the official LAPS / SEPS layout.

    ``data_dir`` holds ``{split}_caps.txt`` (one caption per line) and ``{split}_ids.txt``. The ids file
    either has one line per caption (dev/test: each id repeated 5x, each image's lines consecutive, checked)
    or one line per image (train: each image's ``im_div = n_caps / n_ids`` captions are consecutive,
    exactly ``captions_per_image``, and every line is a distinct image; as many distinct ids as captions
    counts as one line per image, and with ``captions_per_image=1`` every line is a distinct image). Images
    are the distinct ids in order of first appearance.

    Args:
        data_dir: folder with the caption and id files (``data/f30k`` in the official repos).
        split: file prefix: ``train``, ``dev``, ``test`` or ``testall`` (COCO 5K).
        image_root: folder the mapped file names are relative to; ``None`` for a text-only split.
        dense_jsonl: optional SEPS dense captions, one JSON line per image in image order (the official
            code repeats them per caption; here they are stored once per image).
        id_mapping: ``id_mapping.json`` path or a dict from id (a string, as in the file) to file name;
            defaults to ``data_dir/id_mapping.json``. COCO's mapping is not distributed with the repos, so
            without it (and without an image root) the ids themselves are used as image names; with an
            image root and no ``data_dir/id_mapping.json``, pass ``id_mapping=`` (or ``image_root=None``
            for a text-only split).
        check_images: with an ``image_root``, raise if any image file is missing.
        captions_per_image: the captions of each image in the one-id-per-image layout
            (``data.captions_per_image``; the official loaders hard-code 5); more or fewer are refused.
            ``None``: no count is checked, for a caller that reads only the images (densify).

    Returns:
        a split whose ``images`` are file paths (``image_root / name``), or the relative names / ids when
        ``image_root`` is None; ``image_ids`` are the dataset ids as strings; ``txt2img`` is (N_txt,).
    """
    data_dir = Path(data_dir)
    caps_file = data_dir / f"{split}_caps.txt"
    ids_file = data_dir / f"{split}_ids.txt"
    captions = read_lines(caps_file, "caption")
    if not captions:
        raise DataError(f"{caps_file}: empty: no captions")
    id_lines = read_lines(ids_file, "image id")
    line_of_caption = _caption_to_id_line(len(captions), id_lines, caps_file, ids_file, captions_per_image)
    image_ids, line_to_image, first_lines = _unique_in_order(id_lines)
    # ids the mapping lacks first: an unknown id inside an image's block would read as a second run of it
    names = _image_names(image_ids, first_lines, ids_file, data_dir, id_mapping, image_root)
    _check_image_lines(id_lines, len(captions), ids_file, captions_per_image)
    return assemble_split(
        name=split,
        images=resolve_images(names, image_root, check_images),
        captions=captions,
        txt2img=line_to_image[line_of_caption],
        image_ids=image_ids,
        dense_jsonl=dense_jsonl,
        caption_origin=line_origin(caps_file, len(captions)),
    )
