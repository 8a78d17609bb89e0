"""Reading image files for on-disk retrieval splits, and finding the damaged ones.

Images are decoded lazily, one per ``__getitem__``, so a DataLoader's workers share the decoding cost.
A damaged file (a truncated JPEG or PNG, common in partial Flickr30K / COCO downloads) is never used
half-decoded: the official LAPS / SEPS loader sets Pillow's ``LOAD_TRUNCATED_IMAGES`` and trains on the
grey-padded remainder without a word; here every decode runs with the flag off and a damaged file is a
:class:`~patchword.errors.DataError` naming it. :func:`find_bad_images` decodes every image of a split
completely, so that ``patchword data check`` lists the damaged files and ``train`` / ``eval`` refuse them
(or leave them out with ``data.skip_bad_images=true``) before anything is written.

Every image reaches the model as 8-bit RGB (:func:`rgb_image`): a 16-bit greyscale file (Pillow mode
``I;16``, or ``I`` as a 16-bit PGM opens) keeps its high byte, where Pillow's own ``convert("RGB")`` clips
every value above 255 to white; a floating-point one (mode ``F``) has no agreed scale and is refused. An
image over Pillow's ``MAX_IMAGE_PIXELS`` (but within its hard limit of twice that) is decoded, as Pillow
does, with one logged line naming the file instead of Pillow's ``DecompressionBombWarning``, which names none.
An EXIF orientation tag is applied only where asked (:func:`load_image`'s ``exif_orientation``): the
official loaders of the benchmark datasets ignore it, and a user's own photos need it.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset

from patchword.data.split import RetrievalSplit
from patchword.data.transforms import require_pil_image

__all__ = [
    "load_image",
    "load_transformed",
    "rgb_image",
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
# Pillow's DecompressionBombWarning ignored while any decode of ours runs (each large file is logged by
# name instead): the filter this module adds, removed again only if it was added here.
_QUIET_BOMB = ("ignore", None, Image.DecompressionBombWarning, None, 0)
_quiet_added = False
# Files over Pillow's MAX_IMAGE_PIXELS already logged by this process (a training run decodes each image
# once an epoch: one line per file is enough).
_LARGE_LOGGED: set[str] = set()


@contextmanager
def _strict_decoding() -> Iterator[None]:
    """Make Pillow refuse truncated files inside the block, whatever the process set, and keep its
    ``DecompressionBombWarning`` quiet (:func:`_log_if_large` names the file instead).

    ``ImageFile.LOAD_TRUNCATED_IMAGES`` and the warning filters are process globals (an application
    embedding patchword may have turned the flag on). The blocks of all threads share one count: the first
    to enter turns the flag off and adds the filter, the last to leave restores the flag and removes the
    filter, so none restores them while another thread still decodes, and the lock is held only around the
    count, never during a decode (index building decodes in threads). ``warnings.catch_warnings`` would
    not do: each thread's block would restore the filters another thread's block saved.
    """
    global _strict_users, _flag_before, _quiet_added
    with _STRICT_LOCK:
        if _strict_users == 0:
            _flag_before = ImageFile.LOAD_TRUNCATED_IMAGES
            ImageFile.LOAD_TRUNCATED_IMAGES = False
            _quiet_added = _QUIET_BOMB not in warnings.filters  # one the process set stays
            if _quiet_added:
                warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
        _strict_users += 1
    try:
        yield
    finally:
        with _STRICT_LOCK:
            _strict_users -= 1
            if _strict_users == 0:
                ImageFile.LOAD_TRUNCATED_IMAGES = _flag_before
                if _quiet_added and _QUIET_BOMB in warnings.filters:
                    # in place, as the warnings machinery reads the list; an "ignore" entry leaves nothing
                    # in the registries, so no cache needs resetting
                    warnings.filters.remove(_QUIET_BOMB)


def _log_if_large(path: str | os.PathLike[str], image: Image.Image) -> None:
    """One log line (once per file and process) for an image over Pillow's ``MAX_IMAGE_PIXELS``: Pillow
    decodes it with a warning naming no file (:func:`_strict_decoding` keeps that one quiet)."""
    limit = Image.MAX_IMAGE_PIXELS
    pixels = max(1, image.width) * max(1, image.height)  # as Pillow counts them
    if limit is None or pixels <= limit:
        return
    key = os.fspath(path)
    with _STRICT_LOCK:
        if key in _LARGE_LOGGED:
            return
        _LARGE_LOGGED.add(key)
    _logger.warning(
        "%s: %d pixels (%dx%d), over Pillow's decompression-bomb limit of %d (PIL.Image.MAX_IMAGE_PIXELS); "
        "decoded anyway (files over twice the limit are refused): a resized copy decodes faster",
        key,
        pixels,
        image.width,
        image.height,
        limit,
    )


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


#: Pillow's 16-bit greyscale modes (``I;16`` from a 16-bit PNG or TIFF, and its byte-order variants).
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_FLOAT_REFUSED = (
    "a 32-bit floating-point image (Pillow mode F) has no agreed scale to 8 bits; save it as an 8- or "
    "16-bit image"
)


class _NoEightBitReading(ValueError):
    """An image whose pixels have no 8-bit reading (:func:`rgb_image`): the file's content, not damage."""


def _eight_bit_problem(image: Image.Image) -> str | None:
    """Why ``image`` (decoded) has no 8-bit reading (:func:`rgb_image`); None when it has one."""
    if image.mode == "F":
        return _FLOAT_REFUSED
    if image.mode == "I":
        low, high = image.getextrema()
        if low < 0 or high > 65535:
            return (
                f"a 32-bit integer image (Pillow mode I) with values {low}..{high}, outside the 16-bit range "
                "0..65535 it is read in; save it as an 8- or 16-bit image"
            )
    return None


def rgb_image(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB, decoding it: Pillow's ``convert("RGB")``, except for greyscale of more than
    8 bits, which that clips (every 16-bit value above 255 becomes white).

    * 16-bit greyscale (mode ``I;16`` and variants; mode ``I``, which 16-bit PGM files open as, when its
      values lie in 0..65535): each value v becomes ``v >> 8``, its high byte, as Pillow reads 16-bit RGB
      PNGs and as the 8-bit version of the file would hold it;
    * mode ``I`` outside 0..65535, and floating-point mode ``F``: refused (no scale a user could expect).

    Raises:
        ValueError: a mode ``F`` image, or a mode ``I`` one outside 0..65535 (:func:`load_image` names the
            file).
        TypeError: not a PIL image (a path: open it with ``PIL.Image.open``).
    """
    problem = _eight_bit_problem(require_pil_image(image))  # a path or tensor: a TypeError saying so
    if problem:
        raise _NoEightBitReading(problem)
    if image.mode in _SIXTEEN_BIT or image.mode == "I":
        high_byte = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)  # (H, W)
        return Image.fromarray(high_byte, mode="L").convert("RGB")
    return image.convert("RGB")


def load_image(path: PathLike, *, exif_orientation: bool = False) -> Image.Image:
    """Decode an image file completely, as 8-bit RGB (:func:`rgb_image`).

    A truncated or otherwise damaged file is an error, never an image decoded as far as it goes (see the
    module docstring). ``exif_orientation``: turn the image upright as its EXIF orientation tag says (a
    phone photo stored sideways), as a browser shows it; off, the pixels are read as stored, as the official
    loaders of the benchmark datasets read them (``data.exif_orientation``).

    Raises:
        MissingFileError: the file does not exist.
        DataError: a directory, or a file that is not an image, is truncated or damaged, is over Pillow's
            hard pixel limit (a decompression bomb), or has no 8-bit reading (floating-point pixels); names
            the file and the reason.
    """
    from patchword.errors import DataError, MissingFileError

    path = Path(path)
    if path.is_dir():
        raise DataError(f"cannot read image {path}: {_DIRECTORY}")
    if not path.is_file():
        raise MissingFileError(f"image file not found: {path}")
    try:
        # rgb_image forces the decode, which Pillow otherwise defers.
        with _strict_decoding(), Image.open(path) as image:
            _log_if_large(path, image)
            if exif_orientation:
                image = ImageOps.exif_transpose(image)
            return rgb_image(image)
    except _NoEightBitReading as err:  # a ValueError, but no damage
        raise DataError(f"cannot read image {path}: {err}") from err
    except _DECODE_ERRORS as err:
        raise DataError(f"cannot read image {path}: {_decode_failure(err)}") from err
    except Image.DecompressionBombError as err:
        # Not an OSError: without this clause a huge image escapes as a traceback (densify's
        # --skip-bad-images, a training worker) instead of an unreadable file like the others.
        raise DataError(f"cannot read image {path}: {_BOMB} ({err})") from err


def load_transformed(
    path: PathLike, transform: Callable[[Image.Image], torch.Tensor], *, exif_orientation: bool = False
) -> torch.Tensor:
    """``transform(load_image(path, exif_orientation=...))``: a (3, H, W) tensor for the standard
    transforms. Pillow's warning for an image over its pixel limit stays quiet in the transform too (a crop
    of such an image warns again, naming no file): :func:`load_image` has logged the file."""
    with _strict_decoding():
        return transform(load_image(path, exif_orientation=exif_orientation))


def image_problem(path: PathLike) -> str | None:
    """Why ``path`` is not a usable image after decoding it completely; None when it is fine.

    Reasons: ``missing``, ``a directory, not a file``, ``empty file``, ``not a readable image (...)``,
    ``zero-sized image``, ``truncated file ...``, ``damaged file ...``, and an image with no 8-bit reading
    (floating-point pixels: :func:`rgb_image`), which :func:`load_image` would refuse.
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
            _log_if_large(path, image)
            image.load()
            eight_bit = _eight_bit_problem(image)
            if eight_bit:
                return eight_bit
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
        return load_transformed(self.paths[index], self.transform), index
