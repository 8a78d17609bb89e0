"""Scene sampling and rendering."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from patchword.data.synthetic.config import COLOURS, GRID, NUM_CELLS, SIZES, SyntheticConfig
from patchword.data.synthetic.records import SceneTable

# Object radius as a fraction of the cell side; the two sizes differ by almost 2x so they never blur.
_RADIUS = {"small": 0.22, "large": 0.40}


def _sample_scenes(config: SyntheticConfig, n: int, rng: np.random.Generator) -> SceneTable:
    """Draw n random scenes: a uniform object count, distinct random cells, uniform attributes."""
    counts = rng.integers(config.min_objects, config.max_objects + 1, size=n)
    # Ranking random keys gives each image a uniform random cell order; its first `count` cells are used.
    cell_rank = np.argsort(np.argsort(rng.random((n, NUM_CELLS)), axis=1), axis=1)
    occupied = cell_rank < counts[:, None]

    def attribute(n_values: int) -> np.ndarray:
        values = rng.integers(0, n_values, size=(n, NUM_CELLS)).astype(np.int8)
        return np.where(occupied, values, np.int8(-1))

    shape, colour = attribute(len(config.shapes)), attribute(len(config.colours))
    if config.attribute_repeat_prob > 0:
        _repeat_attributes(shape, colour, occupied, config.attribute_repeat_prob, rng)
    return SceneTable(shape=shape, colour=colour, size=attribute(len(SIZES)))


def _repeat_attributes(
    shape: np.ndarray, colour: np.ndarray, occupied: np.ndarray, prob: float, rng: np.random.Generator
) -> None:
    """With probability ``prob``, each object but a scene's first (in cell order) takes the colour or the
    shape (even odds) of a random earlier object of its scene. In place; arrays (N, 9)."""
    n = occupied.shape[0]
    repeat = rng.random((n, NUM_CELLS)) < prob
    take_colour = rng.random((n, NUM_CELLS)) < 0.5
    pick = rng.random((n, NUM_CELLS))
    for image in range(n):
        cells = np.nonzero(occupied[image])[0]
        for k, cell in enumerate(cells[1:], start=1):
            if repeat[image, cell]:
                source = cells[int(pick[image, cell] * k)]
                target = colour if take_colour[image, cell] else shape
                target[image, cell] = target[image, source]


def _shape_masks(names: Sequence[str], dy: np.ndarray, dx: np.ndarray, radius: np.ndarray) -> np.ndarray:
    """Pixel masks of shapes centred at the origin.

    Args:
        names: (M,) shape names.
        dy, dx: (M, P, P) pixel offsets from each object's centre.
        radius: (M, 1, 1) object radius in pixels.
    Returns:
        (M, P, P) bool.
    """
    ay, ax, r = np.abs(dy), np.abs(dx), radius
    names = np.asarray(names)
    # Triangle: apex at the top (-r), base at +0.75r with half-width r.
    tri = (dy >= -r) & (dy <= 0.75 * r) & (ax <= (dy + r) / 1.75)
    arm = r / 3
    masks = {
        "circle": ay**2 + ax**2 <= r**2,
        "square": (ay <= 0.82 * r) & (ax <= 0.82 * r),
        "triangle": tri,
        "diamond": ay + ax <= r,
        "cross": ((ax <= arm) & (ay <= r)) | ((ay <= arm) & (ax <= r)),
    }
    out = np.zeros(dy.shape, bool)
    for name, mask in masks.items():
        pick = names == name
        out[pick] = mask[pick]
    return out


def render_scenes(
    scenes: SceneTable, config: SyntheticConfig, rng: np.random.Generator, chunk: int = 4096
) -> np.ndarray:
    """Render scenes into images.

    Every object is drawn inside its own grid cell (jitter never pushes it out), so objects never
    overlap and one fancy-indexed assignment paints all of them at once.

    Args:
        scenes: N scenes.
        config: palette, image size, background, jitter and noise.
        rng: randomness for jitter and pixel noise.
        chunk: objects drawn, and images noised, per step (bounds temporary memory).
    Returns:
        (N, H, W, 3) uint8 images, H = W = config.image_size.
    """
    size = config.image_size
    cell = size // GRID
    margin = (size - GRID * cell) // 2
    palette = np.array([COLOURS[c] for c in config.colours], np.uint8)
    radius_of_size = np.array([_RADIUS[s] for s in SIZES]) * cell
    n = len(scenes)
    images = np.empty((n, size, size, 3), np.uint8)
    images[:] = np.array(config.background, np.uint8)
    img, cells = np.nonzero(scenes.shape >= 0)  # every object, image-major
    radius = radius_of_size[scenes.size[img, cells]]
    # The jitter budget shrinks for large objects so that they stay inside their cell.
    room = np.minimum(config.jitter * cell, np.maximum(cell / 2 - radius - 0.5, 0.0))
    offset = rng.uniform(-1.0, 1.0, size=(len(img), 2)) * room[:, None]
    pix = np.arange(cell) + 0.5
    for start in range(0, len(img), chunk):
        sl = slice(start, start + chunk)
        dy = pix[None, :, None] - (cell / 2 + offset[sl, 0, None, None])
        dx = pix[None, None, :] - (cell / 2 + offset[sl, 1, None, None])
        dy, dx = np.broadcast_arrays(dy, dx)
        shape_names = np.asarray(config.shapes)[scenes.shape[img[sl], cells[sl]]]
        obj, py, px = np.nonzero(_shape_masks(shape_names, dy, dx, radius[sl, None, None]))
        row, col = np.divmod(cells[sl][obj], GRID)
        colour = palette[scenes.colour[img[sl], cells[sl]]][obj]
        images[img[sl][obj], margin + row * cell + py, margin + col * cell + px] = colour
    if config.pixel_noise > 0:
        for start in range(0, n, chunk):
            block = images[start : start + chunk]
            noise = rng.standard_normal(block.shape, dtype=np.float32) * config.pixel_noise
            block[:] = np.clip(block + noise, 0, 255).round().astype(np.uint8)
    return images
