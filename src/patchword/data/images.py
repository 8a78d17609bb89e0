"""Reading image files for on-disk retrieval splits.

Images are decoded lazily, one per ``__getitem__``, so a DataLoader's workers share the decoding cost.
Like the official LAPS / SEPS loader, truncated JPEGs (common in the Flickr30K and COCO downloads) are
decoded as far as they go instead of aborting a multi-hour run; unlike it, the Pillow flag that allows this
is set only around our own decode, so importing patchword does not change Pillow's behaviour elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFile, UnidentifiedImageError
from torch.utils.data import Dataset

from patchword.data.split import RetrievalSplit

__all__ = ["load_image", "ImageFolderSplit"]

PathLike = str | os.PathLike[str]


@contextmanager
def _truncated_images_allowed() -> Iterator[None]:
    """Let Pillow decode truncated files inside the block, restoring the previous setting afterwards.

    The flag is a Pillow module global; DataLoader workers are separate processes, so this only races if
    several threads decode at once, in which case the worst case is the official (global) behaviour.
    """
    previous = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous


def load_image(path: PathLike) -> Image.Image:
    """Decode an image file as RGB.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a readable image (names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        # convert() forces the decode, which Pillow otherwise defers past the scope of the flag.
        with _truncated_images_allowed(), Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        # Pillow reports corrupt data through all of these depending on the codec.
        raise ValueError(f"cannot read image {path}: {err}") from err


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
