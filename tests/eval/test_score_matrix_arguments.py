"""``score_matrix`` names a device or a budget it cannot use (two_stage_scores already did)."""

from __future__ import annotations

import pytest
import torch

from patchword.eval import score_matrix
from patchword.matching import build_matcher


def _inputs():
    g = torch.Generator().manual_seed(0)
    m = build_matcher("vse", embed_dim=8).eval()
    return m, torch.randn(3, 5, 8, generator=g), torch.randn(4, 6, 8, generator=g), torch.tensor([6, 3, 2, 5])


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 0, -1.0])
def test_a_budget_that_is_not_positive_and_finite_is_named(budget):
    """Defect: ``max_memory_mb=nan`` was 'cannot convert float NaN to integer'."""
    m, img, cap, lens = _inputs()
    with pytest.raises(ValueError, match="max_memory_mb must be a positive finite number"):
        score_matrix(m, img, cap, lens, max_memory_mb=budget)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_named():
    """Defect: ``device="cuda"`` without CUDA was torch's bare AssertionError."""
    m, img, cap, lens = _inputs()
    with pytest.raises(ValueError, match="device"):
        score_matrix(m, img, cap, lens, device="cuda")
    with pytest.raises(ValueError, match="device: not a torch device"):
        score_matrix(m, img, cap, lens, device="gpu0")


def test_valid_arguments_score_as_before():
    m, img, cap, lens = _inputs()
    want = m(img, cap, lens).sims
    got = score_matrix(m, img, cap, lens, device="cpu", max_memory_mb=1)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
