"""Compositional hard negatives: for each caption, captions that change exactly one fact.

The generator knows what every caption asserts (its :class:`CaptionSpec`) and what every image holds, so it
can write, for a caption of image v, a caption that differs in one fact and provably does not fit v:

=================  ===============================================================================
kind               what changes (``detail``)
=================  ===============================================================================
``attribute_swap`` two named objects exchange their ``colour`` or ``size`` ("a large red circle left of a
                   small blue square" -> "a large blue circle left of a small red square")
``relation_swap``  the relation turns around: the ``opposite`` relation ("left of" -> "right of") or the
                   two ``arguments`` exchanged ("a red circle above a blue square" -> "a blue square above
                   a red circle"); both say the same thing, the wording differs
``object_replace`` one object's ``shape`` or ``colour`` becomes a value the caption does not mention
``count_change``   the stated number of objects (``count``) becomes another number the generator uses
=================  ===============================================================================

Negatives are written by editing the positive's own text: the object phrases, relation words and count
words are rewritten with the generator's vocabulary and wording rules (articles included), so a negative
reads exactly like a caption of the same template; only the changed fact differs. A candidate that still
fits its image under :func:`~patchword.data.synthetic.evaluate_fits` (the image happens to satisfy the
changed caption too) is discarded and the next candidate tried, so every negative is false of its image.

Count changes exist for the captions that state their count with a number word ("three objects with ...",
"four shapes and ..."), i.e. the count templates of scenes with two or more objects; the new number is one
the generator uses for those templates (2 .. ``max_objects``). The single-object templates state their
count with words that have no other number in the grammar ("a single", "alone", "only one object",
"nothing else"): changing it would need a sentence form the generator never writes, so they get none.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from patchword.data.synthetic.captions import _NUMBERS, _RELATION_WORDS, _article, _CaptionWriter
from patchword.data.synthetic.config import SyntheticConfig
from patchword.data.synthetic.fits import evaluate_fits
from patchword.data.synthetic.records import CaptionSpec, CaptionTable, ObjectRef

__all__ = ["NEGATIVE_KINDS", "HardNegatives", "hard_negatives"]

#: The kinds of hard negatives, in report order.
NEGATIVE_KINDS: tuple[str, ...] = ("attribute_swap", "relation_swap", "object_replace", "count_change")

_OPPOSITE_RELATION = (1, 0, 3, 2)  # left of <-> right of, above <-> below
# Leads of the count templates (captions._count_two/_count_position/_count_relation): (pattern, form).
_COUNT_LEADS = (
    (re.compile(r"two objects, "), "pair"),
    (re.compile(r"(\w+) objects including "), "objects including"),
    (re.compile(r"(\w+) shapes with "), "shapes with"),
    (re.compile(r"(\w+) objects with "), "objects with"),
    (re.compile(r"(\w+) shapes and "), "shapes and"),
)


@dataclass(eq=False)
class HardNegatives:
    """A table of M (image, positive caption, negative caption) triples.

    Attributes:
        image: (M,) int64 image index in the split.
        caption: (M,) int64 index of the positive caption in the split.
        positive: the M positive caption texts.
        negative: the M negative caption texts.
        kind: the M kinds (one of :data:`NEGATIVE_KINDS`).
        detail: what changed: ``colour`` / ``size`` (attribute swap), ``opposite`` / ``arguments``
            (relation swap), ``shape`` / ``colour`` (object replace), ``count``.
        negative_specs: the structured content of the M negatives.
    """

    image: np.ndarray
    caption: np.ndarray
    positive: list[str]
    negative: list[str]
    kind: list[str]
    detail: list[str]
    negative_specs: CaptionTable

    def __len__(self) -> int:
        return len(self.negative)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind the table can hold, in report order (:data:`NEGATIVE_KINDS`)."""
        return NEGATIVE_KINDS

    def counts(self) -> dict[str, int]:
        """Number of triples of each kind (every kind of :data:`NEGATIVE_KINDS`, zeros included)."""
        return {k: self.kind.count(k) for k in NEGATIVE_KINDS}

    def records(self) -> list[dict[str, object]]:
        """One JSON-ready dict per triple: image, caption, positive, negative, kind, detail."""
        return [
            {
                "image": int(self.image[i]),
                "caption": int(self.caption[i]),
                "positive": self.positive[i],
                "negative": self.negative[i],
                "kind": self.kind[i],
                "detail": self.detail[i],
            }
            for i in range(len(self))
        ]


# -- specs <-> table rows ------------------------------------------------------------------------------


def _none_if_negative(value: int) -> int | None:
    return None if value < 0 else int(value)


def _spec_of(table: CaptionTable, t: int) -> CaptionSpec:
    """Row ``t`` of a caption table as a :class:`CaptionSpec`."""
    refs = tuple(
        ObjectRef(
            shape=_none_if_negative(table.shape[t, j]),
            colour=_none_if_negative(table.colour[t, j]),
            size=_none_if_negative(table.size[t, j]),
            cell=_none_if_negative(table.cell[t, j]),
        )
        for j in np.flatnonzero(table.used[t])
    )
    return CaptionSpec(refs, _none_if_negative(table.relation[t]), _none_if_negative(table.count[t]))


# -- editing the text of one caption --------------------------------------------------------------------


class _CaptionText:
    """The text of one generated caption with the positions of its object phrases.

    Every template writes its object phrases in slot order, each as the writer's ``_words`` of the slot
    (``[size] [colour] shape|object``), preceded by "a"/"an" where the template uses an article; between
    them stand only template words (leads, relation words, cell phrases), which never contain attribute
    words. So searching each phrase after the end of the previous one finds it.
    """

    def __init__(self, text: str, spec: CaptionSpec, writer: _CaptionWriter) -> None:
        self.text, self.spec, self.writer = text, spec, writer
        self.spans: list[tuple[int, int]] = []
        cursor = 0
        for ref in spec.objects:
            phrase = writer._words(ref)
            found = re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)").search(text, cursor)
            if found is None:
                raise ValueError(
                    f"caption {text!r} does not contain its object phrase {phrase!r}: hard negatives need "
                    "captions written by this generator with its configuration"
                )
            self.spans.append(found.span())
            cursor = found.end()

    def with_objects(self, refs: Sequence[ObjectRef]) -> str:
        """The text with slot j's phrase rewritten as ``refs[j]`` (its article fixed to match)."""
        text = self.text
        for (start, end), ref in sorted(zip(self.spans, refs, strict=True), reverse=True):
            phrase = self.writer._words(ref)
            head = text[:start]
            article = re.search(r"(?:^|(?<=\s))(an?) $", head)
            if article is not None:
                head = head[: article.start()] + _article(phrase)[: -len(phrase)]
            text = head + phrase + text[end:]
        return text

    def with_relation(self, relation: int) -> str | None:
        """The text with its relation words replaced by the same-style wording of ``relation``."""
        (_, end0), (start1, _) = self.spans[0], self.spans[1]
        between = self.text[end0:start1]
        # Longest wording first: "to the left of" must not be read as "left of".
        for style, words in sorted(enumerate(_RELATION_WORDS[self.spec.relation]), key=lambda p: -len(p[1])):
            found = re.search(rf"(?<!\w){re.escape(words)}(?!\w)", between)
            if found is not None:
                options = _RELATION_WORDS[relation]
                new = options[min(style, len(options) - 1)]
                between = between[: found.start()] + new + between[found.end() :]
                return self.text[:end0] + between + self.text[start1:]
        return None

    def with_count(self, count: int, rng: random.Random) -> str | None:
        """The text with its number word rewritten as ``count`` (>= 2), None if it has no number word."""
        for pattern, form in _COUNT_LEADS:
            found = pattern.match(self.text)
            if found is None:
                continue
            rest = self.text[found.end() :]
            if form in ("pair", "objects including", "shapes with"):  # captions._count_two
                if count == 2:
                    return "two objects, " + rest
                if form == "pair":  # the template words counts above two either way
                    form = rng.choice(("objects including", "shapes with"))
            return f"{_NUMBERS[count]} {form} {rest}"
        return None


# -- candidates of each kind ----------------------------------------------------------------------------

# (negative spec, detail, its text): the text is written only for the candidate that is kept.
_Candidate = tuple[CaptionSpec, str, Callable[[], str]]


def _replace_ref(refs: tuple[ObjectRef, ...], j: int, **change: int) -> tuple[ObjectRef, ...]:
    return refs[:j] + (dataclasses.replace(refs[j], **change),) + refs[j + 1 :]


def _attribute_swaps(caption: _CaptionText) -> list[_Candidate]:
    refs, out = caption.spec.objects, []
    for a in range(len(refs)):
        for b in range(a + 1, len(refs)):
            for attr in ("colour", "size"):
                va, vb = getattr(refs[a], attr), getattr(refs[b], attr)
                if va is None or vb is None or va == vb:
                    continue
                new = _replace_ref(_replace_ref(refs, a, **{attr: vb}), b, **{attr: va})
                spec = dataclasses.replace(caption.spec, objects=new)
                out.append((spec, attr, partial(caption.with_objects, new)))
    return out


def _relation_swaps(caption: _CaptionText) -> list[_Candidate]:
    spec = caption.spec
    if spec.relation is None:
        return []
    out = []
    opposite = _OPPOSITE_RELATION[spec.relation]
    text = caption.with_relation(opposite)
    if text is not None:
        out.append((dataclasses.replace(spec, relation=opposite), "opposite", partial(str, text)))
    swapped = (spec.objects[1], spec.objects[0])
    out.append(
        (dataclasses.replace(spec, objects=swapped), "arguments", partial(caption.with_objects, swapped))
    )
    return out


def _object_replacements(caption: _CaptionText, config: SyntheticConfig) -> list[_Candidate]:
    refs, out = caption.spec.objects, []
    for attr, n_values in (("shape", len(config.shapes)), ("colour", len(config.colours))):
        mentioned = {getattr(r, attr) for r in refs}
        for j, ref in enumerate(refs):
            if getattr(ref, attr) is None:
                continue
            for value in range(n_values):
                if value not in mentioned:
                    new = _replace_ref(refs, j, **{attr: value})
                    spec = dataclasses.replace(caption.spec, objects=new)
                    out.append((spec, attr, partial(caption.with_objects, new)))
    return out


def _count_changes(caption: _CaptionText, config: SyntheticConfig, rng: random.Random) -> list[_Candidate]:
    count = caption.spec.count
    if count is None or count < 2:
        return []
    out = []
    for new in range(max(2, config.min_objects), config.max_objects + 1):
        if new == count:
            continue
        text = caption.with_count(new, rng)
        if text is not None:
            out.append((dataclasses.replace(caption.spec, count=new), "count", partial(str, text)))
    return out


def _candidates(
    kind: str, caption: _CaptionText, config: SyntheticConfig, rng: random.Random
) -> list[_Candidate]:
    if kind == "attribute_swap":
        return _attribute_swaps(caption)
    if kind == "relation_swap":
        return _relation_swaps(caption)
    if kind == "object_replace":
        return _object_replacements(caption, config)
    return _count_changes(caption, config, rng)


def hard_negatives(
    split, config: SyntheticConfig, *, seed: int = 0, kinds: Sequence[str] = NEGATIVE_KINDS
) -> HardNegatives:
    """At most one hard negative of each kind for every caption of ``split`` (see the module docstring).

    Candidates of a (caption, kind) are tried in a seeded random order; the first that does not fit the
    caption's image is kept. A caption gets no negative of a kind it cannot express (no relation, no
    number word, a single object for a swap) or whose every candidate still fits its image.

    Args:
        split: a :class:`~patchword.data.synthetic.SceneSplit` (its captions, specs, scenes, txt2img).
        config: the generator config the split was made with (vocabularies, object counts).
        seed: seed of the candidate order and of the wording choices; equal seeds give equal tables.
        kinds: which kinds to make, a subset of :data:`NEGATIVE_KINDS`.
    Returns:
        the triples, ordered by caption, then kind in :data:`NEGATIVE_KINDS` order.
    """
    unknown = sorted(set(kinds) - set(NEGATIVE_KINDS))
    if unknown:
        raise ValueError(f"unknown hard-negative kinds {unknown}; expected a subset of {NEGATIVE_KINDS}")
    rng = random.Random(seed)
    writer = _CaptionWriter(config, rng)
    groups: list[tuple[int, str, list[_Candidate]]] = []  # (caption, kind, candidates in trial order)
    for t, text in enumerate(split.captions):
        caption = _CaptionText(text, _spec_of(split.caption_specs, t), writer)
        for kind in (k for k in NEGATIVE_KINDS if k in kinds):
            candidates = _candidates(kind, caption, config, rng)
            rng.shuffle(candidates)
            if candidates:
                groups.append((t, kind, candidates))
    flat = [(t, kind, cand) for t, kind, cands in groups for cand in cands]
    if not flat:
        return _empty_negatives()
    owners = split.txt2img[np.array([t for t, _, _ in flat])]
    fits = evaluate_fits(CaptionTable.from_specs([c[0] for _, _, c in flat]), split.scenes.take(owners))
    chosen, k = [], 0
    for _, _, cands in groups:
        misses = np.flatnonzero(~fits[k : k + len(cands)])
        if misses.size:
            chosen.append(k + int(misses[0]))
        k += len(cands)
    pick = [flat[i] for i in chosen]
    return HardNegatives(
        image=np.asarray(owners[chosen], np.int64),
        caption=np.array([t for t, _, _ in pick], np.int64),
        positive=[split.captions[t] for t, _, _ in pick],
        negative=[c[2]() for _, _, c in pick],
        kind=[kind for _, kind, _ in pick],
        detail=[c[1] for _, _, c in pick],
        negative_specs=CaptionTable.from_specs([c[0] for _, _, c in pick]),
    )


def _empty_negatives() -> HardNegatives:
    return HardNegatives(
        image=np.zeros(0, np.int64),
        caption=np.zeros(0, np.int64),
        positive=[],
        negative=[],
        kind=[],
        detail=[],
        negative_specs=CaptionTable.from_specs([]),
    )
