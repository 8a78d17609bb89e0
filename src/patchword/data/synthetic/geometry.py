"""Where each object lies in its image: pixel labels and the ViT patches each object covers.

The generator knows every scene, so it also knows exactly which pixels, and hence which patches of a
``grid x grid`` ViT, each object covers. That is the ground truth of patch selection: a selection that
"finds the objects" keeps the patches of :func:`object_patch_masks` (see ``patchword.eval.selection``).

Placement follows :func:`~patchword.data.synthetic.scenes.render_scenes` exactly: every object is centred
in its grid cell, shifted by a random offset (the first draws of the render stream), and drawn with the
same shape masks. :func:`split_layout` re-derives the offsets of a generated split from its seed, so the
masks of a cached split need nothing but the split's scene table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from patchword.data.synthetic.config import GRID, NUM_CELLS, SIZES, SPLITS, SyntheticConfig
from patchword.data.synthetic.records import SceneTable
from patchword.data.synthetic.scenes import _RADIUS, _shape_masks

__all__ = [
    "ObjectLayout",
    "object_layout",
    "split_layout",
    "object_label_map",
    "object_patch_masks",
    "split_object_patches",
]


@dataclass(eq=False)
class ObjectLayout:
    """Where the M objects of a scene table are drawn (image-major, cells in increasing order).

    Attributes:
        image: (M,) int64 image of each object.
        cell: (M,) int64 grid cell (``row * 3 + col``).
        radius: (M,) float64 radius in pixels.
        offset: (M, 2) float64 (dy, dx) shift of the centre from the cell centre, in pixels.
    """

    image: np.ndarray
    cell: np.ndarray
    radius: np.ndarray
    offset: np.ndarray


def _cell_geometry(config: SyntheticConfig) -> tuple[int, int]:
    """(cell side, margin) in pixels, as the renderer lays out the 3x3 grid."""
    cell = config.image_size // GRID
    return cell, (config.image_size - GRID * cell) // 2


def object_layout(scenes: SceneTable, config: SyntheticConfig, rng: np.random.Generator) -> ObjectLayout:
    """Place every object as :func:`render_scenes` does with the same ``rng`` (its first draws)."""
    cell, _ = _cell_geometry(config)
    image, cells = np.nonzero(scenes.shape >= 0)
    radius = (np.array([_RADIUS[s] for s in SIZES]) * cell)[scenes.size[image, cells]]
    # The jitter budget shrinks for large objects so that they stay inside their cell.
    room = np.minimum(config.jitter * cell, np.maximum(cell / 2 - radius - 0.5, 0.0))
    offset = rng.uniform(-1.0, 1.0, size=(len(image), 2)) * room[:, None]
    return ObjectLayout(image.astype(np.int64), cells.astype(np.int64), radius, offset)


def split_layout(config: SyntheticConfig, name: str, scenes: SceneTable) -> ObjectLayout:
    """The layout :func:`~patchword.data.synthetic.generate_split` rendered split ``name`` with.

    The split's render stream is the second of the three streams spawned from ``(seed, split index)``.
    """
    seq = np.random.SeedSequence([config.seed, SPLITS.index(name)])
    render_rng = np.random.default_rng(seq.spawn(3)[1])
    return object_layout(scenes, config, render_rng)


def object_label_map(scenes: SceneTable, config: SyntheticConfig, layout: ObjectLayout) -> np.ndarray:
    """Which object covers each pixel: (N, H, W) int8, the object's cell, or -1 for background.

    Objects never overlap (each stays inside its own cell), so one label per pixel is exact.
    """
    cell, margin = _cell_geometry(config)
    size = config.image_size
    labels = np.full((len(scenes), size, size), -1, np.int8)
    pix = np.arange(cell) + 0.5
    dy = pix[None, :, None] - (cell / 2 + layout.offset[:, 0, None, None])
    dx = pix[None, None, :] - (cell / 2 + layout.offset[:, 1, None, None])
    dy, dx = np.broadcast_arrays(dy, dx)
    names = np.asarray(config.shapes)[scenes.shape[layout.image, layout.cell]]
    obj, py, px = np.nonzero(_shape_masks(names, dy, dx, layout.radius[:, None, None]))
    row, col = np.divmod(layout.cell[obj], GRID)
    labels[layout.image[obj], margin + row * cell + py, margin + col * cell + px] = layout.cell[obj]
    return labels


def object_patch_masks(labels: np.ndarray, grid: int) -> np.ndarray:
    """The patches of a ``grid x grid`` patch grid that each object covers.

    A pixel belongs to the patch its centre falls in; a patch covers an object if any of its pixels does.
    When the image side is a multiple of ``grid`` (a ViT on the generator's resolution) the patches
    partition the pixels exactly; otherwise (an image resized to the encoder's input) this is the
    nearest pixel-centre assignment.

    Args:
        labels: (N, H, W) int8 from :func:`object_label_map`.
        grid: patches per side (``image_size // patch_size`` of the image encoder).
    Returns:
        (N, 9, grid * grid) bool, patches covered by the object in each cell, patch index ``row * grid +
        col`` (the ViT token order); all False for empty cells. ``.any(1)`` is the union over objects.
    """
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    n, height, width = labels.shape
    patch_row = ((np.arange(height) + 0.5) * grid / height).astype(np.int64)
    patch_col = ((np.arange(width) + 0.5) * grid / width).astype(np.int64)
    patch_of_pixel = patch_row[:, None] * grid + patch_col[None, :]  # (H, W)
    img, y, x = np.nonzero(labels >= 0)
    masks = np.zeros((n, NUM_CELLS, grid * grid), bool)
    masks[img, labels[img, y, x], patch_of_pixel[y, x]] = True
    return masks


def split_object_patches(scenes: SceneTable, config: SyntheticConfig, name: str, grid: int) -> np.ndarray:
    """(N, 9, grid * grid) bool patch masks of the objects of generated split ``name`` (see
    :func:`object_patch_masks`); ``scenes`` is that split's scene table."""
    layout = split_layout(config, name, scenes)
    return object_patch_masks(object_label_map(scenes, config, layout), grid)
