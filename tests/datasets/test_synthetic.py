"""Synthetic scenes: determinism, the fits relation, oracle recall, noise, rendering and the cache."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from patchword.data import synthetic as syn
from patchword.data.synthetic import (
    CELL_NAMES,
    CELL_PHRASES,
    COLOURS,
    RELATIONS,
    SIZES,
    CaptionSpec,
    CaptionTable,
    FitsOracle,
    ObjectRef,
    SceneTable,
    SyntheticConfig,
    SyntheticScenes,
    generate_split,
    oracle_metrics,
    render_scenes,
)

SMALL = SyntheticConfig(seed=3, num_train=80, num_dev=30, num_test=40)
# Few shapes and colours and many dropped attributes: lots of captions fit several images, which is
# what the fits tests need to be meaningful.
AMBIGUOUS = SyntheticConfig(
    seed=5,
    shapes=("circle", "square"),
    colours=("red", "blue"),
    partial_attr_prob=0.6,
    num_train=20,
    num_dev=20,
    num_test=150,
)
RED, BLUE = 0, 2  # indices into the default colours
CIRCLE, SQUARE = 0, 1
SMALL_SIZE, LARGE = 0, 1


@pytest.fixture(scope="module")
def small() -> SyntheticScenes:
    return SyntheticScenes.generate(SMALL)


def scene_table(scenes: list[list[tuple[int, int, int, int]]]) -> SceneTable:
    """Scenes from lists of (cell, shape, colour, size)."""
    arrays = {k: np.full((len(scenes), 9), -1, np.int8) for k in ("shape", "colour", "size")}
    for i, objs in enumerate(scenes):
        for cell, shape, colour, size in objs:
            arrays["shape"][i, cell], arrays["colour"][i, cell], arrays["size"][i, cell] = shape, colour, size
    return SceneTable(**arrays)


def caption_specs(table: CaptionTable) -> list[CaptionSpec]:
    """Unpack a caption table back into specs."""

    def opt(v: int) -> int | None:
        return None if v < 0 else int(v)

    specs = []
    for t in range(len(table)):
        objs = tuple(
            ObjectRef(
                opt(table.shape[t, s]), opt(table.colour[t, s]), opt(table.size[t, s]), opt(table.cell[t, s])
            )
            for s in np.flatnonzero(table.used[t])
        )
        specs.append(CaptionSpec(objs, opt(table.relation[t]), opt(table.count[t])))
    return specs


def reference_fits(spec: CaptionSpec, objs: list[tuple[int, int, int, int]]) -> bool:
    """The fits relation by brute force: try every assignment of caption objects to distinct scene objects."""
    if spec.count is not None and spec.count != len(objs):
        return False

    def agrees(ref: ObjectRef, obj: tuple[int, int, int, int]) -> bool:
        wanted = (ref.cell, ref.shape, ref.colour, ref.size)
        return all(w is None or w == v for w, v in zip(wanted, obj, strict=True))

    for chosen in itertools.permutations(objs, len(spec.objects)):
        if not all(agrees(r, o) for r, o in zip(spec.objects, chosen, strict=True)):
            continue
        if spec.relation is None:
            return True
        (ra, ca), (rb, cb) = divmod(chosen[0][0], 3), divmod(chosen[1][0], 3)
        holds = {"left of": ca < cb, "right of": ca > cb, "above": ra < rb, "below": ra > rb}
        if holds[RELATIONS[spec.relation]]:
            return True
    return False


# -- generation ------------------------------------------------------------------------------------------


def test_split_shapes_and_ids(small: SyntheticScenes) -> None:
    for name, n in (("train", 80), ("dev", 30), ("test", 40)):
        split = small.split(name)
        assert split.images.shape == (n, 64, 64, 3) and split.images.dtype == np.uint8
        assert len(split.captions) == 5 * n and len(split.dense_captions) == n
        np.testing.assert_array_equal(split.txt2img, np.repeat(np.arange(n), 5))
        assert split.image_ids[12] == f"syn-{name}-000012"
    assert small.split("train").fits is None
    assert small.split("test").fits.shape == (200, 40)
    assert small.split("test") is small.split("test")  # built once


def test_same_config_gives_identical_data(small: SyntheticScenes) -> None:
    again = generate_split(SMALL, "dev")
    ref = small["dev"]
    np.testing.assert_array_equal(again.images, ref.images)
    assert again.captions == ref.captions and again.dense_captions == ref.dense_captions
    assert again.scenes == ref.scenes and again.caption_specs == ref.caption_specs
    assert again.dense_specs == ref.dense_specs
    other = generate_split(SyntheticConfig(seed=4, num_dev=30), "dev")
    assert other.captions != ref.captions and not np.array_equal(other.images, ref.images)


def test_split_does_not_depend_on_other_split_sizes(small: SyntheticScenes) -> None:
    resized = generate_split(SyntheticConfig(seed=3, num_train=7, num_dev=30, num_test=40), "test")
    assert resized.captions == small["test"].captions
    np.testing.assert_array_equal(resized.images, small["test"].images)


def test_scene_content_respects_config(small: SyntheticScenes) -> None:
    scenes = small["train"].scenes
    occupied = scenes.shape >= 0
    np.testing.assert_array_equal(occupied, scenes.colour >= 0)
    np.testing.assert_array_equal(occupied, scenes.size >= 0)
    assert set(np.unique(scenes.count)) == {1, 2, 3, 4}
    assert scenes.shape.max() == 4 and scenes.colour.max() == 7 and scenes.size.max() == 1


def test_captions_say_what_their_specs_assert(small: SyntheticScenes) -> None:
    split = small["test"]
    for text, spec in zip(split.captions, caption_specs(split.caption_specs), strict=True):
        for ref in spec.objects:
            words = [
                SIZES[ref.size] if ref.size is not None else "",
                SMALL.colours[ref.colour] if ref.colour is not None else "",
                SMALL.shapes[ref.shape] if ref.shape is not None else "object",
            ]
            assert " ".join(w for w in words if w) in text
            if ref.cell is not None:
                assert CELL_PHRASES[ref.cell] in text
        if spec.relation is not None:
            rel = RELATIONS[spec.relation]
            assert rel in text or (rel == "below" and " under " in text)
        if spec.count is not None:
            words = ("one single alone just", "two", "three", "four")[spec.count - 1].split()
            assert set(words) & set(text.split())
        assert 4 <= len(text.split()) <= 16


def test_partial_attributes_follow_config() -> None:
    def wildcard_rate(p: float) -> float:
        specs = generate_split(SyntheticConfig(num_test=300, partial_attr_prob=p), "test").caption_specs
        # sizes are left out on purpose where positions are given, so only shape and colour count
        attrs = np.stack([specs.shape, specs.colour])[:, specs.used]
        return float((attrs < 0).any(0).mean())

    assert wildcard_rate(0.0) == 0.0
    # Shape or colour is the dropped attribute 2/3 of the time, and some templates always name every
    # attribute, so the rate sits below p * 2/3 but clearly above 0.
    assert 0.15 < wildcard_rate(0.5) < 0.5 * 2 / 3


# -- dense captions --------------------------------------------------------------------------------------


def test_dense_noise_rates_match_config() -> None:
    config = SyntheticConfig(num_test=1000, dense_omit_prob=0.3, dense_wrong_attr_prob=0.2)
    split = generate_split(config, "test")
    scenes, dense = split.scenes, split.dense_specs
    occupied = scenes.shape >= 0
    assert not (dense.mentioned & ~occupied).any()  # omissions only, never invented objects
    assert dense.mentioned.any(1).all()  # something is always described
    four = scenes.count == 4  # the "keep at least one" rule barely matters here (0.3 ** 4)
    omitted = 1 - dense.mentioned[four].sum() / occupied[four].sum()
    assert abs(omitted - 0.3) < 0.05
    said = dense.mentioned
    truth = np.stack([scenes.shape, scenes.colour, scenes.size])[:, said]  # (3, n_mentioned)
    described = np.stack([dense.shape, dense.colour, dense.size])[:, said]
    differs = truth != described
    wrong = dense.wrong[said]
    assert abs((wrong >= 0).mean() - 0.2) < 0.03
    # exactly the recorded attribute is wrong, and nothing else
    expected = np.zeros_like(differs)
    expected[wrong[wrong >= 0], np.flatnonzero(wrong >= 0)] = True
    np.testing.assert_array_equal(differs, expected)


def test_dense_caption_text(small: SyntheticScenes) -> None:
    split = small["test"]
    dense = split.dense_specs
    for i, text in enumerate(split.dense_captions):
        assert 30 <= len(text.split()) <= 100, text
        assert text.startswith(("The image", "This picture", "In this image"))
        for cell in np.flatnonzero(dense.mentioned[i]):
            size, colour, shape = dense.size[i, cell], dense.colour[i, cell], dense.shape[i, cell]
            assert f"{SIZES[size]} {SMALL.colours[colour]} {SMALL.shapes[shape]}" in text
            assert CELL_NAMES[cell] in text
        n = int(dense.mentioned[i].sum())
        assert ("a single object" if n == 1 else f"{('two', 'three', 'four')[n - 2]} objects") in text


def test_noise_free_dense_captions_describe_every_object() -> None:
    split = generate_split(SyntheticConfig(num_test=50, dense_omit_prob=0, dense_wrong_attr_prob=0), "test")
    np.testing.assert_array_equal(split.dense_specs.mentioned, split.scenes.shape >= 0)
    assert (split.dense_specs.wrong == -1).all()
    np.testing.assert_array_equal(split.dense_specs.colour, split.scenes.colour)


# -- the fits relation -----------------------------------------------------------------------------------


def test_hand_made_scene_fits() -> None:
    scenes = scene_table(
        [
            [(0, CIRCLE, RED, LARGE), (4, SQUARE, BLUE, SMALL_SIZE)],  # red circle top left, square centre
            [(8, CIRCLE, RED, LARGE), (0, SQUARE, BLUE, SMALL_SIZE)],  # mirrored
            [(4, CIRCLE, RED, LARGE)],  # a lone circle in the centre
        ]
    )
    circle = ObjectRef(shape=CIRCLE, colour=RED, size=LARGE)
    square = ObjectRef(shape=SQUARE, colour=BLUE, size=SMALL_SIZE)
    rel = RELATIONS.index
    captions = [
        (CaptionSpec((circle, square), relation=rel("left of")), [1, 0, 0]),
        (CaptionSpec((circle, square), relation=rel("above")), [1, 0, 0]),
        (CaptionSpec((circle, square), relation=rel("below")), [0, 1, 0]),
        (CaptionSpec((square, circle), relation=rel("left of")), [0, 1, 0]),
        (CaptionSpec((circle, square), count=2), [1, 1, 0]),
        (CaptionSpec((circle,), count=1), [0, 0, 1]),
        (CaptionSpec((ObjectRef(colour=RED, cell=4),)), [0, 0, 1]),
        (CaptionSpec((ObjectRef(shape=CIRCLE),)), [1, 1, 1]),
        # the same object cannot be counted twice
        (CaptionSpec((ObjectRef(colour=RED), ObjectRef(shape=CIRCLE))), [0, 0, 0]),
        (CaptionSpec((ObjectRef(size=SMALL_SIZE), ObjectRef(size=LARGE))), [1, 1, 0]),
        (CaptionSpec((ObjectRef(), ObjectRef(), ObjectRef())), [0, 0, 0]),
        (CaptionSpec((ObjectRef(colour=BLUE, size=LARGE),)), [0, 0, 0]),
    ]
    oracle = FitsOracle(CaptionTable.from_specs([c for c, _ in captions]), scenes)
    np.testing.assert_array_equal(oracle.matrix(), np.array([e for _, e in captions], bool))


def test_caption_spec_validation() -> None:
    with pytest.raises(ValueError, match="exactly two"):
        CaptionSpec((ObjectRef(),), relation=0)
    with pytest.raises(ValueError, match="1..3"):
        CaptionSpec(())


def test_oracle_agrees_with_brute_force() -> None:
    split = generate_split(AMBIGUOUS, "test")
    fits = split.oracle.matrix()
    specs = caption_specs(split.caption_specs)
    objects = [split.scenes.objects(i) for i in range(len(split.scenes))]
    rng = np.random.default_rng(0)
    for t in rng.choice(len(specs), 80, replace=False):
        expected = [reference_fits(specs[t], objs) for objs in objects]
        np.testing.assert_array_equal(fits[t], expected, err_msg=split.captions[t])
    assert fits.sum(1).mean() > 2  # the config really is ambiguous, so the comparison means something


def test_ground_truth_pairs_fit(small: SyntheticScenes) -> None:
    for name in ("dev", "test"):
        split = small.split(name)
        assert split.fits[np.arange(len(split.captions)), split.txt2img].all()
    train = small["train"]
    assert train.oracle.pairs(np.arange(len(train.captions)), train.txt2img).all()


def test_fits_submatrix_matches_full_matrix(small: SyntheticScenes) -> None:
    oracle = small.oracle("train")
    full = oracle.matrix(chunk_size=37)
    rng = np.random.default_rng(1)
    cap, img = rng.integers(0, 400, 50), rng.integers(0, 80, 30)
    np.testing.assert_array_equal(small.fits("train", cap, img), full[np.ix_(cap, img)])
    np.testing.assert_array_equal(oracle.pairs(cap[:30], img), full[cap[:30], img])


def test_a_batch_query_is_one_vectorised_kernel_call(monkeypatch) -> None:
    """A B x B batch query (the false-negative mask of a training batch) is one call of the packed-code
    kernel over the whole (B, B) block, not a loop over pairs or rows, and equals the full matrix there.
    How long the call takes is machine-dependent: measured by ``benchmarks/fits_oracle_speed.py``."""
    from patchword.data.synthetic import fits as fits_module

    split = generate_split(SyntheticConfig(num_test=1000), "test")
    oracle = split.oracle
    rng = np.random.default_rng(2)
    cap, img = rng.integers(0, 5000, 128), rng.integers(0, 1000, 128)
    full = oracle.matrix()
    calls = []
    kernel = fits_module._fits_kernel

    def counted(forbidden, used, relation, count, codes):
        out = kernel(forbidden, used, relation, count, codes)
        calls.append(out.shape)
        return out

    monkeypatch.setattr(fits_module, "_fits_kernel", counted)
    np.testing.assert_array_equal(oracle(cap, img), full[np.ix_(cap, img)])
    assert calls == [(128, 128)]


# -- oracle recall ---------------------------------------------------------------------------------------


def brute_force_oracle(fits: np.ndarray, txt2img: np.ndarray, k: int) -> tuple[float, float]:
    """Exact expected recall@k by enumerating every order of the fitting items."""

    def expected_hit(fitting: np.ndarray, relevant: set[int]) -> float:
        orders = list(itertools.permutations(fitting))
        return float(np.mean([bool(relevant & set(order[:k])) for order in orders]))

    i2t = [
        expected_hit(np.flatnonzero(fits[:, v]), set(np.flatnonzero(txt2img == v)))
        for v in range(fits.shape[1])
    ]
    t2i = [expected_hit(np.flatnonzero(fits[t]), {int(txt2img[t])}) for t in range(fits.shape[0])]
    return 100 * float(np.mean(i2t)), 100 * float(np.mean(t2i))


def test_oracle_metrics_matches_enumeration() -> None:
    rng = np.random.default_rng(0)
    n_img, per = 4, 2
    txt2img = np.repeat(np.arange(n_img), per)
    fits = rng.random((n_img * per, n_img)) < 0.5
    fits[np.arange(len(txt2img)), txt2img] = True
    metrics = oracle_metrics(fits, txt2img, ks=(1, 2, 3))
    for k in (1, 2, 3):
        i2t, t2i = brute_force_oracle(fits, txt2img, k)
        assert metrics[f"i2t_r{k}"] == pytest.approx(i2t)
        assert metrics[f"t2i_r{k}"] == pytest.approx(t2i)
    assert metrics["rsum"] == pytest.approx(sum(v for key, v in metrics.items() if key != "rsum"))


def test_oracle_metrics_hand_case() -> None:
    # image 0 fits all 4 captions (2 its own), image 1 fits only its own two; caption 0 fits both images.
    txt2img = np.array([0, 0, 1, 1])
    fits = np.array([[1, 1], [1, 0], [1, 1], [1, 1]], bool)
    m = oracle_metrics(fits, txt2img)
    # i2t@1: image 0: 2 of its 4 fitting captions are GT -> 1/2; image 1: 2/3 -> mean 7/12
    assert m["i2t_r1"] == pytest.approx(100 * 7 / 12)
    assert m["i2t_r5"] == m["i2t_r10"] == 100
    # t2i@1: captions fit 2, 1, 2, 2 images -> (1/2 + 1 + 1/2 + 1/2) / 4
    assert m["t2i_r1"] == pytest.approx(62.5)
    assert set(m) == {"i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"}


def test_oracle_metrics_rejects_missing_ground_truth() -> None:
    with pytest.raises(ValueError, match="ground-truth"):
        oracle_metrics(np.zeros((2, 2), bool), np.array([0, 1]))
    with pytest.raises(ValueError, match="txt2img"):
        oracle_metrics(np.ones((2, 2), bool), np.array([0]))


def test_default_test_split_is_discriminative() -> None:
    split = generate_split(SyntheticConfig(), "test")
    fits = split.oracle.matrix()
    metrics = oracle_metrics(fits, split.txt2img)
    assert metrics["rsum"] >= 500  # measured 560.2
    assert fits.sum(1).mean() < 2.0  # measured 1.42 fitting images per caption
    per_image = np.array(split.captions).reshape(-1, 5)
    assert np.mean([len(set(row)) == 5 for row in per_image]) > 0.99
    lengths = [len(c.split()) for c in split.captions]
    assert min(lengths) >= 4 and max(lengths) <= 16


# -- rendering -------------------------------------------------------------------------------------------


def test_render_puts_objects_in_their_cells() -> None:
    config = SyntheticConfig(pixel_noise=0.0, jitter=0.0)
    scenes = scene_table([[(0, CIRCLE, RED, LARGE), (4, SQUARE, BLUE, SMALL_SIZE), (8, 4, 7, LARGE)]])
    image = render_scenes(scenes, config, np.random.default_rng(0))[0]
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    cell = 21
    for c, colour in ((0, "red"), (4, "blue"), (8, "black")):
        r, k = divmod(c, 3)
        centre = image[r * cell + cell // 2, k * cell + cell // 2]
        np.testing.assert_array_equal(centre, COLOURS[colour])
    empty = image[:cell, cell : 2 * cell]  # top middle
    assert (empty == np.array(config.background, np.uint8)).all()

    def area(c: int) -> int:
        r, k = divmod(c, 3)
        patch = image[r * cell : (r + 1) * cell, k * cell : (k + 1) * cell]
        return int((patch != np.array(config.background, np.uint8)).any(-1).sum())

    assert area(0) > 2.5 * area(4)  # large vs small are clearly different


def test_pixel_noise_is_mild(small: SyntheticScenes) -> None:
    images = small["test"].images
    corner = images[:, -1, -1].astype(float)  # the unused bottom/right margin pixel is background
    assert abs(corner.mean() - 210) < 1 and 1 < corner.std() < 6


# -- cache -----------------------------------------------------------------------------------------------


def test_cache_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = SyntheticConfig(seed=9, num_train=12, num_dev=6, num_test=8)
    first = SyntheticScenes.load_or_generate(config, tmp_path)
    target = tmp_path / f"synthetic-{config.cache_key()}"
    assert (target / "config.json").exists() and (target / "test_images.npy").exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temp dirs left behind

    def no_generation(*args, **kwargs):
        raise AssertionError("should load from the cache")

    monkeypatch.setattr(SyntheticScenes, "generate", no_generation)
    second = SyntheticScenes.load_or_generate(config, tmp_path)
    for name in syn.SPLITS:
        a, b = first[name], second[name]
        np.testing.assert_array_equal(a.images, b.images)
        np.testing.assert_array_equal(a.txt2img, b.txt2img)
        assert a.captions == b.captions and a.dense_captions == b.dense_captions
        assert a.scenes == b.scenes and a.caption_specs == b.caption_specs and a.dense_specs == b.dense_specs
    np.testing.assert_array_equal(first.split("dev").fits, second.split("dev").fits)


def test_cache_key_and_default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert SyntheticConfig().cache_key() == SyntheticConfig().cache_key()
    assert SyntheticConfig(seed=1).cache_key() != SyntheticConfig().cache_key()
    monkeypatch.setenv("PATCHWORD_CACHE", str(tmp_path))
    assert syn.default_cache_dir() == tmp_path / "synthetic"
    monkeypatch.delenv("PATCHWORD_CACHE")
    assert syn.default_cache_dir() == Path.home() / ".cache" / "patchword" / "synthetic"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_objects": 0}, "min_objects"),
        ({"max_objects": 10}, "max_objects"),
        ({"min_objects": 3, "max_objects": 2}, "max_objects"),
        ({"shapes": ("circle", "hexagon")}, "shapes"),
        ({"colours": ("red",)}, "colours"),
        ({"dense_omit_prob": 1.5}, "dense_omit_prob"),
        ({"captions_per_image": 6}, "captions_per_image"),
        ({"num_test": 0}, "num_test"),
    ],
)
def test_config_validation(kwargs: dict, field: str) -> None:
    """Each bad value is refused with a message that starts with the field it is in."""
    with pytest.raises(ValueError, match=rf"^{field}: "):
        SyntheticConfig(**kwargs)


def test_unknown_split_name(small: SyntheticScenes) -> None:
    with pytest.raises(KeyError, match="val"):
        small.split("val")
