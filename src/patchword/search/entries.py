"""The image entries of a search index by id, and the check of every id a reader is given: what the local
reader (:class:`~patchword.search.store.SearchIndex`) and the Qdrant one
(:class:`~patchword.search.qdrant.QdrantIndex`) share.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from patchword.errors import PatchwordError
from patchword.search.manifest import Manifest

__all__ = ["ImageIdError", "IndexEntries"]


class ImageIdError(PatchwordError, ValueError):
    """An image id that is not an integer, or not in ``0 .. len(index) - 1``."""


class IndexEntries:
    """The image entries of an index's manifest, by index id: what every index backend shares."""

    index_dir: Path
    manifest: Manifest

    def __len__(self) -> int:
        return len(self.manifest.entries)

    @property
    def images_root(self) -> Path:
        return Path(self.manifest.images_root)

    def path(self, image_id: int) -> str:
        """Relative path (POSIX) of image ``image_id``."""
        return self.manifest.entries[self.check_id(image_id)].path

    def check_ids(self, ids: Any) -> np.ndarray:
        """Index ids (integer tensor, array, sequence, scalar) -> (k,) int64, checked in one vectorised pass:
        numpy would read ``-1`` as the last image and ``1.7`` as image 1. Raises :class:`ImageIdError`."""
        arr = np.asarray(ids.detach().cpu() if isinstance(ids, torch.Tensor) else ids).reshape(-1)
        if arr.dtype.kind not in "iu" and arr.size:  # ``[]`` is float to numpy: no id, nothing wrong
            raise ImageIdError(f"{self.index_dir}: image ids are integers, got {arr.dtype} ids")
        if arr.size and (arr.min() < 0 or arr.max() >= len(self)):
            raise self._no_image(arr[(arr < 0) | (arr >= len(self))][0])
        return arr.astype(np.int64, copy=False)

    def check_id(self, image_id: Any) -> int:
        """One index id (``int``, ``np.int64``, a 0-d integer tensor...) -> ``int``; see :meth:`check_ids`."""
        try:  # operator.index: what Python takes as an integer (not 1.0, not a tensor of two)
            value = None if isinstance(image_id, (bool, np.bool_)) else operator.index(image_id)
        except TypeError:
            value = None
        if value is None:
            raise ImageIdError(f"{self.index_dir}: an image id is an integer, got {image_id!r}")
        if not 0 <= value < len(self):  # plain Python, no array: a search names the path of every hit
            raise self._no_image(value)
        return value

    def _no_image(self, image_id: int) -> ImageIdError:
        return ImageIdError(
            f"{self.index_dir}: no image with id {image_id} (the index holds {len(self)} images)"
        )
