"""Dense caption files without the lines of unusable images, read under ``data.skip_bad_images``.

``patchword densify --skip-bad-images`` leaves out the images it cannot read, and ``data.skip_bad_images``
leaves the same images out of a split; the file then has fewer lines than the split has images. When every
line records its image (``metadata.image_id`` or ``metadata.file``, as densify writes), the lines are placed
at their images, in the split's order; an image without a line gets :data:`NO_DENSE_LINE`, and once the
unusable images are gone none may be left (:func:`refuse_images_without_dense`). A file whose lines record
no image (the SEPS release) is paired with the images by order, so it must still hold one line per image.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection

import numpy as np

from patchword.data.split import RetrievalSplit, TextOrigin
from patchword.data.textfiles import DenseLine, check_dense_lines, names_image, read_dense_lines
from patchword.errors import DataError

__all__ = ["NO_DENSE_LINE", "attach_dense", "images_without_dense", "refuse_images_without_dense"]

#: The dense caption of an image that has no line in its file: never a real one (the reader refuses an
#: empty text), and never tokenised (the image leaves the split first, or the split is refused).
NO_DENSE_LINE = ""


def _placed(lines: list[DenseLine], images: list[str], image_ids: list[str]) -> list[DenseLine | None] | None:
    """``lines`` at their images (None where an image has none) when every line records its image and
    they follow the split's order; None when they cannot be placed so."""
    if any(line.image_id is None and line.file is None for line in lines):
        return None
    placed: list[DenseLine | None] = []
    pending = iter(lines)
    line = next(pending, None)
    for image_id, image in zip(image_ids, images, strict=True):
        if line is not None and names_image(line, image_id, image):
            placed.append(line)
            line = next(pending, None)
        else:
            placed.append(None)
    return placed if line is None else None  # a line left over: out of order, or not of this split


def attach_dense(
    split: RetrievalSplit, dense_jsonl: str | os.PathLike[str], *, missing_ok: bool = False
) -> RetrievalSplit:
    """``split`` with the dense captions of ``dense_jsonl``, as the readers attach them (one line per image,
    in image order); with ``missing_ok``, also a file of fewer lines whose every line records its image
    (the images without one get :data:`NO_DENSE_LINE`, line 0 in ``dense_origin``).

    Raises:
        ValueError / DataError: as the readers' check (``textfiles.check_dense_lines``) when the lines cannot
            be placed: a count that is not the image count, a line naming another image than its place's.
    """
    images, ids = [str(image) for image in split.images], list(split.image_ids)
    lines = read_dense_lines(dense_jsonl)
    placed = _placed(lines, images, ids) if missing_ok and len(lines) < len(images) else None
    if placed is None:
        placed = list(check_dense_lines(dense_jsonl, lines, images, ids, split.num_captions, missing_ok))
    return dataclasses.replace(
        split,
        dense_captions=[NO_DENSE_LINE if line is None else line.text for line in placed],
        dense_origin=TextOrigin(
            str(dense_jsonl), np.asarray([0 if line is None else line.lineno for line in placed], np.int64)
        ),
    )


def images_without_dense(split: RetrievalSplit) -> list[int]:
    """Indices of the images of ``split`` that have no line in its dense file (:func:`attach_dense`)."""
    return [k for k, text in enumerate(split.dense_captions or []) if text == NO_DENSE_LINE]


def refuse_images_without_dense(split: RetrievalSplit, what: str, unusable: Collection[str] = ()) -> None:
    """Raise unless every image of ``split`` without a dense line is one of the ``unusable`` files (those
    ``data.skip_bad_images`` leaves out; none once they are gone).

    Raises:
        DataError: naming the dense file, the count and the first few images.
    """
    lacking = [k for k in images_without_dense(split) if os.fspath(split.images[k]) not in unusable]
    if not lacking:
        return
    shown = ", ".join(f"{split.image_ids[k]!r} ({split.images[k]})" for k in lacking[:5])
    assert split.dense_origin is not None  # attach_dense gave the split its lines
    raise DataError(
        f"{split.dense_origin.file}: no line for {len(lacking)} image(s) of the {what} that decode, e.g. "
        f"{shown}; data.skip_bad_images leaves out only the unusable images: rerun `patchword densify` on "
        "the file to describe them (it fills in the images it lacks)"
    )
