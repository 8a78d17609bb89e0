"""Evaluation protocol paths checked by value: the COCO 1K folds (a hand-computed case, and the protocol's
``coco1k_*`` against an independent loop over its own scores) and TGDT's two-stage search with shortlists
shorter than the candidate lists, whole and fold by fold, against an independent per-query loop.

What the code documents (eval/two_stage.py, matching/tgdt.py): each query keeps the ``k`` candidates of
highest global similarity, re-ranks them by ``alpha * global + local``, and every other candidate is out
(``-inf``, ranked last); a ground truth outside the shortlist is a miss at every K (the official TGDT
evaluator counts it as rank 1). COCO 1K: fold ``f`` holds images ``[f*N/5, (f+1)*N/5)`` and their captions,
each fold is ranked on its own, and every metric is the mean of the five folds' values. The protocol takes
only splits of 5 x 1000 images; the tiny cases here lower ``COCO_FOLD_IMAGES`` to their own fold size.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from conftest import TINY_REGION_MODEL, TINY_REGIONS, TINY_TGDT
from patchword.config import apply_overrides
from patchword.data.pipeline import EncodedSplit
from patchword.data.precomp import RegionFeatures
from patchword.errors import ConfigError
from patchword.eval import protocol
from patchword.eval.metrics import coco_1k_folds, retrieval_metrics
from patchword.eval.protocol import average_scores, ensemble_metrics, evaluate
from patchword.eval.scoring import encode_image_tokens, encode_text_tokens
from patchword.model import build_model
from patchword.runs.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")

RECALLS = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10"]
VOCAB = 20
K_I2T, K_T2I = 3, 2  # TGDT shortlists, well under the candidates (40+ captions, 20 images; 8-13 and 4 a fold)
#: two scores closer than this could order differently through two paths (float rounding); the cases
#: below are checked to have no such pair where it would matter
MARGIN = 1e-5


# ------------------------------------------------------------------------------ independent reference loops


def loop_ranks(sims: np.ndarray, txt2img: np.ndarray) -> tuple[list[float], list[float]]:
    """0-based ranks per query, one query at a time: competitors scoring >= the (best) ground truth are
    ahead of it; a ground truth at -inf (not shortlisted) is a miss (rank ``inf``)."""
    n_img, n_txt = sims.shape
    i2t = []
    for v in range(n_img):
        own = [c for c in range(n_txt) if txt2img[c] == v]
        best = max(sims[v, c] for c in own)
        ahead = sum(1 for c in range(n_txt) if txt2img[c] != v and sims[v, c] >= best)
        i2t.append(math.inf if best == -math.inf else ahead)
    t2i = []
    for c in range(n_txt):
        gt = sims[txt2img[c], c]
        ahead = sum(1 for v in range(n_img) if v != txt2img[c] and sims[v, c] >= gt)
        t2i.append(math.inf if gt == -math.inf else ahead)
    return i2t, t2i


def recalls_of(i2t: list[float], t2i: list[float]) -> dict[str, float]:
    out = {
        f"{d}_r{k}": 100.0 * sum(r < k for r in ranks) / len(ranks)
        for d, ranks in (("i2t", i2t), ("t2i", t2i))
        for k in (1, 5, 10)
    }
    out["rsum"] = sum(out[key] for key in RECALLS)
    return out


def two_stage_loop(
    glob: np.ndarray, local: np.ndarray, txt2img: np.ndarray, alpha: float, k_i2t: int, k_t2i: int
) -> dict[str, float]:
    """TGDT's two-stage search, one query at a time, from the full (N_img, N_txt) global and local matrices:
    the query's ``k`` candidates of highest global score, ranked by ``alpha * global + local``; a ground
    truth outside them is a miss. Also the share of queries whose shortlist holds no ground truth."""
    n_img, n_txt = glob.shape
    final = alpha * glob + local
    i2t, t2i, miss_i2t, miss_t2i = [], [], 0, 0
    for v in range(n_img):
        order = sorted(range(n_txt), key=lambda c: -glob[v, c])
        assert glob[v, order[k_i2t - 1]] - glob[v, order[k_i2t]] > MARGIN, (
            f"image {v}: shortlist boundary tie"
        )
        shortlist = order[:k_i2t]
        own = [c for c in shortlist if txt2img[c] == v]
        if not own:
            miss_i2t += 1
            i2t.append(math.inf)
            continue
        best = max(final[v, c] for c in own)
        others = [final[v, c] for c in shortlist if txt2img[c] != v]
        assert all(abs(s - best) > MARGIN for s in others), f"image {v}: re-ranking tie"
        i2t.append(sum(s >= best for s in others))
    for c in range(n_txt):
        order = sorted(range(n_img), key=lambda v: -glob[v, c])
        assert glob[order[k_t2i - 1], c] - glob[order[k_t2i], c] > MARGIN, f"caption {c}: shortlist tie"
        shortlist = order[:k_t2i]
        if txt2img[c] not in shortlist:
            miss_t2i += 1
            t2i.append(math.inf)
            continue
        gt = final[txt2img[c], c]
        others = [final[v, c] for v in shortlist if v != txt2img[c]]
        assert all(abs(s - gt) > MARGIN for s in others), f"caption {c}: re-ranking tie"
        t2i.append(sum(s >= gt for s in others))
    return {
        **recalls_of(i2t, t2i),
        "shortlist_miss_i2t": 100.0 * miss_i2t / n_img,
        "shortlist_miss_t2i": 100.0 * miss_t2i / n_txt,
    }


def assert_protocol_metrics(got: dict, want: dict, prefix: str = "") -> None:
    """``got[prefix + key] == want[key]``: recalls and shortlist-miss shares exactly up to float64 rounding
    (integer counts divided in Python, as the library divides them; f715cbc averaged the misses as a
    float32 tensor, 80.0000012 for 80)."""
    for key, value in want.items():
        assert got[prefix + key] == pytest.approx(value, abs=1e-9), key


def fold_mean(per_fold: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(fold[key] for fold in per_fold) / len(per_fold) for key in per_fold[0]}


def folds_of(n_img: int, txt2img: np.ndarray, n_folds: int = 5):
    """(image range, caption columns) of each fold, by the definition in the module doc."""
    for f in range(n_folds):
        lo, hi = f * n_img // n_folds, (f + 1) * n_img // n_folds
        yield lo, hi, np.flatnonzero((txt2img >= lo) & (txt2img < hi))


# ----------------------------------------------------------------------------------------- COCO 1K by hand


def test_coco_1k_folds_by_hand():
    """Ten images in five folds of two, two captions each (caption c describes image c // 2), scores 1 for
    a ground truth and 0 elsewhere, except:

    * image 0 scores caption 18 (image 9, fold 4) at 2: in the full ranking image 0's query and caption
      18's query both have one competitor ahead (misses at R@1, hits at R@5); within the folds neither
      competitor is present: hits;
    * image 3 scores caption 4 (image 2, same fold 1) at 3: misses at R@1 for image 3 and caption 4, in the
      full ranking and in fold 1 alike;
    * image 6's two captions (12, 13) score -inf against it (not shortlisted): image 6 and captions 12 and
      13 miss at every K, in full and in fold 3.

    Full: i2t 7/10, 9/10, 9/10 and t2i 16/20, 18/20, 18/20 -> 70 90 90 80 90 90, rSum 510.
    Folds: rSum 600 (fold 0), 525 (fold 1: i2t 50 100 100, t2i 75 100 100), 600, 300 (fold 3: 50 each),
    600; means i2t 80 90 90, t2i 85 90 90, rSum 525.
    """
    txt2img = np.arange(20) // 2
    sims = (txt2img[None, :] == np.arange(10)[:, None]).astype(np.float64)
    sims[0, 18], sims[3, 4] = 2.0, 3.0
    sims[6, [12, 13]] = -np.inf
    # the captions in another order: a fold takes its captions wherever they sit
    perm = np.random.default_rng(0).permutation(20)
    sims, txt2img = sims[:, perm], txt2img[perm]

    got = coco_1k_folds(torch.from_numpy(sims), torch.from_numpy(txt2img), fold_size=2)
    want_folds = [
        {"i2t_r1": 100, "i2t_r5": 100, "i2t_r10": 100, "t2i_r1": 100, "t2i_r5": 100, "t2i_r10": 100},
        {"i2t_r1": 50, "i2t_r5": 100, "i2t_r10": 100, "t2i_r1": 75, "t2i_r5": 100, "t2i_r10": 100},
        {"i2t_r1": 100, "i2t_r5": 100, "i2t_r10": 100, "t2i_r1": 100, "t2i_r5": 100, "t2i_r10": 100},
        {"i2t_r1": 50, "i2t_r5": 50, "i2t_r10": 50, "t2i_r1": 50, "t2i_r5": 50, "t2i_r10": 50},
        {"i2t_r1": 100, "i2t_r5": 100, "i2t_r10": 100, "t2i_r1": 100, "t2i_r5": 100, "t2i_r10": 100},
    ]
    assert [{k: fold[k] for k in RECALLS} for fold in got["folds"]] == want_folds
    assert [fold["rsum"] for fold in got["folds"]] == [600, 525, 600, 300, 600]
    assert {k: got[k] for k in [*RECALLS, "rsum"]} == pytest.approx(
        {"i2t_r1": 80, "i2t_r5": 90, "i2t_r10": 90, "t2i_r1": 85, "t2i_r5": 90, "t2i_r10": 90, "rsum": 525}
    )
    # the independent loop agrees, fold by fold and on the full matrix (where the distractors count)
    assert recalls_of(*loop_ranks(sims, txt2img)) == pytest.approx(
        {"i2t_r1": 70, "i2t_r5": 90, "i2t_r10": 90, "t2i_r1": 80, "t2i_r5": 90, "t2i_r10": 90, "rsum": 510}
    )
    per_fold = [
        recalls_of(*loop_ranks(sims[lo:hi][:, cols], txt2img[cols] - lo))
        for lo, hi, cols in folds_of(10, txt2img)
    ]
    assert fold_mean(per_fold) == pytest.approx({k: got[k] for k in [*RECALLS, "rsum"]})


# --------------------------------------------------------------------------- the protocol on a tiny model


def _split(n_img: int = 20, seed: int = 0) -> EncodedSplit:
    """``n_img`` images of 14 random 16-d regions; two captions each plus a few more, in shuffled order,
    of 4-9 random word ids."""
    g = torch.Generator().manual_seed(seed)
    txt2img = torch.cat([torch.arange(n_img).repeat(2), torch.randint(0, n_img, (n_img // 4,), generator=g)])
    txt2img = txt2img[torch.randperm(len(txt2img), generator=g)]
    n_txt = len(txt2img)
    lens = torch.randint(4, 10, (n_txt,), generator=g)
    ids = torch.randint(1, VOCAB, (n_txt, 9), generator=g)
    ids[torch.arange(9)[None, :] >= lens[:, None]] = 0
    feats = torch.rand(n_img, 14, 16, generator=g).numpy()
    return EncodedSplit("test", RegionFeatures(feats), ids, lens, txt2img, [""] * n_txt)


def _model(*overrides: str):
    cfg = apply_overrides(RunConfig(), [*TINY_REGION_MODEL, *overrides])
    torch.manual_seed(0)
    return build_model(cfg.model, vocab_size=VOCAB).eval(), cfg.eval


@pytest.mark.parametrize("matcher", ["naaf", "scan"])
def test_a_float64_model_is_scored_on_float64_tokens(matcher):
    """precision=fp64 (NAAF's official test-time arithmetic): the split's tokens were cast to float32
    before scoring, so the float64 matcher scored rounded tokens (scores ~1.8 float32 epsilons off the
    float64 forward); the matrix now differs from it only by its own rounding to float32 (<= 1/2 eps)."""
    model, eval_cfg = _model(f"model.matcher={matcher}", "model.naaf.min_samples=20")
    model = model.double()
    split = _split()
    got = protocol.score_split(model, split, eval_cfg)
    with torch.no_grad():
        pixels = torch.as_tensor(split.images.batch(torch.arange(split.num_images), train=False))
        img = model.encode_images(pixels.double())
        cap = model.encode_texts(split.cap_ids, split.cap_lens)
        assert img.dtype == cap.dtype == torch.float64
        want = torch.cat([model.matcher(img[i : i + 1], cap, split.cap_lens).sims for i in range(len(img))])
    relative = (got.double() - want).abs() / want.abs() / torch.finfo(torch.float32).eps
    assert got.dtype == torch.float32 and relative.max() <= 0.5 + 1e-6


@pytest.fixture
def folds_of_four(monkeypatch):
    """The COCO 1K protocol on the 20-image splits below: five folds of 4 images."""
    monkeypatch.setattr(protocol, "COCO_FOLD_IMAGES", 4)


def test_matrix_protocol_coco_1k_is_the_mean_of_its_folds_ranked_alone(folds_of_four):
    model, eval_cfg = _model("model.matcher=scan")
    split = _split()
    assert model.matcher.two_stage_plan() is None  # ranked on the full matrix
    eval_cfg.coco_1k = True
    got = evaluate(model, split, eval_cfg, progress=False, return_sims=True)
    sims, txt2img = got["sims"].double().numpy(), split.txt2img.numpy()
    assert {k: got[k] for k in [*RECALLS, "rsum"]} == pytest.approx(recalls_of(*loop_ranks(sims, txt2img)))
    per_fold = [
        recalls_of(*loop_ranks(sims[lo:hi][:, cols], txt2img[cols] - lo))
        for lo, hi, cols in folds_of(20, txt2img)
    ]
    want = fold_mean(per_fold)
    assert {key: got[f"coco1k_{key}"] for key in want} == pytest.approx(want, abs=1e-9)
    assert "coco1k_folds" not in got
    # the folds are not the full ranking (fewer distractors): the case tells the two apart
    assert got["coco1k_rsum"] > got["rsum"]


def _tgdt():
    model, eval_cfg = _model(
        *TINY_TGDT, f"model.tgdt.shortlist_i2t={K_I2T}", f"model.tgdt.shortlist_t2i={K_T2I}"
    )
    plan = model.matcher.two_stage_plan()
    assert (plan.k_i2t, plan.k_t2i, plan.alpha) == (K_I2T, K_T2I, 1.0)
    return model, eval_cfg, plan


def _global_and_local(model, plan, split: EncodedSplit) -> tuple[np.ndarray, np.ndarray]:
    """The full (N_img, N_txt) global cosine and local score matrices, from the matcher's own forward
    passes on the whole split (not the two-stage machinery's index and pair engine)."""
    with torch.no_grad():
        img = encode_image_tokens(model, split.images)
        cap = encode_text_tokens(model, split.cap_ids, split.cap_lens)
        gi, gt = model.matcher.global_embed(img, cap, split.cap_lens)
        local = plan.fine(img, cap, split.cap_lens).sims
    return (gi @ gt.T).double().numpy(), local.double().numpy()


def test_tgdt_two_stage_with_short_shortlists_equals_a_per_query_loop():
    model, eval_cfg, plan = _tgdt()
    split = _split()
    n_img, n_txt = split.num_images, split.num_captions
    assert n_txt > K_I2T and n_img > K_T2I
    got = evaluate(model, split, eval_cfg, progress=False)
    glob, local = _global_and_local(model, plan, split)
    want = two_stage_loop(glob, local, split.txt2img.numpy(), plan.alpha, K_I2T, K_T2I)
    assert_protocol_metrics(got, want)
    assert (got["shortlist_i2t"], got["shortlist_t2i"], got["hybrid_alpha"]) == (K_I2T, K_T2I, 1.0)
    # both outcomes occur: ground truths re-ranked inside a shortlist, and ground truths never shortlisted
    assert 0 < want["shortlist_miss_t2i"] < 100 and want["t2i_r1"] > 0
    assert want["t2i_r10"] == pytest.approx(100 - want["shortlist_miss_t2i"])  # a shortlisted one ranks < 2
    # the pairs scored: the union of both shortlists, each pair once
    i2t = {(v, c) for v in range(n_img) for c in np.argsort(-glob[v])[:K_I2T]}
    t2i = {(v, c) for c in range(n_txt) for v in np.argsort(-glob[:, c])[:K_T2I]}
    assert got["pairs_scored"] == len(i2t | t2i)


def test_tgdt_coco_1k_searches_each_fold_on_its_own(folds_of_four):
    model, eval_cfg, plan = _tgdt()
    split = _split(seed=1)
    eval_cfg.coco_1k = True
    got = evaluate(model, split, eval_cfg, progress=False)
    glob, local = _global_and_local(model, plan, split)
    txt2img = split.txt2img.numpy()
    per_fold = []
    for lo, hi, cols in folds_of(split.num_images, txt2img):
        assert len(cols) > K_I2T and hi - lo > K_T2I  # shortlists shorter than the fold's candidates
        fold = two_stage_loop(
            glob[lo:hi][:, cols], local[lo:hi][:, cols], txt2img[cols] - lo, 1.0, K_I2T, K_T2I
        )
        per_fold.append(fold)
    want = fold_mean(per_fold)
    assert_protocol_metrics(got, want, prefix="coco1k_")
    # a fold's shortlist is drawn from the fold: it differs from the full search's
    full = two_stage_loop(glob, local, txt2img, 1.0, K_I2T, K_T2I)
    assert_protocol_metrics(got, full)
    assert want["shortlist_miss_t2i"] < full["shortlist_miss_t2i"]


# ------------------------------------------------------------------------ COCO 1K: one protocol everywhere


@pytest.mark.parametrize("matcher", ["scan", "tgdt"])
def test_coco_1k_on_a_split_that_is_not_5_x_1000_images_is_refused_before_encoding(monkeypatch, matcher):
    """Bug: a 1000-image split was cut into folds of 200 (and 7 images into 1, 1, 1, 2, 2) and reported
    as coco1k_*. Refused now, naming the key and the COCO 5K split, before anything is encoded."""
    model, eval_cfg = _model("model.matcher=scan") if matcher == "scan" else _tgdt()[:2]
    eval_cfg.coco_1k = True

    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded before eval.coco_1k was checked")

    monkeypatch.setattr(protocol, "encode_image_tokens", no_encoding)
    with pytest.raises(ConfigError, match=r"eval\.coco_1k: .*has 20 images: set data\.test_split=testall"):
        evaluate(model, _split(), eval_cfg, progress=False)


def test_an_ensemble_of_two_stage_members_searches_each_fold_as_one_model_does(folds_of_four):
    """Bug: a two-stage member's coco1k_* in an ensemble came from cutting its 5K shortlists per fold,
    while the same model alone re-runs the search per fold: two protocols under one label (TGDT, 100
    images: 536.0 vs 343.8 rSum). Now the ensemble averages each member's own search of the fold: two
    copies of one model score exactly what the model scores alone, and a matrix member's fold is its
    slice."""
    model, eval_cfg, _ = _tgdt()
    split = _split(seed=1)
    eval_cfg.coco_1k = True
    alone = evaluate(model, split, eval_cfg, progress=False, return_sims=True, return_fold_sims=True)
    pair, folds = alone["sims"], alone["coco1k_sims"]
    assert isinstance(pair, tuple) and len(folds) == 5
    twice = ensemble_metrics([pair, pair], split.txt2img, eval_cfg, fold_members=[folds, folds])
    for key in [*RECALLS, "rsum", "i2t_medr", "t2i_medr", "i2t_meanr", "t2i_meanr"]:
        assert twice[f"coco1k_{key}"] == pytest.approx(alone[f"coco1k_{key}"], abs=1e-9), key
        assert twice[key] == pytest.approx(alone[key], abs=1e-9), key
    # the other protocol (the 5K shortlists cut per fold) gives other numbers on this case
    cut = coco_1k_folds(pair, split.txt2img, fold_size=4)
    assert cut["rsum"] != pytest.approx(alone["coco1k_rsum"])
    # without the members' fold searches the ensemble refuses rather than cut the shortlists
    with pytest.raises(ValueError, match="own search of each fold"):
        ensemble_metrics([pair, pair], split.txt2img, eval_cfg)
    # a matrix member joins with its slice of each fold
    scan, _ = _model("model.matcher=scan")
    matrix = evaluate(scan, split, eval_cfg, progress=False, return_sims=True, return_fold_sims=True)
    assert "coco1k_sims" not in matrix  # a matrix's folds are slices of its matrix
    mixed = ensemble_metrics([matrix["sims"], pair], split.txt2img, eval_cfg, fold_members=[None, folds])
    txt2img = split.txt2img
    per_fold = []
    for f in range(5):
        lo, hi = 4 * f, 4 * f + 4
        cols = ((txt2img >= lo) & (txt2img < hi)).nonzero().squeeze(1)
        fold = average_scores([matrix["sims"][lo:hi, cols], folds[f]])
        per_fold.append(retrieval_metrics(fold, txt2img[cols] - lo))
    for key in [*RECALLS, "rsum"]:
        assert mixed[f"coco1k_{key}"] == pytest.approx(np.mean([f[key] for f in per_fold]), abs=1e-9), key


def test_patchword_eval_ensemble_of_two_stage_runs_reports_the_single_models_protocol(
    tmp_path, folds_of_four, monkeypatch
):
    """The same through ``patchword eval``: a TGDT run ensembled with itself reports the coco1k_* the run
    reports alone (each member's folds searched on their own), where the 5K shortlists cut per fold gave
    other numbers."""
    import json

    from patchword.cli import main

    shortlists = [f"model.tgdt.shortlist_i2t={K_I2T}", f"model.tgdt.shortlist_t2i={K_T2I}"]
    train = [*TINY_REGIONS, *TINY_TGDT, *shortlists, "data.num_test=20", "train.max_steps=2"]
    assert main(["train", *train, f"output_dir={tmp_path}", "name=tgdt"]) == 0
    run = str(tmp_path / "tgdt")
    # the run's weights in other bytes, the repeated-member refusal lifted (an ensemble of one model with
    # itself is refused: tests/runs/test_evaluation_records.py): the averaging must give the model's figures
    monkeypatch.setattr("patchword.runs.evaluate.refuse_repeated_members", lambda checkpoints: None)
    shutil.copytree(run, tmp_path / "again")
    state = torch.load(tmp_path / "again" / "best.pt", weights_only=False)
    torch.save({**state, "copied": True}, tmp_path / "again" / "best.pt")
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["eval", run, "eval.coco_1k=true", "--out", str(one)]) == 0
    again = str(tmp_path / "again")
    assert main(["eval", run, "eval.coco_1k=true", "--ensemble", again, "--out", str(two)]) == 0
    alone, ensembled = json.loads(one.read_text()), json.loads(two.read_text())
    assert len(ensembled["ensemble"]) == 2 and "coco1k_sims" not in ensembled["ensemble"][0]
    for key in [*RECALLS, "rsum", "i2t_medr", "t2i_medr"]:
        assert ensembled[f"coco1k_{key}"] == pytest.approx(alone[f"coco1k_{key}"], abs=1e-9), key
        assert ensembled[key] == pytest.approx(alone[key], abs=1e-9), key
