"""Structured records (struct-of-arrays, so fits can be evaluated with broadcasting).

Codes follow the package convention: attribute and cell indices, ``-1`` for "empty" / "not asserted".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from patchword.data.synthetic.config import MAX_CAPTION_OBJECTS


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
