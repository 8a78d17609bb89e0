"""Compositional hard negatives (one fact changed, never fitting) and their accuracy under a model."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from conftest import tiny_model
from patchword.data.synthetic import (
    CELL_PHRASES,
    NEGATIVE_KINDS,
    SIZES,
    CaptionSpec,
    ObjectRef,
    SyntheticConfig,
    SyntheticScenes,
    evaluate_fits,
    generate_split,
    hard_negatives,
)
from patchword.data.synthetic.captions import _NUMBERS, _RELATION_WORDS
from patchword.data.synthetic.negatives import _spec_of
from patchword.data.tokenizers import WordVocab
from patchword.errors import DataError, MissingFileError
from patchword.eval.compositional import (
    CompositionalTriples,
    FileImageSource,
    compositional_accuracy,
    format_compositional_comparison,
    format_compositional_table,
    read_sugarcrepe,
    score_triples,
    synthetic_suite,
)
from patchword.eval.engine import score_matrix
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens
from patchword.matching import MatcherOutput
from patchword.matching.base import Matcher

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = SyntheticConfig(seed=7, image_size=32, num_train=2, num_dev=2, num_test=300)


@pytest.fixture(scope="module")
def split():
    return generate_split(CFG, "test")


@pytest.fixture(scope="module")
def negatives(split):
    return hard_negatives(split, CFG, seed=0)


# -- an independent reader of the caption grammar ----------------------------------------------------------


class CaptionGrammar:
    """Parses every sparse caption template back into the spec it asserts (checks articles too)."""

    def __init__(self, config: SyntheticConfig) -> None:
        self.shapes, self.colours = list(config.shapes), list(config.colours)
        rel_words = sorted(
            ((w, r) for r, ws in enumerate(_RELATION_WORDS) for w in ws), key=lambda p: -len(p[0])
        )
        self.relations = dict(rel_words)
        alt = lambda words: "|".join(re.escape(w) for w in words)  # noqa: E731
        obj = rf"(?:({alt(SIZES)}) )?(?:({alt(self.colours)}) )?({alt(self.shapes)}|object)"
        parts = {
            "A": (rf"(an?) {obj}", 4),
            "O": (obj, 3),
            "C": (rf"({alt(CELL_PHRASES)})", 1),
            "R": (rf"({alt(self.relations)})", 1),
            "N": (rf"({alt(_NUMBERS)})", 1),
        }
        templates = [
            ("just {A} {C} and nothing else", 1),
            ("one object: {A} {C}", 1),
            ("only one object, {A} {C}", 1),
            ("a single {O} {C}", 1),
            ("{A} alone {C}", 1),
            ("two objects, {A} and {A}", 2),
            ("{N} objects including {A} and {A}", None),
            ("{N} shapes with {A} and {A}", None),
            ("{N} objects with {A} {C}", None),
            ("{N} shapes and {A} is {R} {A}", None),
            ("there is {A} {R} {A}", None),
            ("the {O} is {R} the {O}", None),
            ("{A}, {A} and {A}", None),
            ("{A} {C} and {A} {C}", None),
            ("{A} {R} {A}", None),
        ]
        self.templates = []
        for text, count in templates:
            slots = re.findall(r"\{(\w)\}", text)
            pattern = re.escape(text)
            for slot in set(slots):
                pattern = pattern.replace(re.escape("{" + slot + "}"), parts[slot][0])
            self.templates.append((re.compile(pattern), slots, [parts[s][1] for s in slots], count))

    def parse(self, text: str) -> CaptionSpec:
        for pattern, slots, widths, count in self.templates:
            found = pattern.fullmatch(text)
            if found is None:
                continue
            groups, objects, relation = list(found.groups()), [], None
            for slot, width in zip(slots, widths, strict=True):
                values, groups = groups[:width], groups[width:]
                if slot in "AO":
                    article, (size, colour, shape) = (
                        (values[0], values[1:]) if slot == "A" else (None, values)
                    )
                    words = " ".join(w for w in (size, colour, shape) if w)
                    assert article in (None, "an" if words[0] in "aeiou" else "a"), text
                    objects.append(
                        ObjectRef(
                            shape=None if shape == "object" else self.shapes.index(shape),
                            colour=None if colour is None else self.colours.index(colour),
                            size=None if size is None else SIZES.index(size),
                        )
                    )
                elif slot == "C":
                    objects[-1] = dataclasses.replace(objects[-1], cell=CELL_PHRASES.index(values[0]))
                elif slot == "R":
                    relation = self.relations[values[0]]
                else:
                    count = _NUMBERS.index(values[0])
            return CaptionSpec(tuple(objects), relation, count)
        raise AssertionError(f"no template reads {text!r}")


def test_the_grammar_reads_every_generated_caption(split):
    grammar = CaptionGrammar(CFG)
    for t, text in enumerate(split.captions):
        assert grammar.parse(text) == _spec_of(split.caption_specs, t), text


# -- hard negatives ------------------------------------------------------------------------------------------


def test_negatives_read_as_captions_of_their_spec_and_never_fit(split, negatives):
    grammar = CaptionGrammar(CFG)
    assert set(negatives.kind) == set(NEGATIVE_KINDS)
    for i in range(len(negatives)):
        assert grammar.parse(negatives.negative[i]) == _spec_of(negatives.negative_specs, i), (
            negatives.negative[i]
        )
        assert negatives.positive[i] == split.captions[negatives.caption[i]]
    assert np.array_equal(negatives.image, split.txt2img[negatives.caption])
    fits = evaluate_fits(negatives.negative_specs, split.scenes.take(negatives.image))
    assert not fits.any()


def _changed(pos: CaptionSpec, neg: CaptionSpec) -> list[tuple]:
    """The (slot, field) pairs whose value differs, ("relation",) and ("count",)."""
    out = [("relation",)] if pos.relation != neg.relation else []
    out += [("count",)] if pos.count != neg.count else []
    for j, (a, b) in enumerate(zip(pos.objects, neg.objects, strict=True)):
        out += [(j, f) for f in ("shape", "colour", "size", "cell") if getattr(a, f) != getattr(b, f)]
    return out


def test_each_negative_changes_exactly_one_fact(split, negatives):
    for i in range(len(negatives)):
        pos = _spec_of(split.caption_specs, int(negatives.caption[i]))
        neg = _spec_of(negatives.negative_specs, i)
        kind, detail, changed = negatives.kind[i], negatives.detail[i], _changed(pos, neg)
        assert len(neg.objects) == len(pos.objects)
        if kind == "attribute_swap":  # two slots exchange one attribute
            (a, fa), (b, fb) = changed
            assert fa == fb == detail in ("colour", "size")
            assert getattr(neg.objects[a], detail) == getattr(pos.objects[b], detail)
            assert getattr(neg.objects[b], detail) == getattr(pos.objects[a], detail)
        elif kind == "relation_swap":
            if detail == "opposite":
                assert changed == [("relation",)] and neg.relation == (1, 0, 3, 2)[pos.relation]
            else:
                assert neg.objects == pos.objects[::-1] and neg.relation == pos.relation
        elif kind == "object_replace":  # one attribute of one slot, to a value the caption never names
            ((j, field),) = changed
            assert field == detail in ("shape", "colour")
            assert getattr(neg.objects[j], field) not in {getattr(o, field) for o in pos.objects}
        else:
            assert changed == [("count",)] and 2 <= neg.count <= CFG.max_objects and pos.count >= 2


def test_negatives_are_deterministic_and_cover_every_caption_that_can_have_them(split, negatives):
    again = hard_negatives(split, CFG, seed=0)
    assert again.records() == negatives.records()
    other = hard_negatives(split, CFG, seed=1)
    assert other.negative != negatives.negative
    counts = negatives.counts()
    # every caption names an object with a shape or colour another value could replace
    assert counts["object_replace"] == len(split.captions)
    has_relation = int((split.caption_specs.relation >= 0).sum())
    assert 0.9 * has_relation <= counts["relation_swap"] <= has_relation
    assert counts["count_change"] == int((split.caption_specs.count >= 2).sum())
    only = hard_negatives(split, CFG, seed=0, kinds=("count_change",))
    assert set(only.kind) == {"count_change"} and len(only) == counts["count_change"]
    with pytest.raises(ValueError, match="unknown hard-negative kinds"):
        hard_negatives(split, CFG, kinds=("colour_swap",))


def test_a_candidate_that_still_fits_is_replaced_by_the_next_one():
    """The image: a small red circle (cell 0) left of a large blue square (cell 1), and below them a small
    blue circle (cell 3) left of a large red square (cell 4).

    For "a small red circle left of a large blue square" the colour swap "a small blue circle left of a
    large red square" still fits (cells 3 and 4), so whatever the candidate order the attribute swap kept
    is the size swap "a large red circle left of a small blue square". For "a red circle left of a blue
    square" the colour swap is the only candidate and it fits: that caption gets no attribute swap.
    """
    from types import SimpleNamespace

    from patchword.data.synthetic import CaptionTable, SceneTable

    red, blue, circle, square, small, large = 0, 2, 0, 1, 0, 1
    arrays = {k: np.full((1, 9), -1, np.int8) for k in ("shape", "colour", "size")}
    for cell, objs in {
        0: (circle, red, small),
        1: (square, blue, large),
        3: (circle, blue, small),
        4: (square, red, large),
    }.items():
        arrays["shape"][0, cell], arrays["colour"][0, cell], arrays["size"][0, cell] = objs
    scenes = SceneTable(**arrays)
    specs = [
        CaptionSpec((ObjectRef(circle, red, small), ObjectRef(square, blue, large)), relation=0),
        CaptionSpec((ObjectRef(circle, red), ObjectRef(square, blue)), relation=0),
    ]
    split = SimpleNamespace(
        scenes=scenes,
        captions=["a small red circle left of a large blue square", "a red circle left of a blue square"],
        caption_specs=CaptionTable.from_specs(specs),
        txt2img=np.zeros(2, np.int64),
    )
    assert evaluate_fits(CaptionTable.from_specs(specs), scenes.take([0, 0])).all()
    for seed in range(5):
        got = hard_negatives(split, CFG, seed=seed, kinds=("attribute_swap",))
        assert got.negative == ["a large red circle left of a small blue square"]
        assert got.caption.tolist() == [0] and got.detail == ["size"]


# -- accuracy under a model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suite():
    dataset = SyntheticScenes.generate(
        SyntheticConfig(seed=7, image_size=32, num_train=2, num_dev=2, num_test=30)
    )
    images, triples, dense = synthetic_suite(dataset, "test", seed=0)
    vocab = WordVocab.build(dataset["test"].captions + triples.negative + dense)
    return images, triples, dense, vocab


@pytest.mark.parametrize(
    "model_args",
    [
        dict(matcher="seps", variant="paper"),
        dict(matcher="seps", variant="code", dense_pairing="caption"),
        dict(matcher="laps", variant="code"),
        dict(matcher="vse"),
    ],
)
def test_accuracy_equals_the_full_score_matrix(suite, model_args):
    """Scoring only the asked pairs equals reading them off the full (images x texts) matrix."""
    images, triples, dense, vocab = suite
    model = tiny_model(vocab, **model_args)
    args = dict(max_caption_len=40, max_dense_len=160, dense_captions=dense, batch_size=8)
    pos, neg = score_triples(model, vocab, images, triples, **args)
    # reference: every image against every (image, text) of the suite, dense text of the text's image
    texts = triples.positive + triples.negative
    owner = np.concatenate([triples.image, triples.image])
    with torch.no_grad():
        img = encode_image_tokens(model, images)
        ids, lens = vocab.batch_encode(texts, max_len=40)
        cap = encode_text_tokens(model, ids, lens)
        dense_ids, dense_lens = vocab.batch_encode(dense, max_len=160)
        dense_tokens = encode_text_tokens(model, dense_ids, dense_lens)
        full = score_matrix(
            model.matcher, img, cap, lens, dense_tokens, dense_lens, txt2img=owner, engine="forward"
        )
    m = len(triples)
    ref_pos = full[triples.image, torch.arange(m)]
    ref_neg = full[triples.image, m + torch.arange(m)]
    assert torch.allclose(pos, ref_pos, atol=1e-5) and torch.allclose(neg, ref_neg, atol=1e-5)
    result = compositional_accuracy(model, vocab, images, triples, **args)
    correct = (ref_pos > ref_neg).numpy()
    for kind in NEGATIVE_KINDS:
        picked = np.array(triples.kind) == kind
        assert result["n"][kind] == int(picked.sum()) > 0
        assert result[kind] == pytest.approx(100.0 * correct[picked].mean())
    assert list(result) == [*NEGATIVE_KINDS, "n"]


class _Constant(Matcher):
    """Every pair scores 0: a model that cannot tell any caption from another."""

    consumes_dense = False
    embed_dim = 3

    def forward(self, img, cap, cap_lens, dense=None, dense_lens=None):
        return MatcherOutput(sims=torch.zeros(img.shape[0], cap.shape[0]))


class _ConstantModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.matcher = _Constant()

    def encode_images(self, images):
        return images.flatten(2).transpose(1, 2)[:, :4]

    def encode_texts(self, ids, lens):
        return torch.zeros(ids.shape[0], ids.shape[1], 3)


def test_ties_count_as_wrong(suite):
    images, triples, dense, vocab = suite
    result = compositional_accuracy(_ConstantModel(), vocab, images, triples, max_caption_len=40)
    assert all(result[k] == 0.0 for k in NEGATIVE_KINDS)


class _NaNModel(_ConstantModel):
    """A broken model: its matcher scores every pair NaN (a diverged checkpoint)."""

    def __init__(self) -> None:
        super().__init__()
        self.matcher.forward = lambda img, cap, *a, **k: MatcherOutput(
            sims=torch.full((img.shape[0], cap.shape[0]), float("nan"))
        )


def test_nan_scores_are_refused_not_counted_wrong(suite):
    """Bug: NaN > x is False, so a NaN-scoring model read as 0.0% correct over the full n of every kind,
    a plausible number; now a ValueError names the non-finite scores."""
    images, triples, dense, vocab = suite
    with pytest.raises(ValueError, match=r"true caption scores of \d+ of \d+ triple\(s\) are not finite"):
        compositional_accuracy(_NaNModel(), vocab, images, triples, max_caption_len=40)


def test_format_tables():
    result = {"attribute_swap": 61.25, "relation_swap": None, "n": {"attribute_swap": 8, "relation_swap": 0}}
    table = format_compositional_table(result)
    assert "attribute_swap" in table and "61.2" in table and re.search(r"relation_swap\s+-\s+0", table)
    both = format_compositional_comparison({"vse": result, "seps": {**result, "attribute_swap": 75.0}})
    row = next(line for line in both.splitlines() if line.startswith("attribute_swap"))
    assert row.split() == ["attribute_swap", "61.2", "75.0", "8"]


# -- SugarCrepe-style files over real image files ------------------------------------------------------------


def _write_images(directory, n):
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), np.uint8)).save(directory / f"{i:012d}.jpg")


def test_sugarcrepe_files_are_read_and_scored_like_the_model_forward(tmp_path, suite):
    _, _, _, vocab = suite
    _write_images(tmp_path, 3)
    own = {
        "0": {"filename": "000000000000.jpg", "caption": "a red circle", "negative_caption": "a blue circle"},
        "1": {
            "filename": "000000000001.jpg",
            "caption": "a large square",
            "negative_caption": "a small square",
        },
    }
    (tmp_path / "replace_att.json").write_text(json.dumps(own))  # SugarCrepe's own format
    listed = [
        {
            "filename": "000000000001.jpg",
            "caption": "a circle left of a square",
            "negative_caption": "a square left of a circle",
        },
        {"filename": "000000000002.jpg", "caption": "a green cross", "negative_caption": "a green diamond"},
    ]
    (tmp_path / "swap_obj.json").write_text(json.dumps(listed))  # a plain list
    paths, triples = read_sugarcrepe([tmp_path / "replace_att.json", tmp_path / "swap_obj.json"])
    assert [p.name for p in paths] == [f"{i:012d}.jpg" for i in range(3)]
    assert triples.image.tolist() == [0, 1, 1, 2] and triples.kinds == ("replace_att", "swap_obj")
    model = tiny_model(vocab, matcher="laps", variant="code")
    from patchword.data.transforms import test_transform

    transform = test_transform(32)
    source = FileImageSource(paths, transform)
    pos, neg = score_triples(model, vocab, source, triples, max_caption_len=40)
    with torch.no_grad():  # the model's own forward, one triple at a time
        for m in range(len(triples)):
            image = transform(Image.open(paths[triples.image[m]]).convert("RGB"))[None]
            ids, lens = vocab.batch_encode([triples.positive[m], triples.negative[m]], max_len=40)
            sims = model(image, ids, lens).sims[0]
            assert torch.allclose(torch.stack([pos[m], neg[m]]), sims, atol=1e-5)
    result = compositional_accuracy(model, vocab, source, triples, max_caption_len=40)
    assert result["n"] == {"replace_att": 2, "swap_obj": 2}
    assert result["replace_att"] == 50.0 * float((pos[:2] > neg[:2]).sum())


def test_sugarcrepe_errors_name_the_file_and_record(tmp_path):
    _write_images(tmp_path, 1)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"7": {"filename": "000000000000.jpg", "caption": "x"}}))
    with pytest.raises(DataError, match=r"bad.json: record 7 has no 'negative_caption'"):
        read_sugarcrepe(bad)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps([{"filename": "nope.jpg", "caption": "a", "negative_caption": "b"}]))
    with pytest.raises(MissingFileError, match="nope.jpg"):
        read_sugarcrepe(missing)
    (tmp_path / "img").mkdir()
    _write_images(tmp_path / "img", 1)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(
        json.dumps([{"filename": "000000000000.jpg", "caption": "a", "negative_caption": "b"}])
    )
    paths, _ = read_sugarcrepe(elsewhere, image_root=tmp_path / "img")
    assert paths == [tmp_path / "img" / "000000000000.jpg"]
    with pytest.raises(ValueError, match="not among the reported kinds"):
        CompositionalTriples(np.zeros(1), ["a"], ["b"], ["k"], ("other",))


def test_a_sugarcrepe_file_opening_with_a_byte_order_mark_is_read(tmp_path):
    """The README says a UTF-8 byte order mark is skipped; a SugarCrepe file saved with one (as Windows
    editors save) was "not a JSON file"."""
    _write_images(tmp_path, 1)
    record = [
        {"filename": "000000000000.jpg", "caption": "a red circle", "negative_caption": "a blue circle"}
    ]
    marked = tmp_path / "swap_att.json"
    marked.write_text(json.dumps(record), encoding="utf-8-sig")
    _, triples = read_sugarcrepe(marked)
    assert triples.positive == ["a red circle"] and triples.negative == ["a blue circle"]
