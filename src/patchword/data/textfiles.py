"""Plain text-file readers shared by the dataset loaders, and the assembly of a split from their output.

Every malformed input raises an error that names the file and, where it applies, the line or field, so a
broken download is diagnosed without a debugger.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from patchword.data.split import RetrievalSplit

__all__ = [
    "read_lines",
    "load_dense_jsonl",
    "load_json",
    "require_file",
    "iter_lines",
    "resolve_images",
    "assemble_split",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def require_file(path: PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
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
    path = require_file(path, f"{what} file")
    lines = []
    for lineno, line in iter_lines(path):
        item = line.strip()
        if not item:
            raise ValueError(f"{path}:{lineno}: empty {what}")
        lines.append(item)
    return lines


def load_json(path: Path) -> object:
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
    path = require_file(path, "dense caption file")
    texts = []
    for lineno, line in iter_lines(path):
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


def resolve_images(names: Sequence[str], image_root: PathLike | None, check_images: bool) -> list[str]:
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
                "(set data.check_images=false, or pass check_images=False to the loader, to build the split "
                "anyway)"
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


def assemble_split(
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
