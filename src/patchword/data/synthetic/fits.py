"""The fits relation: which images a caption fits, computed from the structured records alone."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from patchword.data.synthetic.config import COLOURS, GRID, NUM_CELLS, SHAPES, SIZES
from patchword.data.synthetic.records import CaptionTable, SceneTable

# Relation r holds between objects a and b iff coord(a) < coord(b) on axis _REL_AXIS[r], with a and b
# swapped where _REL_SWAP[r]: "a right of b" is "b left of a".
_REL_AXIS = np.array([1, 1, 0, 0])  # 0 = row, 1 = column
_REL_SWAP = np.array([False, True, False, True])
_CELL_RC = np.stack(np.divmod(np.arange(NUM_CELLS), GRID))  # (2, 9): row and column of each cell

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
