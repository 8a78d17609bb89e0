"""Reading image files for on-disk retrieval splits.

Images are decoded lazily, one per ``__getitem__``, so a DataLoader's workers share the decoding cost.
Like the official LAPS / SEPS loader, truncated JPEGs (common in the Flickr30K and COCO downloads) are
decoded as far as they go instead of aborting a multi-hour run; unlike it, the Pillow flag that allows this
is set only around our own decode, so importing patchword does not change Pillow's behaviour elsewhere.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile, UnidentifiedImageError
from torch.utils.data import Dataset

from patchword.data.split import RetrievalSplit

__all__ = ["load_image", "check_image_files", "find_bad_images", "ImageFolderSplit"]

PathLike = str | os.PathLike[str]

_logger = logging.getLogger(__name__)


_TRUNCATED_LOCK = threading.Lock()


@contextmanager
def _truncated_images_allowed() -> Iterator[None]:
    """Let Pillow decode truncated files inside the block, restoring the previous setting afterwards.

    The flag is a Pillow module global: threads that decode at once (index building) take turns here so
    that none restores it while another still needs it, and it is never left on for the process. Only
    damaged files come here, after a normal decode failed.
    """
    with _TRUNCATED_LOCK:
        previous = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = True
        try:
            yield
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = previous


# Pillow reports corrupt data through all of these depending on the codec.
_DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError)


def load_image(path: PathLike) -> Image.Image:
    """Decode an image file as RGB.

    A truncated file is decoded as far as it goes (the official loader's behaviour, so one damaged file
    does not end a multi-hour run) and a warning names it.

    Raises:
        MissingFileError: the file does not exist.
        DataError: the file is not a readable image, even truncated (names the file).
    """
    from patchword.errors import DataError, MissingFileError

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"image file not found: {path}")
    try:
        # convert() forces the decode, which Pillow otherwise defers.
        with Image.open(path) as image:
            return image.convert("RGB")
    except _DECODE_ERRORS as err:
        first = err
    try:
        with _truncated_images_allowed(), Image.open(path) as image:
            decoded = image.convert("RGB")
    except _DECODE_ERRORS as err:
        raise DataError(f"cannot read image {path}: {err}") from err
    _logger.warning("%s is damaged (%s); decoded as far as it goes", path, first)
    return decoded


def _header_problem(path: str) -> str | None:
    """Why ``path`` is not a usable image file, from its header alone (no decode); None when it looks fine."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return "missing"
    if size == 0:
        return "empty file"
    try:
        with Image.open(path) as image:
            width, height = image.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        return f"not a readable image ({err})"
    if width == 0 or height == 0:
        return "zero-sized image"
    return None


def find_bad_images(
    paths: Sequence[PathLike], what: str = "split", progress: bool | None = None
) -> list[tuple[str, str]]:
    """``(path, problem)`` of every file whose header says it is missing, empty or not an image (fast:
    nothing is decoded)."""
    from patchword.progress import progress_bar

    bad: list[tuple[str, str]] = []
    with progress_bar(len(paths), f"check {what} images", progress, unit="image") as bar:
        for path in paths:
            problem = _header_problem(os.fspath(path))
            if problem:
                bad.append((os.fspath(path), problem))
            bar.update(1)
    return bad


def check_image_files(paths: Sequence[PathLike], what: str = "split", progress: bool | None = None) -> None:
    """Open the header of every image file and fail listing the bad ones.

    Catches missing, empty and non-image files before a run starts; a file that is truncated after a valid
    header is decoded as far as it goes at training time, as the official loader does.

    Raises:
        DataError: naming how many files are bad and the first few with the reason.
    """
    from patchword.errors import DataError

    bad = find_bad_images(paths, what, progress)
    if bad:
        shown = "; ".join(f"{p}: {why}" for p, why in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise DataError(f"{len(bad)} of {len(paths)} image files of the {what} are unusable: {shown}{more}")


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
