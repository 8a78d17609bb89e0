"""Caption writing: the sparse caption templates (with their specs) and the noisy dense descriptions."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable

import numpy as np

from patchword.data.synthetic.config import (
    CELL_NAMES,
    CELL_PHRASES,
    GRID,
    NUM_CELLS,
    RELATIONS,
    SIZES,
    SyntheticConfig,
)
from patchword.data.synthetic.records import CaptionSpec, DenseTable, ObjectRef

_Obj = tuple[int, int, int, int]  # (cell, shape, colour, size)
_CORNERS = frozenset({0, 2, 6, 8})
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
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
