"""Synthetic scenes: the embedded default dataset (no download, CPU-fast, exact ground truth).

Each image is a 3x3 grid holding 1-4 non-overlapping objects (shape, colour, size) on a plain light grey
background. Every image gets five short *sparse* captions and one exhaustive, deliberately noisy *dense*
(MLLM-style) description. The generator keeps a structured record of every scene and every caption, so it
knows exactly which images each caption fits. That relation powers two things real data cannot offer:
false-negative masking inside a training batch (:class:`FitsOracle`) and the oracle recall bound of a split
(:func:`oracle_metrics`), which tells how much of the benchmark is caption ambiguity rather than model error.

Structured records use small integer codes: a shape/colour/size is an index into ``config.shapes`` /
``config.colours`` / :data:`SIZES`, a cell is ``row * 3 + col`` (0 = top left, 8 = bottom right), and
``-1`` means "empty cell" in scenes and "not asserted" (wildcard) in captions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from patchword.data.split import RetrievalSplit

__all__ = [
    "SyntheticConfig",
    "SyntheticScenes",
    "SceneSplit",
    "SceneTable",
    "CaptionTable",
    "DenseTable",
    "ObjectRef",
    "CaptionSpec",
    "FitsOracle",
    "evaluate_fits",
    "generate_split",
    "oracle_metrics",
    "render_scenes",
    "default_cache_dir",
    "SHAPES",
    "COLOURS",
    "SIZES",
    "RELATIONS",
    "CELL_NAMES",
    "CELL_PHRASES",
    "SPLITS",
]

logger = logging.getLogger(__name__)

# Bump when generation changes in any way that alters the output, so stale caches are never reused.
GENERATOR_VERSION = 1

GRID = 3
NUM_CELLS = GRID * GRID
SPLITS = ("train", "dev", "test")
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 30),
    "orange": (245, 140, 30),
    "purple": (140, 50, 180),
    "cyan": (30, 200, 210),
    "black": (25, 25, 25),
}
SIZES = ("small", "large")
# Relation r holds between objects a and b iff coord(a) < coord(b) on axis _REL_AXIS[r], with a and b
# swapped where _REL_SWAP[r]: "a right of b" is "b left of a".
RELATIONS = ("left of", "right of", "above", "below")
_REL_AXIS = np.array([1, 1, 0, 0])  # 0 = row, 1 = column
_REL_SWAP = np.array([False, True, False, True])
CELL_NAMES = (
    "top left",
    "top middle",
    "top right",
    "middle left",
    "centre",
    "middle right",
    "bottom left",
    "bottom middle",
    "bottom right",
)
# Sparse captions name cells tersely to stay short; dense captions use CELL_NAMES.
CELL_PHRASES = (
    "in the top left",
    "at the top",
    "in the top right",
    "on the left",
    "in the centre",
    "on the right",
    "in the bottom left",
    "at the bottom",
    "in the bottom right",
)
_CELL_RC = np.stack(np.divmod(np.arange(NUM_CELLS), GRID))  # (2, 9): row and column of each cell
_CORNERS = frozenset({0, 2, 6, 8})
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
# Object radius as a fraction of the cell side; the two sizes differ by almost 2x so they never blur.
_RADIUS = {"small": 0.22, "large": 0.40}
# Largest sparse caption: three objects (the relation and count templates use two).
MAX_CAPTION_OBJECTS = 3


@dataclass(frozen=True)
class SyntheticConfig:
    """Everything that determines the generated dataset; equal configs give identical data."""

    seed: int = 0  # master seed; each split derives its own stream from it
    image_size: int = 64  # side of the square RGB images in pixels
    min_objects: int = 1  # fewest objects per image (one per grid cell, so at most 9)
    max_objects: int = 4  # most objects per image
    shapes: tuple[str, ...] = SHAPES  # shape vocabulary, a subset of SHAPES
    colours: tuple[str, ...] = tuple(COLOURS)  # colour vocabulary, a subset of COLOURS
    background: tuple[int, int, int] = (210, 210, 210)  # background RGB (dense text calls it light grey)
    pixel_noise: float = 3.0  # std of mild Gaussian pixel noise (0 = perfectly flat colours)
    jitter: float = 0.12  # max object offset from its cell centre, as a fraction of the cell side
    num_train: int = 10_000  # train images (Flickr30K-shaped, just smaller)
    num_dev: int = 1_000  # dev images
    num_test: int = 1_000  # test images
    captions_per_image: int = 5  # sparse captions per image
    partial_attr_prob: float = 0.1  # chance a sparse caption leaves out one attribute of an object
    dense_omit_prob: float = 0.15  # chance the dense caption misses an object (as MLLMs do)
    dense_wrong_attr_prob: float = 0.1  # chance the dense caption gets one attribute of an object wrong

    def __post_init__(self) -> None:
        if not 1 <= self.min_objects <= self.max_objects <= NUM_CELLS:
            raise ValueError(
                f"need 1 <= min_objects <= max_objects <= {NUM_CELLS}, "
                f"got {self.min_objects}..{self.max_objects}"
            )
        unknown = [s for s in self.shapes if s not in SHAPES] + [c for c in self.colours if c not in COLOURS]
        if unknown or len(self.shapes) < 2 or len(self.colours) < 2:
            raise ValueError(f"need >= 2 shapes from {SHAPES} and >= 2 colours from {tuple(COLOURS)}")
        if self.image_size < 4 * GRID:
            raise ValueError(f"image_size must be >= {4 * GRID}, got {self.image_size}")
        if not 1 <= self.captions_per_image <= 5:
            raise ValueError(f"captions_per_image must be in 1..5, got {self.captions_per_image}")
        for name in ("partial_attr_prob", "dense_omit_prob", "dense_wrong_attr_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability, got {getattr(self, name)}")
        if min(self.num_train, self.num_dev, self.num_test) < 1:
            raise ValueError("every split needs at least one image")

    def split_size(self, split: str) -> int:
        """Number of images of ``split``."""
        return {"train": self.num_train, "dev": self.num_dev, "test": self.num_test}[split]

    def cache_key(self) -> str:
        """Short stable hash of the config and generator version, naming its cache directory."""
        payload = json.dumps({"version": GENERATOR_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------------------
# Structured records (struct-of-arrays, so fits can be evaluated with broadcasting)
# ---------------------------------------------------------------------------------------------------------


class _ArrayRecord:
    """Mixin for dataclasses whose fields are equally long arrays: row selection and npz round trips."""

    def take(self, index: np.ndarray | Sequence[int]):
        """Rows ``index`` of every field, as a record of the same type."""
        index = np.asarray(index)
        return type(self)(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_arrays(cls, arrays, prefix: str):
        return cls(**{f.name: np.asarray(arrays[f"{prefix}{f.name}"]) for f in dataclasses.fields(cls)})

    def __len__(self) -> int:
        return len(getattr(self, dataclasses.fields(self)[0].name))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self)
        )


@dataclass(eq=False)
class SceneTable(_ArrayRecord):
    """The content of N images: what sits in each of the 9 grid cells.

    Attributes:
        shape, colour, size: (N, 9) int8 attribute codes per cell, -1 where the cell is empty.
    """

    shape: np.ndarray
    colour: np.ndarray
    size: np.ndarray

    @property
    def count(self) -> np.ndarray:
        """(N,) number of objects per image."""
        return (self.shape >= 0).sum(-1)

    def objects(self, i: int) -> list[tuple[int, int, int, int]]:
        """Objects of image ``i`` as ``(cell, shape, colour, size)`` tuples, in cell order."""
        cells = np.flatnonzero(self.shape[i] >= 0)
        return [(int(c), int(self.shape[i, c]), int(self.colour[i, c]), int(self.size[i, c])) for c in cells]


@dataclass(frozen=True)
class ObjectRef:
    """One object a caption asserts exists; ``None`` fields are not asserted (match anything)."""

    shape: int | None = None
    colour: int | None = None
    size: int | None = None
    cell: int | None = None


@dataclass(frozen=True)
class CaptionSpec:
    """Everything one sparse caption asserts about its image.

    Attributes:
        objects: distinct objects that must all be present (1..MAX_CAPTION_OBJECTS).
        relation: index into :data:`RELATIONS` holding between ``objects[0]`` and ``objects[1]``, or None.
        count: the exact number of objects in the image, or None.
    """

    objects: tuple[ObjectRef, ...]
    relation: int | None = None
    count: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.objects) <= MAX_CAPTION_OBJECTS:
            raise ValueError(f"a caption asserts 1..{MAX_CAPTION_OBJECTS} objects, got {len(self.objects)}")
        # A relation fixes two distinct objects; with a third one the distinctness check would have to
        # be solved jointly with the relation, which the vectorised fits kernel does not do.
        if self.relation is not None and len(self.objects) != 2:
            raise ValueError("a relation needs exactly two objects")


@dataclass(eq=False)
class CaptionTable(_ArrayRecord):
    """Structured content of T sparse captions (see :class:`CaptionSpec`).

    Attributes:
        shape, colour, size, cell: (T, 3) int8 per asserted object, -1 = not asserted.
        used: (T, 3) bool, which object slots the caption fills.
        relation: (T,) int8 index into :data:`RELATIONS` between slots 0 and 1, -1 = none.
        count: (T,) int8 exact object count asserted, -1 = none.
    """

    shape: np.ndarray
    colour: np.ndarray
    size: np.ndarray
    cell: np.ndarray
    used: np.ndarray
    relation: np.ndarray
    count: np.ndarray

    @classmethod
    def from_specs(cls, specs: Sequence[CaptionSpec]) -> CaptionTable:
        """Pack caption specs into arrays."""
        t = len(specs)
        slots = {
            k: np.full((t, MAX_CAPTION_OBJECTS), -1, np.int8) for k in ("shape", "colour", "size", "cell")
        }
        used = np.zeros((t, MAX_CAPTION_OBJECTS), bool)
        for i, spec in enumerate(specs):
            for j, obj in enumerate(spec.objects):
                used[i, j] = True
                for k, arr in slots.items():
                    value = getattr(obj, k)
                    arr[i, j] = -1 if value is None else value

        def or_minus_one(values: list[int | None]) -> np.ndarray:
            return np.array([-1 if v is None else v for v in values], np.int8).reshape(t)

        return cls(
            **slots,
            used=used,
            relation=or_minus_one([s.relation for s in specs]),
            count=or_minus_one([s.count for s in specs]),
        )


@dataclass(eq=False)
class DenseTable(_ArrayRecord):
    """What each dense caption says, noise included.

    Attributes:
        mentioned: (N, 9) bool, object cells the description mentions (False for omitted objects).
        shape, colour, size: (N, 9) int8 attributes as *described* (may be wrong), -1 if not mentioned.
        wrong: (N, 9) int8 which attribute was corrupted (0 shape, 1 colour, 2 size), -1 if none.
    """

    mentioned: np.ndarray
    shape: np.ndarray
    colour: np.ndarray
    size: np.ndarray
    wrong: np.ndarray


# ---------------------------------------------------------------------------------------------------------
# The fits relation
# ---------------------------------------------------------------------------------------------------------


# Every object (and caption slot) is packed into one uint32: one-hot groups for shape, colour, size and
# cell. An object fits a slot iff it has no bit the slot forbids, so matching is one AND per pair; the
# cells a slot can take then form a 9-bit set, and distinctness, relations and counts become table
# look-ups on those sets instead of loops over cell pairs.
_GROUPS = {
    "shape": (0, len(SHAPES)),
    "colour": (8, len(COLOURS)),
    "size": (16, len(SIZES)),
    "cell": (20, NUM_CELLS),
}
_EMPTY_BIT = np.uint32(1 << 31)  # set only on empty cells and never allowed, so they match nothing
_ALL_SETS = np.arange(1 << NUM_CELLS)
_POPCOUNT = np.array([bin(m).count("1") for m in _ALL_SETS], np.int8)  # (512,)


def _extreme_coord(reduce: Callable, empty: int) -> np.ndarray:
    """(2, 512) table: min or max row (axis 0) / column (axis 1) over each cell set; ``empty`` if none."""
    members = (_ALL_SETS[:, None] >> np.arange(NUM_CELLS)) & 1  # (512, 9)
    return np.stack([reduce(np.where(members, rc, empty), axis=1) for rc in _CELL_RC]).astype(np.int8)


_MIN_COORD = _extreme_coord(np.min, GRID)
_MAX_COORD = _extreme_coord(np.max, -1)


def _one_hot(values: np.ndarray, group: str) -> np.ndarray:
    """uint32 bit of each value in its group; -1 (wildcard) gives the whole group."""
    offset, width = _GROUPS[group]
    bits = np.left_shift(np.uint32(1), (offset + np.maximum(values, 0)).astype(np.uint32))
    return np.where(values < 0, np.uint32(((1 << width) - 1) << offset), bits).astype(np.uint32)


def _scene_codes(scenes: SceneTable) -> np.ndarray:
    """(*Q, 9) uint32 code of the object in each cell (the empty bit for empty cells)."""
    cells = np.broadcast_to(np.arange(NUM_CELLS, dtype=np.int8), scenes.shape.shape)
    code = _one_hot(scenes.shape, "shape") | _one_hot(scenes.colour, "colour") | _one_hot(scenes.size, "size")
    return np.where(scenes.shape >= 0, code | _one_hot(cells, "cell"), _EMPTY_BIT)


def _forbidden_bits(caps: CaptionTable) -> np.ndarray:
    """(*P, 3) uint32 bits an object must not have to play each slot (all bits for unused slots)."""
    allowed = _one_hot(caps.shape, "shape") | _one_hot(caps.colour, "colour")
    allowed |= _one_hot(caps.size, "size") | _one_hot(caps.cell, "cell")
    return np.where(caps.used, ~allowed, np.uint32(0xFFFFFFFF))


def _fits_kernel(
    forbidden: np.ndarray, used: np.ndarray, relation: np.ndarray, count: np.ndarray, codes: np.ndarray
) -> np.ndarray:
    """The fits relation on packed codes, broadcasting caption leading shape P against image shape Q.

    Args:
        forbidden: (*P, S) from :func:`_forbidden_bits`; used: (*P, S); relation, count: (*P,).
        codes: (*Q, 9) from :func:`_scene_codes`.
    Returns:
        (*B,) bool, B = broadcast(P, Q).
    """
    match = (codes[..., None, :] & forbidden[..., :, None]) == 0  # (*B, S, 9)
    packed = np.packbits(match, axis=-1, bitorder="little")  # (*B, S, 2)
    cell_sets = packed[..., 0] | (packed[..., 1].astype(np.uint16) << 8)  # (*B, S)
    # Hall's condition: the used slots get pairwise distinct cells iff every subset of them can
    # reach at least as many cells as it has slots.
    n_slots = forbidden.shape[-1]
    ok = np.ones(cell_sets.shape[:-1], bool)
    for r in range(1, n_slots + 1):
        for subset in itertools.combinations(range(n_slots), r):
            union = np.bitwise_or.reduce(cell_sets[..., subset], axis=-1)
            ok &= _POPCOUNT[union] >= used[..., subset].sum(-1)
    # "a left of b" for some a in A, b in B  <=>  min col(A) < max col(B); swapping A and B turns
    # "left of" into "right of" and "above" into "below".
    rel = np.maximum(relation, 0)
    axis, swap = _REL_AXIS[rel], _REL_SWAP[rel]
    first = np.where(swap, cell_sets[..., 1], cell_sets[..., 0])
    second = np.where(swap, cell_sets[..., 0], cell_sets[..., 1])
    ok &= (relation < 0) | (_MIN_COORD[axis, first] < _MAX_COORD[axis, second])
    n_objects = (codes != _EMPTY_BIT).sum(-1)
    ok &= (count < 0) | (count == n_objects)
    return ok


def evaluate_fits(caps: CaptionTable, scenes: SceneTable) -> np.ndarray:
    """The fits relation with broadcasting: does every assertion of caption t hold in image v?

    ``caps`` fields have leading shape P, ``scenes`` fields leading shape Q; P and Q broadcast to B
    (e.g. (C, 1) and (1, I) for a matrix, or (n,) and (n,) for pairs). Returns (*B,) bool.
    """
    return _fits_kernel(_forbidden_bits(caps), caps.used, caps.relation, caps.count, _scene_codes(scenes))


class FitsOracle:
    """Answers "does caption t fit image v" for one split, from the structured records alone.

    Small enough to keep next to a trainer (a few bytes per caption and image), fast enough to mask the
    false negatives of every batch (a 128 x 128 query takes about 2 ms on a 2-core CPU).

    Args:
        captions: the split's :class:`CaptionTable` (T captions).
        scenes: the split's :class:`SceneTable` (N images).
    """

    def __init__(self, captions: CaptionTable, scenes: SceneTable) -> None:
        self.captions = captions
        self.scenes = scenes
        self._forbidden = _forbidden_bits(captions)  # (T, 3)
        self._codes = _scene_codes(scenes)  # (N, 9)

    @property
    def shape(self) -> tuple[int, int]:
        """(T, N): captions x images."""
        return len(self.captions), len(self.scenes)

    def _query(self, cap: np.ndarray, img: np.ndarray) -> np.ndarray:
        caps = self.captions
        return _fits_kernel(
            self._forbidden[cap], caps.used[cap], caps.relation[cap], caps.count[cap], self._codes[img]
        )

    def __call__(self, caption_indices: Sequence[int], image_indices: Sequence[int]) -> np.ndarray:
        """(len(caption_indices), len(image_indices)) bool sub-matrix of the fits relation."""
        return self._query(np.asarray(caption_indices)[:, None], np.asarray(image_indices)[None, :])

    def pairs(self, caption_indices: Sequence[int], image_indices: Sequence[int]) -> np.ndarray:
        """(n,) bool: whether caption_indices[k] fits image_indices[k]."""
        return self._query(np.asarray(caption_indices), np.asarray(image_indices))

    def matrix(self, chunk_size: int = 256) -> np.ndarray:
        """The full (T, N) bool fits matrix, computed in caption chunks to bound memory."""
        t, n = self.shape
        out = np.empty((t, n), bool)
        every_image = np.arange(n)
        for start in range(0, t, chunk_size):
            out[start : start + chunk_size] = self(np.arange(start, min(start + chunk_size, t)), every_image)
        return out


# ---------------------------------------------------------------------------------------------------------
# Oracle recall
# ---------------------------------------------------------------------------------------------------------


def oracle_metrics(fits: np.ndarray, txt2img: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Expected recall (percent) of an oracle that ranks every fitting item first, in random order.

    The bound any model can expect on a benchmark whose captions are ambiguous: a model that knows the
    fits relation perfectly still has to guess among the items that fit equally well.

    Text-to-image, a caption fitting n images: P(GT in top K) = min(K, n) / n.
    Image-to-text, an image fitting n_f captions, g of them its own: P(some GT in top K)
    = 1 - C(n_f - g, K) / C(n_f, K) = 1 - prod_{i<K} (n_f - g - i) / (n_f - i), which is exact
    and needs no large binomials (a factor hits 0 as soon as K > n_f - g).

    Args:
        fits: (N_txt, N_img) bool; must contain every ground-truth pair.
        txt2img: (N_txt,) ground-truth image of each caption.
        ks: recall cut-offs.
    Returns:
        ``{"i2t_r1", "i2t_r5", ..., "t2i_r10", "rsum"}``.
    """
    fits = np.asarray(fits, bool)
    txt2img = np.asarray(txt2img, np.int64)
    n_txt, n_img = fits.shape
    if txt2img.shape != (n_txt,):
        raise ValueError(f"txt2img has shape {txt2img.shape}, expected ({n_txt},)")
    if not fits[np.arange(n_txt), txt2img].all():
        raise ValueError("fits must contain every ground-truth (caption, image) pair")
    n_fit_img = fits.sum(1).astype(np.float64)  # (N_txt,)
    n_fit_txt = fits.sum(0).astype(np.float64)  # (N_img,)
    n_gt = np.bincount(txt2img, minlength=n_img).astype(np.float64)  # (N_img,)
    out: dict[str, float] = {}
    for k in ks:
        miss = np.ones(n_img)  # P(no GT caption in the top k)
        for i in range(k):
            den = n_fit_txt - i
            miss *= np.where(den > 0, np.maximum(n_fit_txt - n_gt - i, 0) / np.maximum(den, 1), 0.0)
        # An image without captions has nothing to retrieve: recall 0, not 1.
        out[f"i2t_r{k}"] = 100.0 * float(np.where(n_gt > 0, 1.0 - miss, 0.0).mean())
    for k in ks:
        out[f"t2i_r{k}"] = 100.0 * float((np.minimum(k, n_fit_img) / n_fit_img).mean())
    out["rsum"] = sum(out.values())
    return out


# ---------------------------------------------------------------------------------------------------------
# Scene sampling and rendering
# ---------------------------------------------------------------------------------------------------------


def _sample_scenes(config: SyntheticConfig, n: int, rng: np.random.Generator) -> SceneTable:
    """Draw n random scenes: a uniform object count, distinct random cells, uniform attributes."""
    counts = rng.integers(config.min_objects, config.max_objects + 1, size=n)
    # Ranking random keys gives each image a uniform random cell order; its first `count` cells are used.
    cell_rank = np.argsort(np.argsort(rng.random((n, NUM_CELLS)), axis=1), axis=1)
    occupied = cell_rank < counts[:, None]

    def attribute(n_values: int) -> np.ndarray:
        values = rng.integers(0, n_values, size=(n, NUM_CELLS)).astype(np.int8)
        return np.where(occupied, values, np.int8(-1))

    return SceneTable(
        shape=attribute(len(config.shapes)),
        colour=attribute(len(config.colours)),
        size=attribute(len(SIZES)),
    )


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


# ---------------------------------------------------------------------------------------------------------
# Caption writing
# ---------------------------------------------------------------------------------------------------------

_Obj = tuple[int, int, int, int]  # (cell, shape, colour, size)
_RELATION_WORDS = (
    ("left of", "to the left of"),
    ("right of", "to the right of"),
    ("above",),
    ("below", "under"),
)


def _true_relations(cell_a: int, cell_b: int) -> list[int]:
    """Indices into RELATIONS that hold from the object in cell_a to the object in cell_b."""
    (ra, ca), (rb, cb) = divmod(cell_a, GRID), divmod(cell_b, GRID)
    rels = [0 if ca < cb else 1] if ca != cb else []
    return rels + ([2 if ra < rb else 3] if ra != rb else [])


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


class _CaptionWriter:
    """Writes the sparse captions of one image and the structured spec of each.

    Templates prefer two fully specified objects plus a relation, position or count: that keeps captions
    short and learnable while making them fit (almost) only their own image.
    """

    def __init__(self, config: SyntheticConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        # (min objects, max objects, template): each template is tried only on scenes it can describe.
        self.templates: list[tuple[int, int, Callable[[list[_Obj]], tuple[str, CaptionSpec]]]] = [
            (2, NUM_CELLS, self._relation),
            (2, NUM_CELLS, self._relation_sentence),
            (2, NUM_CELLS, self._two_positions),
            (2, NUM_CELLS, self._count_two),
            (2, NUM_CELLS, self._count_position),
            (2, NUM_CELLS, self._count_relation),
            (3, NUM_CELLS, self._three),
            (1, 1, self._single_position),
            (1, 1, self._only_position),
            (1, 1, self._alone),
            (1, 1, self._single_object),
            (1, 1, self._nothing_else),
        ]

    # -- object phrases ------------------------------------------------------------------------------

    def _ref(self, obj: _Obj, cell: bool = False, partial: bool = True) -> ObjectRef:
        """An assertion about ``obj``, sometimes leaving out one attribute (binding practice)."""
        c, shape, colour, size = obj
        ref = ObjectRef(shape=shape, colour=colour, size=size, cell=c if cell else None)
        if partial and self.rng.random() < self.config.partial_attr_prob:
            ref = dataclasses.replace(ref, **{self.rng.choice(("shape", "colour", "size")): None})
        return ref

    def _words(self, ref: ObjectRef) -> str:
        """'large red circle' (no article); an unasserted shape reads as 'object'."""
        words = [
            SIZES[ref.size] if ref.size is not None else "",
            self.config.colours[ref.colour] if ref.colour is not None else "",
            self.config.shapes[ref.shape] if ref.shape is not None else "object",
        ]
        return " ".join(w for w in words if w)

    def _a(self, ref: ObjectRef) -> str:
        return _article(self._words(ref))

    def _at(self, ref: ObjectRef) -> str:
        return CELL_PHRASES[ref.cell]

    def _pair(self, objs: list[_Obj]) -> tuple[_Obj, _Obj]:
        a, b = self.rng.sample(objs, 2)
        return a, b

    def _relation_between(self, a: _Obj, b: _Obj) -> tuple[int, str]:
        """A random true relation of a to b and a wording of it."""
        rel = self.rng.choice(_true_relations(a[0], b[0]))
        return rel, self.rng.choice(_RELATION_WORDS[rel])

    # -- templates for two or more objects -----------------------------------------------------------

    def _relation(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        a, b = self._pair(objs)
        rel, words = self._relation_between(a, b)
        ra, rb = self._ref(a), self._ref(b)
        return f"{self._a(ra)} {words} {self._a(rb)}", CaptionSpec((ra, rb), relation=rel)

    def _relation_sentence(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        a, b = self._pair(objs)
        rel, words = self._relation_between(a, b)
        ra, rb = self._ref(a), self._ref(b)
        text = f"there is {self._a(ra)} {words} {self._a(rb)}"
        if self.rng.random() < 0.5:
            text = f"the {self._words(ra)} is {words} the {self._words(rb)}"
        return text, CaptionSpec((ra, rb), relation=rel)

    def _two_positions(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        a, b = self._pair(objs)
        # Two positions pin the objects down on their own; dropping the sizes keeps this <= 16 words.
        ra, rb = (dataclasses.replace(self._ref(o, cell=True), size=None) for o in (a, b))
        return f"{self._a(ra)} {self._at(ra)} and {self._a(rb)} {self._at(rb)}", CaptionSpec((ra, rb))

    def _count_two(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        a, b = self._pair(objs)
        ra, rb = self._ref(a), self._ref(b)
        n = len(objs)
        lead = (
            "two objects,"
            if n == 2
            else self.rng.choice((f"{_NUMBERS[n]} objects including", f"{_NUMBERS[n]} shapes with"))
        )
        return f"{lead} {self._a(ra)} and {self._a(rb)}", CaptionSpec((ra, rb), count=n)

    def _count_position(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        ra = self._ref(self.rng.choice(objs), cell=True, partial=False)
        text = f"{_NUMBERS[len(objs)]} objects with {self._a(ra)} {self._at(ra)}"
        return text, CaptionSpec((ra,), count=len(objs))

    def _count_relation(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        a, b = self._pair(objs)
        rel, words = self._relation_between(a, b)
        ra, rb = self._ref(a), self._ref(b)
        text = f"{_NUMBERS[len(objs)]} shapes and {self._a(ra)} is {words} {self._a(rb)}"
        return text, CaptionSpec((ra, rb), relation=rel, count=len(objs))

    def _three(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        refs = tuple(self._ref(o, partial=False) for o in self.rng.sample(objs, 3))
        return f"{self._a(refs[0])}, {self._a(refs[1])} and {self._a(refs[2])}", CaptionSpec(refs)

    # -- templates for a single object (always assert the count: "a single ...") -----------------------

    def _single_position(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        ra = self._ref(objs[0], cell=True)
        return f"a single {self._words(ra)} {self._at(ra)}", CaptionSpec((ra,), count=1)

    def _only_position(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        ra = self._ref(objs[0], cell=True)
        return f"only one object, {self._a(ra)} {self._at(ra)}", CaptionSpec((ra,), count=1)

    def _alone(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        ra = self._ref(objs[0], cell=True)
        return f"{self._a(ra)} alone {self._at(ra)}", CaptionSpec((ra,), count=1)

    def _single_object(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        ra = self._ref(objs[0], cell=True, partial=False)
        return f"one object: {self._a(ra)} {self._at(ra)}", CaptionSpec((ra,), count=1)

    def _nothing_else(self, objs: list[_Obj]) -> tuple[str, CaptionSpec]:
        ra = self._ref(objs[0], cell=True, partial=False)
        return f"just {self._a(ra)} {self._at(ra)} and nothing else", CaptionSpec((ra,), count=1)

    # -- driver ----------------------------------------------------------------------------------------

    def write(self, objs: list[_Obj], n: int) -> list[tuple[str, CaptionSpec]]:
        """``n`` distinct captions of the scene ``objs``, each from a different template if possible."""
        usable = [t for lo, hi, t in self.templates if lo <= len(objs) <= hi]
        self.rng.shuffle(usable)
        out: list[tuple[str, CaptionSpec]] = []
        seen: set[str] = set()
        for attempt in range(20 * n):
            text, spec = usable[attempt % len(usable)](objs)
            if text not in seen or attempt >= 10 * n:
                seen.add(text)
                out.append((text, spec))
            if len(out) == n:
                break
        return out


class _DenseWriter:
    """Writes one exhaustive MLLM-style description per image, with seeded omissions and wrong words."""

    _INTROS = (
        "The image shows {n} on a plain light grey background.",
        "This picture contains {n} arranged on a plain light grey background.",
        "In this image, {n} can be seen on a plain light grey background.",
    )
    _OBJECT_SENTENCES = (
        "In the {pos} there is {obj}.",
        "{Obj} is located in the {pos}.",
        "In the {pos} we can see {obj}.",
    )

    def __init__(self, config: SyntheticConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng

    def _corrupt(self, obj: _Obj) -> tuple[_Obj, int]:
        """Maybe replace one attribute with a different value; returns the object and the attribute hit."""
        if self.rng.random() >= self.config.dense_wrong_attr_prob:
            return obj, -1
        which = self.rng.randrange(3)
        n_values = (len(self.config.shapes), len(self.config.colours), len(SIZES))[which]
        attrs = list(obj[1:])
        attrs[which] = (attrs[which] + self.rng.randrange(1, n_values)) % n_values
        return (obj[0], *attrs), which

    def _words(self, obj: _Obj) -> str:
        return f"{SIZES[obj[3]]} {self.config.colours[obj[2]]} {self.config.shapes[obj[1]]}"

    def _position(self, cell: int) -> str:
        return (
            CELL_NAMES[cell]
            + (" corner" if cell in _CORNERS else "")
            + self.rng.choice(("", " of the image"))
        )

    def write(self, objs: list[_Obj]) -> tuple[str, list[_Obj], list[int]]:
        """The description, the objects as described (cell order) and which attribute each got wrong."""
        kept = [o for o in objs if self.rng.random() >= self.config.dense_omit_prob]
        if not kept:  # even a sloppy describer mentions something
            kept = [self.rng.choice(objs)]
        described, wrong = zip(*(self._corrupt(o) for o in kept), strict=True)
        n = len(described)
        what = "a single object" if n == 1 else f"{_NUMBERS[n]} objects"
        sentences = [self.rng.choice(self._INTROS).format(n=what)]
        for obj in described:
            phrase = _article(self._words(obj))
            sentence = self.rng.choice(self._OBJECT_SENTENCES)
            sentences.append(sentence.format(pos=self._position(obj[0]), obj=phrase, Obj=phrase.capitalize()))
        pairs = list(itertools.combinations(described, 2))
        for a, b in self.rng.sample(pairs, min(2, len(pairs))):
            rel = self.rng.choice(_true_relations(a[0], b[0]))
            sentences.append(f"The {self._words(a)} is {RELATIONS[rel]} the {self._words(b)}.")
        if n == 1:
            sentences.append("There are no other objects, and the rest of the background is empty.")
        else:
            sentences.append("The objects do not overlap.")
        return " ".join(sentences), list(described), list(wrong)


def _dense_table(n: int, described: list[list[_Obj]], wrong: list[list[int]]) -> DenseTable:
    table = DenseTable(
        mentioned=np.zeros((n, NUM_CELLS), bool),
        shape=np.full((n, NUM_CELLS), -1, np.int8),
        colour=np.full((n, NUM_CELLS), -1, np.int8),
        size=np.full((n, NUM_CELLS), -1, np.int8),
        wrong=np.full((n, NUM_CELLS), -1, np.int8),
    )
    for i, (objs, bad) in enumerate(zip(described, wrong, strict=True)):
        for (cell, shape, colour, size), w in zip(objs, bad, strict=True):
            table.mentioned[i, cell] = True
            table.shape[i, cell], table.colour[i, cell], table.size[i, cell] = shape, colour, size
            table.wrong[i, cell] = w
    return table


# ---------------------------------------------------------------------------------------------------------
# Splits and the dataset
# ---------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class SceneSplit:
    """Everything the generator knows about one split.

    Attributes:
        name: split name.
        images: (N, H, W, 3) uint8.
        scenes: structured content of the N images.
        captions: the T = 5N sparse captions, image-major (captions 5i..5i+4 describe image i).
        caption_specs: structured content of the captions.
        txt2img: (T,) int64 ground-truth image per caption.
        dense_captions: N dense descriptions.
        dense_specs: what each dense description says (noise included).
    """

    name: str
    images: np.ndarray
    scenes: SceneTable
    captions: list[str]
    caption_specs: CaptionTable
    txt2img: np.ndarray
    dense_captions: list[str]
    dense_specs: DenseTable
    _oracle: FitsOracle | None = field(default=None, init=False, repr=False)

    @property
    def oracle(self) -> FitsOracle:
        """The split's :class:`FitsOracle`."""
        if self._oracle is None:
            self._oracle = FitsOracle(self.caption_specs, self.scenes)
        return self._oracle

    @property
    def image_ids(self) -> list[str]:
        return [f"syn-{self.name}-{i:06d}" for i in range(len(self.scenes))]

    def to_retrieval_split(self, with_fits: bool | None = None) -> RetrievalSplit:
        """The canonical :class:`RetrievalSplit`.

        ``fits`` is materialised when ``with_fits``, by default for every split but train: its
        (50000, 10000) matrix would take 500 MB, and a trainer only needs batch blocks of it, which
        :attr:`oracle` answers on demand.
        """
        if with_fits is None:
            with_fits = self.name != "train"
        return RetrievalSplit(
            name=self.name,
            images=self.images,
            captions=self.captions,
            txt2img=self.txt2img,
            image_ids=self.image_ids,
            dense_captions=self.dense_captions,
            fits=self.oracle.matrix() if with_fits else None,
        )

    def check(self) -> None:
        """Raise if a caption does not fit its own image (a generator bug, never a data property)."""
        ok = self.oracle.pairs(np.arange(len(self.captions)), self.txt2img)
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise AssertionError(f"{self.name} caption {bad} {self.captions[bad]!r} does not fit its image")

    # -- persistence -----------------------------------------------------------------------------------

    def save(self, directory: Path) -> None:
        np.save(directory / f"{self.name}_images.npy", self.images)
        np.savez(
            directory / f"{self.name}_specs.npz",
            txt2img=self.txt2img,
            **self.scenes.to_arrays("scene_"),
            **self.caption_specs.to_arrays("caption_"),
            **self.dense_specs.to_arrays("dense_"),
        )
        text = {"captions": self.captions, "dense_captions": self.dense_captions}
        (directory / f"{self.name}_text.json").write_text(json.dumps(text))

    @classmethod
    def load(cls, directory: Path, name: str) -> SceneSplit:
        text = json.loads((directory / f"{name}_text.json").read_text())
        with np.load(directory / f"{name}_specs.npz") as arrays:
            return cls(
                name=name,
                images=np.load(directory / f"{name}_images.npy"),
                scenes=SceneTable.from_arrays(arrays, "scene_"),
                captions=text["captions"],
                caption_specs=CaptionTable.from_arrays(arrays, "caption_"),
                txt2img=arrays["txt2img"],
                dense_captions=text["dense_captions"],
                dense_specs=DenseTable.from_arrays(arrays, "dense_"),
            )


def generate_split(config: SyntheticConfig, name: str) -> SceneSplit:
    """Generate one split. Each split has its own random streams, so its content does not depend on the
    sizes of the other splits."""
    split_id = SPLITS.index(name)
    seq = np.random.SeedSequence([config.seed, split_id])
    scene_rng, render_rng, text_seed = (np.random.default_rng(s) for s in seq.spawn(3))
    # Python's Random is ~10x faster than numpy for the many scalar choices of caption writing.
    text_rng = random.Random(int(text_seed.integers(2**63)))
    n = config.split_size(name)
    scenes = _sample_scenes(config, n, scene_rng)
    images = render_scenes(scenes, config, render_rng)
    captions, specs, described, wrong, dense = [], [], [], [], []
    writer, dense_writer = _CaptionWriter(config, text_rng), _DenseWriter(config, text_rng)
    for i in range(n):
        objs = scenes.objects(i)
        for text, spec in writer.write(objs, config.captions_per_image):
            captions.append(text)
            specs.append(spec)
        description, objs_said, bad = dense_writer.write(objs)
        dense.append(description)
        described.append(objs_said)
        wrong.append(bad)
    split = SceneSplit(
        name=name,
        images=images,
        scenes=scenes,
        captions=captions,
        caption_specs=CaptionTable.from_specs(specs),
        txt2img=np.repeat(np.arange(n), config.captions_per_image),
        dense_captions=dense,
        dense_specs=_dense_table(n, described, wrong),
    )
    split.check()
    return split


def default_cache_dir() -> Path:
    """``$PATCHWORD_CACHE/synthetic`` if the variable is set, else ``~/.cache/patchword/synthetic``."""
    root = os.environ.get("PATCHWORD_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "patchword") / "synthetic"


class SyntheticScenes:
    """The synthetic scenes dataset: train / dev / test :class:`SceneSplit` s generated from one config.

    Use :meth:`generate` (in memory) or :meth:`load_or_generate` (cached on disk), then
    :meth:`split` for the canonical :class:`RetrievalSplit` and :meth:`oracle` / :meth:`fits` for the
    fits relation.
    """

    def __init__(self, config: SyntheticConfig, splits: dict[str, SceneSplit]) -> None:
        self.config = config
        self.scene_splits = splits
        self._retrieval: dict[str, RetrievalSplit] = {}

    @classmethod
    def generate(cls, config: SyntheticConfig | None = None) -> SyntheticScenes:
        """Generate all splits in memory."""
        config = config or SyntheticConfig()
        start = time.perf_counter()
        splits = {name: generate_split(config, name) for name in SPLITS}
        logger.info(
            "generated synthetic scenes %s (%d images) in %.1f s",
            config.cache_key(),
            sum(len(s.scenes) for s in splits.values()),
            time.perf_counter() - start,
        )
        return cls(config, splits)

    @classmethod
    def load_or_generate(
        cls, config: SyntheticConfig | None = None, cache_dir: str | os.PathLike | None = None
    ) -> SyntheticScenes:
        """Load the dataset from ``cache_dir/synthetic-<hash>/``, generating and caching it first if absent.

        Args:
            config: generation config (default :class:`SyntheticConfig`).
            cache_dir: cache root; default :func:`default_cache_dir`.
        """
        config = config or SyntheticConfig()
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        target = root / f"synthetic-{config.cache_key()}"
        if (target / "config.json").exists():
            logger.info("loading synthetic scenes from %s", target)
            return cls(config, {name: SceneSplit.load(target, name) for name in SPLITS})
        dataset = cls.generate(config)
        dataset.save(target)
        return dataset

    def save(self, target: Path) -> None:
        """Write to ``target`` atomically: a reader sees either nothing or a complete directory."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            for split in self.scene_splits.values():
                split.save(tmp)
            # config.json last: its presence marks a complete directory.
            (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2))
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
            logger.info("another process cached %s first; keeping its copy", target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def split(self, name: str) -> RetrievalSplit:
        """The canonical :class:`RetrievalSplit` of ``name`` (``fits`` set for dev/test, None for train)."""
        if name not in self._retrieval:
            self._retrieval[name] = self[name].to_retrieval_split()
        return self._retrieval[name]

    @property
    def splits(self) -> dict[str, RetrievalSplit]:
        """All three canonical splits."""
        return {name: self.split(name) for name in SPLITS}

    def oracle(self, name: str) -> FitsOracle:
        """The :class:`FitsOracle` of split ``name``."""
        return self[name].oracle

    def fits(self, name: str, caption_indices: Sequence[int], image_indices: Sequence[int]) -> np.ndarray:
        """(len(caption_indices), len(image_indices)) bool fits sub-matrix of split ``name``."""
        return self.oracle(name)(caption_indices, image_indices)

    def __getitem__(self, name: str) -> SceneSplit:
        if name not in self.scene_splits:
            raise KeyError(f"unknown split {name!r}; expected one of {SPLITS}")
        return self.scene_splits[name]
