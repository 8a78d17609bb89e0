"""Reading image files for on-disk retrieval splits, and finding the damaged ones.

Images are decoded lazily, one per ``__getitem__``, so a DataLoader's workers share the decoding cost.
A damaged file (a truncated JPEG or PNG, common in partial Flickr30K / COCO downloads) is never used
half-decoded: the official LAPS / SEPS loader sets Pillow's ``LOAD_TRUNCATED_IMAGES`` and trains on the
grey-padded remainder without a word; here every decode runs with the flag off and a damaged file is a
:class:`~patchword.errors.DataError` naming it. :func:`find_bad_images` decodes every image of a split
completely, so that ``patchword data check`` lists the damaged files and ``train`` / ``eval`` refuse them
(or leave them out with ``data.skip_bad_images=true``) before anything is written.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile, UnidentifiedImageError
from torch.utils.data import Dataset

from patchword.data.split import RetrievalSplit

__all__ = [
    "load_image",
    "image_problem",
    "check_image_files",
    "find_bad_images",
    "describe_bad_images",
    "ImageFolderSplit",
]

PathLike = str | os.PathLike[str]

_logger = logging.getLogger(__name__)

#: Bad files named in one error line (the rest are counted).
SHOWN_BAD = 3

_STRICT_LOCK = threading.Lock()
_strict_users = 0
_flag_before = False


@contextmanager
def _strict_decoding() -> Iterator[None]:
    """Make Pillow refuse truncated files inside the block, whatever the process set.

    ``ImageFile.LOAD_TRUNCATED_IMAGES`` is a Pillow module global (an application embedding patchword may
    have turned it on). The blocks of all threads share one count: the first to enter turns the flag off,
    the last to leave restores it, so none restores it while another thread still decodes, and the lock
    is held only around the count, never during a decode (index building decodes in threads).
    """
    global _strict_users, _flag_before
    with _STRICT_LOCK:
        if _strict_users == 0:
            _flag_before = ImageFile.LOAD_TRUNCATED_IMAGES
            ImageFile.LOAD_TRUNCATED_IMAGES = False
        _strict_users += 1
    try:
        yield
    finally:
        with _STRICT_LOCK:
            _strict_users -= 1
            if _strict_users == 0:
                ImageFile.LOAD_TRUNCATED_IMAGES = _flag_before


# Pillow reports corrupt data through all of these depending on the codec (a truncated file is an
# OSError "image file is truncated", a broken PNG chunk a SyntaxError or ValueError).
_DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError)
# Pillow refuses files over ``Image.MAX_IMAGE_PIXELS`` (x2) with a DecompressionBombError.
_BOMB = "refused as a decompression bomb"
# A directory where an image file was listed (Pillow's open says "[Errno 21] Is a directory").
_DIRECTORY = "a directory, not a file"


def _decode_failure(err: BaseException) -> str:
    """A short reason for a failed decode: ``truncated file, ...``, ``damaged file, ...`` or ``not a
    readable image ...``."""
    if isinstance(err, UnidentifiedImageError):
        return "not a readable image (unrecognised content)"
    if isinstance(err, IsADirectoryError):
        return _DIRECTORY
    text = str(err) or type(err).__name__
    kind = "truncated" if "truncated" in text.lower() else "damaged"
    return f"{kind} file, cannot be decoded completely ({text})"


def load_image(path: PathLike) -> Image.Image:
    """Decode an image file completely, as RGB.

    A truncated or otherwise damaged file is an error, never an image decoded as far as it goes (see the
    module docstring).

    Raises:
        MissingFileError: the file does not exist.
        DataError: a directory, or a file that is not an image, is truncated or damaged, or is over
            Pillow's pixel limit (a decompression bomb); names the file and the reason.
    """
    from patchword.errors import DataError, MissingFileError

    path = Path(path)
    if path.is_dir():
        raise DataError(f"cannot read image {path}: {_DIRECTORY}")
    if not path.is_file():
        raise MissingFileError(f"image file not found: {path}")
    try:
        # convert() forces the decode, which Pillow otherwise defers.
        with _strict_decoding(), Image.open(path) as image:
            return image.convert("RGB")
    except _DECODE_ERRORS as err:
        raise DataError(f"cannot read image {path}: {_decode_failure(err)}") from err
    except Image.DecompressionBombError as err:
        # Not an OSError: without this clause a huge image escapes as a traceback (densify's
        # --skip-bad-images, a training worker) instead of an unreadable file like the others.
        raise DataError(f"cannot read image {path}: {_BOMB} ({err})") from err


def image_problem(path: PathLike) -> str | None:
    """Why ``path`` is not a usable image after decoding it completely; None when it is fine.

    Reasons: ``missing``, ``a directory, not a file``, ``empty file``, ``not a readable image (...)``,
    ``zero-sized image``, ``truncated file ...``, ``damaged file ...``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return _DIRECTORY
    try:
        size = os.path.getsize(path)
    except OSError:
        return "missing"
    if size == 0:
        return "empty file"
    try:
        with _strict_decoding(), Image.open(path) as image:
            if image.width == 0 or image.height == 0:
                return "zero-sized image"
            image.load()
    except _DECODE_ERRORS as err:
        return _decode_failure(err)
    except Image.DecompressionBombError as err:
        return f"{_BOMB} ({err})"
    return None


def _decode_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def find_bad_images(
    paths: Sequence[PathLike], what: str = "split", progress: bool | None = None, workers: int | None = None
) -> list[tuple[str, str]]:
    """``(path, problem)`` of every file that is missing, empty, not an image, truncated or damaged, in
    the order of ``paths``.

    Every image is decoded completely (:func:`image_problem`), in ``workers`` threads (default
    min(4, CPUs); Pillow releases the GIL while decoding): about a minute for Flickr30K and four for COCO
    on one core, once per ``train`` / ``eval`` start (docs/benchmarks.md, "Numbers behind code choices");
    reading the header alone would be far cheaper but misses every file cut short after its header.
    """
    from patchword.progress import progress_bar

    paths = [os.fspath(p) for p in paths]
    bad: list[tuple[str, str]] = []
    chunk = 256  # bounded: a pool.map over a huge list would queue every future at once
    with (
        ThreadPoolExecutor(workers or _decode_workers(), thread_name_prefix="patchword-check") as pool,
        progress_bar(len(paths), f"check {what} images", progress, unit="image") as bar,
    ):
        for start in range(0, len(paths), chunk):
            block = paths[start : start + chunk]
            for path, problem in zip(block, pool.map(image_problem, block), strict=True):
                if problem:
                    bad.append((path, problem))
            bar.update(len(block))
    return bad


def describe_bad_images(bad: Sequence[tuple[str, str]], total: int, what: str) -> str:
    """One line: how many of ``total`` files of ``what`` are unusable and the first few with the reason."""
    shown = "; ".join(f"{p}: {why}" for p, why in bad[:SHOWN_BAD])
    more = f" (and {len(bad) - SHOWN_BAD} more)" if len(bad) > SHOWN_BAD else ""
    return f"{len(bad)} of {total} image files of the {what} are unusable: {shown}{more}"


def check_image_files(paths: Sequence[PathLike], what: str = "split", progress: bool | None = None) -> None:
    """Decode every image file completely and fail listing the bad ones.

    Catches missing, empty, non-image, truncated and damaged files before a run starts.

    Raises:
        DataError: naming how many files are bad and the first few with the reason.
    """
    from patchword.errors import DataError

    bad = find_bad_images(paths, what, progress)
    if bad:
        raise DataError(describe_bad_images(bad, len(paths), what))


class ImageFolderSplit(Dataset):
    """Images of an on-disk split, decoded and transformed on access.

    ``dataset[i]`` is ``(transform(image_i), i)``: a (3, H, W) float tensor for the standard transforms,
    and the image index, which is what the retrieval losses and the evaluation gather by.
    """

    def __init__(self, paths: Sequence[PathLike], transform: Callable[[Image.Image], torch.Tensor]) -> None:
        self.paths = list(paths)
        self.transform = transform

    @classmethod
    def from_split(
        cls, split: RetrievalSplit, transform: Callable[[Image.Image], torch.Tensor]
    ) -> ImageFolderSplit:
        """The images of a split built by an on-disk reader (``images`` must be file paths)."""
        if isinstance(split.images, np.ndarray | torch.Tensor):
            raise ValueError(f"split {split.name!r} holds in-memory images, not file paths")
        return cls(split.images, transform)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(load_image(self.paths[index])), index
