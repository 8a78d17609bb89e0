"""The patch probes on hand-made tokens: a label written into the tokens is read back exactly, random tokens
score chance; the ROC AUC and the per-patch targets on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from patchword.data.synthetic.records import SceneTable
from patchword.eval.patch_probe import fit_linear_probe, patch_targets, probe_patch_tokens, roc_auc

pytestmark = pytest.mark.usefixtures("one_thread")


def _labels(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(seed))


def test_tokens_that_encode_the_label_give_100_percent():
    y, yt = _labels(600, 4, 0), _labels(400, 4, 1)
    noise = lambda n, s: torch.randn(n, 6, generator=torch.Generator().manual_seed(s))  # noqa: E731
    x = torch.cat([torch.nn.functional.one_hot(y, 4).double(), noise(600, 2)], 1)
    xt = torch.cat([torch.nn.functional.one_hot(yt, 4).double(), noise(400, 3)], 1)
    score = fit_linear_probe(x, y, xt, yt)
    assert score.accuracy == score.balanced_accuracy == 100.0
    assert score.classes == 4 and score.balanced_chance == 25.0
    assert score.majority_chance == pytest.approx(100.0 * int(torch.bincount(yt).max()) / 400)


def test_random_tokens_score_chance():
    y, yt = _labels(3000, 4, 4), _labels(3000, 4, 5)
    x = torch.randn(3000, 8, generator=torch.Generator().manual_seed(6))
    xt = torch.randn(3000, 8, generator=torch.Generator().manual_seed(7))
    score = fit_linear_probe(x, y, xt, yt)
    assert abs(score.balanced_accuracy - 25.0) < 3.0  # 3000 test samples: std of chance ~0.8 points
    assert score.accuracy <= score.majority_chance + 3.0


def test_roc_auc_hand_cases():
    assert roc_auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])) == 100.0
    assert roc_auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), torch.tensor([0, 0, 1, 1])) == 0.0
    assert roc_auc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0, 1, 1])) == 50.0  # ties count half
    # one positive (0.6) above two of three negatives (0.1, 0.5 below; 0.7 above): 2/3
    assert roc_auc(torch.tensor([0.1, 0.5, 0.7, 0.6]), torch.tensor([0, 0, 0, 1])) == pytest.approx(200 / 3)


def test_patch_targets_on_a_hand_drawn_image():
    """A 4x4 image, 2x2 patches of 2x2 pixels: the object in cell 4 covers patch 0 fully and one pixel of
    patch 1; the object in cell 0 covers half of patch 3."""
    labels = np.full((1, 4, 4), -1, np.int8)
    labels[0, 0:2, 0:2] = 4
    labels[0, 0, 2] = 4
    labels[0, 3, 2:4] = 0
    shape = np.full((1, 9), -1, np.int8)
    colour = np.full((1, 9), -1, np.int8)
    shape[0, 4], colour[0, 4] = 2, 5
    shape[0, 0], colour[0, 0] = 1, 3
    t = patch_targets(labels, SceneTable(shape=shape, colour=colour, size=np.zeros_like(shape)), grid=2)
    assert t["coverage"].tolist() == [[1.0, 0.25, 0.0, 0.5]]
    assert t["object"].tolist() == [[True, False, False, True]]
    assert t["shape"].tolist() == [[2, -1, -1, 1]] and t["colour"].tolist() == [[5, -1, -1, 3]]


def test_probe_patch_tokens_reads_every_task_from_tokens_that_hold_it():
    rng = np.random.default_rng(0)
    n, p = 40, 16
    obj = rng.random((n, p)) < 0.3
    shape = np.where(obj, rng.integers(0, 5, (n, p)), -1)
    colour = np.where(obj, rng.integers(0, 8, (n, p)), -1)
    targets = {"object": obj, "shape": shape, "colour": colour}
    tokens = torch.cat(
        [
            torch.as_tensor(obj, dtype=torch.float64)[..., None],
            torch.nn.functional.one_hot(torch.as_tensor(shape + 1), 6).double(),
            torch.nn.functional.one_hot(torch.as_tensor(colour + 1), 9).double(),
        ],
        -1,
    )
    out = probe_patch_tokens(
        tokens[:20],
        {k: v[:20] for k, v in targets.items()},
        tokens[20:],
        {k: v[20:] for k, v in targets.items()},
    )
    assert {task: out[task]["accuracy"] for task in out} == {"object": 100.0, "shape": 100.0, "colour": 100.0}


def test_nan_tokens_and_scores_are_refused():
    """Bug: NaN patch tokens made every probe predict one class (accuracy = the majority chance, 84.2 on
    the demo) and the grounding AUC came out near 50 (roc_auc([.1, nan, .3, .2], ...) was 50.0): numbers
    that look like an encoder that learned nothing. Each now raises, naming what is not finite."""
    nan_scores = r"the AUC's scores contains 1 non-finite value\(s\) \(NaN or inf\); no probe or AUC can be"
    with pytest.raises(ValueError, match=nan_scores):
        roc_auc(torch.tensor([0.1, float("nan"), 0.3, 0.2]), torch.tensor([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="non-finite"):
        roc_auc(torch.tensor([0.1, float("inf"), 0.3, 0.2]), torch.tensor([1, 1, 0, 0]))
    y = _labels(40, 2, 0)
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
    broken = x.clone()
    broken[5, 1] = float("nan")
    with pytest.raises(ValueError, match="the probe's training features contains 1 non-finite"):
        fit_linear_probe(broken, y, x, y)
    with pytest.raises(ValueError, match="the probe's test features"):
        fit_linear_probe(x, y, broken, y)
    tokens = torch.full((2, 4, 3), float("nan"))
    targets = {
        "object": np.array([[True, False, True, False]] * 2),
        "shape": np.array([[0, -1, 1, -1]] * 2),
        "colour": np.array([[1, -1, 0, -1]] * 2),
    }
    with pytest.raises(ValueError, match="patch tokens of the training images contains 24 non-finite"):
        probe_patch_tokens(tokens, targets, tokens, targets)
