"""COCO extended metrics (ECCV Caption, CxC, COCO 1K/5K): equal to the eccv_caption package, and by hand.

Over 400 lines: every metric against the package and by hand shares one random COCO-shaped universe.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from patchword.errors import ConfigError, DataError, MissingExtraError
from patchword.eval.coco_extended import (
    COCO_EXTENDED_METRICS,
    CocoGroundTruth,
    coco_extended_metrics,
    coco_extended_percent,
)
from patchword.eval.metrics import retrieval_metrics
from project_paths import SHARED_DATA

pytestmark = pytest.mark.usefixtures("one_thread")

SHARED_COCO = SHARED_DATA / "coco_5k_test"


def _write_truth(directory: Path, image_ids, caption_ids, positives: dict) -> Path:
    """ECCV Caption's file layout: {source}_{image_to_caption,caption_to_image}.json + coco_test_ids.npy."""
    directory.mkdir(parents=True, exist_ok=True)
    for source, (i2t, t2i) in positives.items():
        (directory / f"{source}_image_to_caption.json").write_text(
            json.dumps({str(k): v for k, v in i2t.items()})
        )
        (directory / f"{source}_caption_to_image.json").write_text(
            json.dumps({str(k): v for k, v in t2i.items()})
        )
    np.save(directory / "coco_test_ids.npy", np.asarray(caption_ids, np.int64))
    return directory


def _random_universe(directory: Path, n_img: int = 40, seed: int = 0):
    """A COCO-shaped universe (5 captions per image, five folds) with random CxC, ECCV and PM positives."""
    rng = np.random.default_rng(seed)
    image_ids = [int(i) for i in rng.choice(10**6, n_img, replace=False)]
    caption_ids = [int(c) for c in rng.choice(10**6, 5 * n_img, replace=False) + 10**6]
    owner = {c: image_ids[j // 5] for j, c in enumerate(caption_ids)}
    own = {i: caption_ids[5 * n : 5 * n + 5] for n, i in enumerate(image_ids)}

    def extended(query_share: float, extra: int, absent: bool):
        i2t, t2i = {}, {}
        for i in image_ids:
            if rng.random() < query_share:
                more = [int(c) for c in rng.choice(caption_ids, rng.integers(0, extra + 1), replace=False)]
                i2t[i] = list(dict.fromkeys(own[i] + more + ([7] if absent and rng.random() < 0.2 else [])))
        for c in caption_ids:
            if rng.random() < query_share:
                more = [int(i) for i in rng.choice(image_ids, rng.integers(0, extra + 1), replace=False)]
                t2i[c] = list(dict.fromkeys([owner[c], *more]))
        return i2t, t2i

    positives = {
        "original": (own, {c: [owner[c]] for c in caption_ids}),
        "cxc": extended(0.95, 3, absent=False),
        "eccv": extended(0.3, 8, absent=True),
        "pm": extended(0.5, 4, absent=False),
    }
    _write_truth(directory, image_ids, caption_ids, positives)
    return image_ids, caption_ids


def _eccv_package(directory: Path):
    """eccv_caption.Metrics reading the positives of ``directory`` instead of its own data."""
    eccv_caption = pytest.importorskip("eccv_caption")
    metrics = eccv_caption.Metrics()
    for source, setter in (
        ("original", metrics.set_coco_gts),
        ("cxc", metrics.set_cxc_gts),
        ("eccv", metrics.set_eccv_gts),
        ("pm", metrics.set_pm_gts),
    ):
        setter(
            str(directory / f"{source}_image_to_caption.json"),
            str(directory / f"{source}_caption_to_image.json"),
        )
    metrics.coco_ids = np.load(directory / "coco_test_ids.npy")
    return metrics


def _retrieved(sims: np.ndarray, image_ids, caption_ids):
    """What eccv_caption takes: every query's candidates sorted by decreasing similarity."""
    i2t = {i: [caption_ids[j] for j in np.argsort(-sims[n], kind="stable")] for n, i in enumerate(image_ids)}
    t2i = {
        c: [image_ids[j] for j in np.argsort(-sims[:, n], kind="stable")] for n, c in enumerate(caption_ids)
    }
    return i2t, t2i


@pytest.fixture(scope="module")
def universe(tmp_path_factory):
    directory = tmp_path_factory.mktemp("eccv")
    image_ids, caption_ids = _random_universe(directory)
    sims = np.random.default_rng(1).standard_normal((len(image_ids), len(caption_ids))).astype(np.float32)
    return directory, image_ids, caption_ids, sims


@pytest.mark.parametrize(
    "metrics",
    [
        ("coco_1k_r1", "coco_5k_r1", "cxc_r1", "eccv_r1", "eccv_map_at_r"),  # the package's default
        ("coco_1k_recalls", "coco_5k_recalls", "cxc_recalls", "eccv_r1", "eccv_rprecision", "eccv_map_at_r"),
        ("eccv_recalls",),
    ],
)
def test_equals_the_eccv_caption_package_on_a_random_matrix(universe, metrics):
    directory, image_ids, caption_ids, sims = universe
    package = _eccv_package(directory)
    i2t, t2i = _retrieved(sims, image_ids, caption_ids)
    expected = package.compute_all_metrics(i2t, t2i, target_metrics=metrics, Ks=(1, 5, 10))
    # shuffled rows and columns: the result must follow the ids, not the positions
    rng = np.random.default_rng(2)
    rows, cols = rng.permutation(len(image_ids)), rng.permutation(len(caption_ids))
    got = coco_extended_metrics(
        torch.from_numpy(sims[rows][:, cols]),
        np.asarray(image_ids)[rows],
        np.asarray(caption_ids)[cols],
        metrics=metrics,
        ks=(1, 5, 10),
        ground_truth=directory,
    )
    assert got.keys() == expected.keys()
    for name, values in expected.items():
        assert got[name] == pytest.approx(values, abs=1e-12), name
    assert any(0 < v < 1 for values in got.values() for v in values.values())  # not a degenerate case


def test_pmrp_and_rprecision_alone_equal_the_package(universe):
    directory, image_ids, caption_ids, sims = universe
    package = _eccv_package(directory)
    i2t, t2i = _retrieved(sims, image_ids, caption_ids)
    retrieved = {"i2t": i2t, "t2i": t2i}
    got = coco_extended_metrics(
        sims, image_ids, caption_ids, metrics=("pmrp", "eccv_rprecision"), ground_truth=directory
    )
    assert got["pmrp"] == pytest.approx(package.pmrp(retrieved, "all"), abs=1e-12)
    # the package returns eccv_rprecision only alongside eccv_map_at_r (a typo in its check)
    both = package.compute_all_metrics(i2t, t2i, target_metrics=("eccv_rprecision", "eccv_map_at_r"))
    assert got["eccv_rprecision"] == pytest.approx(both["eccv_rprecision"], abs=1e-12)


def test_coco_5k_recalls_equal_the_library_recalls_with_ties(universe):
    """COCO's own positives are the split's ground truth: R@K must equal retrieval_metrics, ties included
    (both rank a positive tied with a negative behind it)."""
    directory, image_ids, caption_ids, _ = universe
    sims = np.random.default_rng(3).integers(0, 4, (len(image_ids), len(caption_ids))).astype(np.float32)
    got = coco_extended_metrics(
        sims, image_ids, caption_ids, metrics=("coco_5k_recalls",), ground_truth=directory
    )
    ref = retrieval_metrics(torch.from_numpy(sims), np.arange(len(caption_ids)) // 5)
    for k in (1, 5, 10):
        assert 100 * got[f"coco_5k_r{k}"]["i2t"] == pytest.approx(ref[f"i2t_r{k}"])
        assert 100 * got[f"coco_5k_r{k}"]["t2i"] == pytest.approx(ref[f"t2i_r{k}"])


def test_hand_computed_case(tmp_path):
    """Five images (one per 1K fold), captions c0..c24 (c5i..c5i+4 of image i) and hand-made positives.

    Image 0 ranks its captions c1 > c9 > c3 > c0 > ...; its ECCV positives are c1, c3 and c99 (absent):
    positives at ranks 0 and 2, R = 3, so R@1 = 1, R-Precision = 2/3 (two positives in the top 3) and
    mAP@R = (1/1 + 2/3) / 3 = 5/9. Caption c9 ranks image 0 > image 1 > ...; its ECCV positives are images
    1 and 3: rank 1 and rank 4 (last), R = 2: R@1 = 0, R@5 = 1, R-Precision = 1/2, mAP@R = (0 + 1/2) / 2.
    """
    image_ids = [100, 101, 102, 103, 104]
    caption_ids = list(range(25))
    own = {100 + i: list(range(5 * i, 5 * i + 5)) for i in range(5)}
    truth = {
        "original": (own, {c: [100 + c // 5] for c in caption_ids}),
        "cxc": (own, {c: [100 + c // 5] for c in caption_ids}),
        "eccv": ({100: [1, 3, 99]}, {9: [101, 103]}),
    }
    directory = _write_truth(tmp_path / "gt", image_ids, caption_ids, truth)
    sims = np.zeros((5, 25), np.float32)
    sims[0, [1, 9, 3, 0]] = [4, 3, 2, 1]
    sims[:, 9] = [3, 2.5, 2, -1, 1]
    got = coco_extended_metrics(
        sims,
        image_ids,
        caption_ids,
        metrics=("eccv_recalls", "eccv_rprecision", "eccv_map_at_r"),
        ks=(1, 5),
        ground_truth=directory,
    )
    assert got["eccv_r1"] == {"i2t": 1.0, "t2i": 0.0}
    assert got["eccv_r5"] == {"i2t": 1.0, "t2i": 1.0}
    assert got["eccv_rprecision"] == pytest.approx({"i2t": 2 / 3, "t2i": 1 / 2})
    assert got["eccv_map_at_r"] == pytest.approx({"i2t": 5 / 9, "t2i": 1 / 4})
    flat = coco_extended_percent(got)
    assert flat["eccv_map_at_r_i2t"] == pytest.approx(500 / 9) and flat["eccv_r1_t2i"] == 0.0


def test_default_ground_truth_is_the_package_data():
    pytest.importorskip("eccv_caption")
    shipped = CocoGroundTruth.load()
    image_ids, caption_ids = shipped.standard_ids()
    assert image_ids.shape == (5000,) and caption_ids.shape == (25000,)
    assert image_ids[:3].tolist() == [391895, 60623, 483108]  # testall order (the data README)
    assert len(shipped.eccv["t2i"]) == 1332 and len(shipped.eccv["i2t"]) == 1261


def test_the_package_data_matches_the_shared_copy():
    """The shared data folder (../shared/data beside the project) is always there in CI: its absence fails."""
    pytest.importorskip("eccv_caption")
    assert SHARED_COCO.is_dir(), (
        f"{SHARED_COCO} is missing: the shared data folder must sit beside the project"
    )
    shipped, copy = CocoGroundTruth.load(), CocoGroundTruth.load(SHARED_COCO)
    assert copy.coco == shipped.coco and copy.eccv == shipped.eccv and copy.cxc == shipped.cxc
    assert np.array_equal(copy.coco_ids, shipped.coco_ids)
    # The standard order the ids give is the split's own list of image ids (coco5k_test_image_ids.txt).
    listed = np.loadtxt(SHARED_COCO / "coco5k_test_image_ids.txt", dtype=np.int64)
    image_ids, caption_ids = copy.standard_ids()
    assert np.array_equal(image_ids, listed) and np.array_equal(caption_ids, shipped.coco_ids)


def test_errors_name_the_problem(universe, monkeypatch):
    directory, image_ids, caption_ids, sims = universe
    with pytest.raises(ConfigError, match="unknown COCO extended metric"):
        coco_extended_metrics(sims, image_ids, caption_ids, metrics=("eccv_r2",), ground_truth=directory)
    # a subset of the images: the queries of the positives files are missing
    with pytest.raises(DataError, match="need the full COCO 5K"):
        coco_extended_metrics(sims[:10], image_ids[:10], caption_ids, ground_truth=directory)
    # a split read in another order than its ids
    wrong = (np.arange(len(caption_ids)) // 5 + 1) % len(image_ids)
    with pytest.raises(DataError, match="caption row 0"):
        coco_extended_metrics(sims, image_ids, caption_ids, ground_truth=directory, txt2img=wrong)
    coco_extended_metrics(sims, image_ids, caption_ids, ground_truth=directory, txt2img=np.arange(200) // 5)
    # no eccv_caption and no directory: the error names the extra
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "eccv_caption" else real(name, *a)
    )
    with pytest.raises(MissingExtraError, match=r"patchword\[coco\]"):
        CocoGroundTruth.load()
    assert set(COCO_EXTENDED_METRICS) >= {"eccv_map_at_r", "cxc_recalls", "coco_1k_r1"}


def test_a_two_stage_pair_ranks_each_direction_with_its_own_matrix(universe):
    directory, image_ids, caption_ids, sims = universe
    other = np.random.default_rng(5).standard_normal(sims.shape).astype(np.float32)
    other[other < 0.5] = -np.inf  # not shortlisted
    metrics = ("coco_5k_recalls", "cxc_recalls", "eccv_map_at_r", "eccv_rprecision")
    args = dict(metrics=metrics, ground_truth=directory)
    pair = coco_extended_metrics((sims, other), image_ids, caption_ids, **args)
    first = coco_extended_metrics(sims, image_ids, caption_ids, **args)
    second = coco_extended_metrics(other, image_ids, caption_ids, **args)
    assert pair.keys() == first.keys()
    for name in pair:
        assert pair[name] == {"i2t": first[name]["i2t"], "t2i": second[name]["t2i"]}, name


@pytest.mark.parametrize("metric", ["coco_1k_r1", "coco_1k_recalls"])
def test_a_two_stage_pair_takes_no_coco_1k_metric(universe, metric):
    """Bug: the 1K figures of a two-stage pair cut the 5K search's shortlists per fold, while the model's
    coco1k_* re-run the search per fold (TGDT, 100 images: 536.0 vs 343.8 rSum): two protocols under one
    name. A pair is refused them; a single matrix still gets them."""
    directory, image_ids, caption_ids, sims = universe
    with pytest.raises(ValueError, match=f"{metric}: .*own search"):
        coco_extended_metrics((sims, sims), image_ids, caption_ids, metrics=(metric,), ground_truth=directory)
    assert coco_extended_metrics(sims, image_ids, caption_ids, metrics=(metric,), ground_truth=directory)


def test_scores_and_cutoffs_that_give_no_number_are_refused(universe):
    """Bug: +inf scores were ranked (retrieval_metrics refuses them), and ks=() made every *_recalls
    metric return nothing at all."""
    directory, image_ids, caption_ids, sims = universe
    args = dict(image_ids=image_ids, caption_ids=caption_ids, ground_truth=directory)
    for value, what in ((np.inf, r"1 \+inf value\(s\); only -inf"), (np.nan, r"1 NaN value\(s\)")):
        bad = sims.copy()
        bad[3, 7] = value
        with pytest.raises(ValueError, match=f"sims contains {what}"):
            coco_extended_metrics(bad, **args)
        with pytest.raises(ValueError, match=f"sims\\[1\\] contains {what}"):
            coco_extended_metrics((sims, bad), metrics=("eccv_r1",), **args)
    shortlisted = sims.copy()
    shortlisted[3, 7] = -np.inf  # not shortlisted: allowed, ranked last
    coco_extended_metrics(shortlisted, **args)
    for metric in ("coco_5k_recalls", "eccv_recalls", "coco_1k_recalls"):
        with pytest.raises(ValueError, match=f"ks is empty: {metric}"):
            coco_extended_metrics(sims, metrics=(metric, "eccv_r1"), ks=(), **args)
    assert coco_extended_metrics(sims, metrics=("eccv_r1",), ks=(), **args).keys() == {"eccv_r1"}


def _pm_case(n_img: int, positives: int, seed: int):
    """Every image with ``positives`` plausible-match captions (the real files list up to 13,380), every
    caption with 1-3 images; scores with ties (integers), so tied positives and floors occur."""
    rng = np.random.default_rng(seed)
    image_ids = [int(i) for i in rng.choice(10**6, n_img, replace=False)]
    caption_ids = [int(c) for c in rng.choice(10**6, 5 * n_img, replace=False) + 10**6]
    own = {i: caption_ids[5 * n : 5 * n + 5] for n, i in enumerate(image_ids)}
    owner = {c: image_ids[j // 5] for j, c in enumerate(caption_ids)}
    pm_i2t = {i: [int(c) for c in rng.choice(caption_ids, positives, replace=False)] for i in image_ids}
    pm_t2i = {c: list(dict.fromkeys([owner[c], *map(int, rng.choice(image_ids, 2))])) for c in caption_ids}
    original = (own, {c: [owner[c]] for c in caption_ids})
    truth = CocoGroundTruth(
        coco={"i2t": original[0], "t2i": original[1]},
        cxc={"i2t": original[0], "t2i": original[1]},
        eccv={"i2t": {i: pm_i2t[i][:9] for i in image_ids[::2]}, "t2i": original[1]},
        pm={"i2t": pm_i2t, "t2i": pm_t2i},
        coco_ids=np.asarray(caption_ids, np.int64),
    )
    sims = rng.integers(0, 6, (n_img, 5 * n_img)).astype(np.float32)
    return truth, image_ids, caption_ids, sims


def test_pmrp_ranks_in_blocks_of_queries_each_metric_at_its_own_depth(monkeypatch):
    """Bug: the ranking built (queries, positives, depth) tensors at once (terabytes for the real PM files,
    up to 13,380 positives per image), and PMRP's depth (the largest R) was shared by every metric, so
    asking for pmrp made the ECCV / CxC ranking as deep. Now: blocks of queries within max_memory_mb,
    every comparison linear in (queries x positives), each metric ranked only as deep as it looks; the
    numbers are those of the package (exact ranks) and identical whatever the block size."""
    truth, image_ids, caption_ids, sims = _pm_case(n_img=40, positives=150, seed=0)
    metrics = ("pmrp", "eccv_r1", "eccv_rprecision", "eccv_map_at_r", "cxc_r1", "coco_5k_recalls")
    args = dict(metrics=metrics, ground_truth=truth)
    sizes, depths = [], []
    real_ge, real_eq, real_topk = torch.Tensor.__ge__, torch.Tensor.__eq__, torch.Tensor.topk

    def ge(a, b):
        out = real_ge(a, b)
        sizes.append(out.numel())
        return out

    def eq(a, b):
        out = real_eq(a, b)
        sizes.append(out.numel())
        return out

    def topk(t, k, *a, **kw):
        depths.append(k)
        return real_topk(t, k, *a, **kw)

    with monkeypatch.context() as patched:
        patched.setattr(torch.Tensor, "__ge__", ge)
        patched.setattr(torch.Tensor, "__eq__", eq)
        patched.setattr(torch.Tensor, "topk", topk)
        got = coco_extended_metrics(sims, image_ids, caption_ids, **args)
    # no (queries x positives x positives-or-depth) comparison: 40 x 150 x 150 = 900,000 before
    assert max(sizes) <= sims.size, max(sizes)
    # the recall rankings stop at K (10), PMRP goes to its R (150)
    assert min(depths) <= 10 and max(depths) == 150
    # the same numbers one query per block (a budget of a few bytes) and with every query in one block
    tiny = coco_extended_metrics(sims, image_ids, caption_ids, max_memory_mb=1e-6, **args)
    assert tiny == got
    # exact R-Precision by hand: the positives among each query's top R, ties ranked pessimistically
    # (a tied negative ahead, tied positives in index order)
    column = {c: j for j, c in enumerate(caption_ids)}
    want = []
    for n, image in enumerate(image_ids):
        positives = {column[c] for c in truth.pm["i2t"][image]}
        row = sims[n]
        ranks = [
            sum(1 for j in range(len(row)) if j not in positives and row[j] >= row[p])
            + sum(1 for q in positives if row[q] > row[p] or (row[q] == row[p] and q < p))
            for p in positives
        ]
        want.append(sum(r < len(positives) for r in ranks) / len(positives))
    assert got["pmrp"]["i2t"] == pytest.approx(np.mean(want), abs=1e-12)
    assert 0 < got["pmrp"]["i2t"] < 1 and 0 < got["pmrp"]["t2i"] < 1


def test_pmrp_is_the_exact_r_precision_not_the_papers_top_k_variant(tmp_path):
    """The documented difference (the module table and coco_extended_metrics' docstring): R = 6
    plausible matches ranked 1st, 2nd, 3rd and below 6th: this pmrp is 3/6; the ECCV Caption
    paper's "modified PMRP" on top-K lists (here K = 4) would be 3/4."""
    import patchword.eval.coco_extended as module

    image_ids, caption_ids = [100, 200], list(range(10))
    own = {100: [0, 1, 2, 3, 4], 200: [5, 6, 7, 8, 9]}
    owner = {c: [100 if c < 5 else 200] for c in caption_ids}
    truth = CocoGroundTruth(
        coco={"i2t": own, "t2i": owner},
        cxc={"i2t": own, "t2i": owner},
        eccv={"i2t": {100: [0]}, "t2i": {0: [100]}},
        pm={"i2t": {100: [0, 9, 5, 2, 3, 4]}, "t2i": {0: [100]}},
        coco_ids=np.asarray(caption_ids, np.int64),
    )
    sims = np.zeros((2, 10), np.float32)
    sims[0, [0, 9, 5, 8, 7, 1, 2, 3, 4, 6]] = np.arange(10, 0, -1)
    got = coco_extended_metrics(sims, image_ids, caption_ids, metrics=("pmrp",), ground_truth=truth)
    assert got["pmrp"]["i2t"] == 0.5
    assert "modified PMRP" in module.coco_extended_metrics.__doc__ and "top-50" in module.__doc__


def test_public_import_path():
    """``patchword.eval.coco_extended_metrics`` is the public name (README, docs)."""
    import patchword.eval
    from patchword.eval.coco_extended import coco_extended_metrics

    assert patchword.eval.coco_extended_metrics is coco_extended_metrics
    assert "coco_extended_metrics" in patchword.eval.__all__


def test_a_two_stage_runs_metrics_file_says_why_it_has_no_coco_1k_figures(universe):
    """What ``patchword eval`` writes with eval.coco_extended=true: a two-stage search's (i2t, t2i) pair
    gets the ECCV / CxC / 5K figures but no coco_1k_r1 (its 1K folds need a search each: coco1k_*), and
    the file says so; a single matrix keeps them. On the COCO-shaped random universe (40 images, five
    folds) with its ground truth passed as the config checks pass theirs: the package's 5K truth would
    rank 5000 x 25000 scores four times (~50 s) for the same keys."""
    from types import SimpleNamespace

    from patchword.runs.config import RunConfig
    from patchword.runs.evaluate import extra_metrics

    directory, image_ids, caption_ids, scores = universe
    truth = CocoGroundTruth.load(directory)
    cfg = RunConfig()
    cfg.data.dataset, cfg.eval.coco_extended = "precomp", True
    split = SimpleNamespace(txt2img=torch.arange(len(caption_ids)) // 5)
    raw = SimpleNamespace(image_ids=[str(i) for i in image_ids])
    sims = torch.from_numpy(scores)
    single = extra_metrics(cfg, None, split, raw, sims, "cpu", ground_truth=truth)
    pair = extra_metrics(cfg, None, split, raw, (sims, sims), "cpu", ground_truth=truth)
    assert "coco_1k_r1_i2t" in single and "coco_extended_note" not in single
    assert "coco_1k_r1_i2t" not in pair and pair["coco_extended_note"].startswith("coco_1k_r1 left out")
    assert {k: v for k, v in single.items() if not k.startswith("coco_1k")} == {
        k: v for k, v in pair.items() if k != "coco_extended_note"
    }
