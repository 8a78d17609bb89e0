"""The forward-engine block loops (SCAN, NAAF, FILIP; TGDT's engine; the VSE engine) do not wait for the
device per block: ``score_matrix`` checks the values of the whole inputs once (one read) and the matcher
calls of its blocks check shapes only; SCAN and NAAF read the widths they trim caption chunks to from the
host lengths the engine planned with. Counted with the simulated device
(:mod:`patchword.testing.simulated_device`). Before, every block re-ran the finiteness and length checks
and read ``int(lens.max())``: ~4-8 host syncs per block (SCAN: 816 for 160 blocks)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from patchword import _validation
from patchword.eval import score_matrix
from patchword.eval.engine import engine_for
from patchword.matching import build_matcher
from patchword.testing.simulated_device import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")

DIM = 16
N_IMG, N_TXT, L_TXT = 12, 72, 9
BUDGET_MB = 0.06  # a few images x ~10-20 captions per block: many blocks
# Small chunk bounds: the matchers also split each block into 2-4 caption chunks (SCAN / NAAF trim every
# chunk to its own longest caption, the width they used to read on the device per chunk).
CASES = {
    "scan-t2i": ("scan", {"direction": "t2i", "max_pair_elements": 1000}),
    "scan-i2t": ("scan", {"direction": "i2t", "agg": "mean", "max_pair_elements": 1000}),
    "naaf": ("naaf", {"max_pair_elements": 1000}),
    "filip": ("filip", {"max_pair_elements": 1000}),
    "tgdt": ("tgdt", {"max_pair_elements": 1000}),
    "vse": ("vse", {}),
}
REGION = {"scan", "naaf"}  # region features, no CLS token


def _matcher(case: str):
    name, options = CASES[case]
    torch.manual_seed(1)
    m = build_matcher(name, embed_dim=DIM, **options).eval()
    if name == "naaf":  # a non-zero test threshold, so the negative branch takes part
        m.threshold_safe.fill_(0.05)
    return m


def _inputs(case: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n_tokens = 8 if CASES[case][0] in REGION else 9
    img = torch.randn(N_IMG, n_tokens, DIM, generator=g)
    caps = torch.randn(N_TXT, L_TXT, DIM, generator=g)
    lens = torch.randint(3, L_TXT + 1, (N_TXT,), generator=g)
    return img, caps, lens


def _simulated(matcher) -> SimulatedDevice:
    sim = SimulatedDevice()
    with sim:
        sim.to_device(matcher)
    return sim


@pytest.mark.parametrize("on_device", [False, True], ids=["host-inputs", "device-inputs"])
@pytest.mark.parametrize("case", list(CASES))
def test_score_matrix_block_loop_waits_only_for_the_rows_of_each_image_block(case, on_device):
    m = _matcher(case)
    img, caps, lens = _inputs(case)
    cpu_engine = engine_for(m)
    want = score_matrix(m, img, caps, lens, max_memory_mb=BUDGET_MB, engine=cpu_engine)
    sim = _simulated(m)
    engine = engine_for(m)
    with sim:
        args = [sim.to_device(t) for t in (img, caps, lens)] if on_device else [img, caps, lens]
        sim.reset()
        got = score_matrix(m, *args, device=sim.device, max_memory_mb=BUDGET_MB, engine=engine)
    plan = engine.last_plan
    assert (plan.image_block, plan.text_block) == (
        cpu_engine.last_plan.image_block,
        cpu_engine.last_plan.text_block,
    )
    image_blocks = math.ceil(N_IMG / plan.image_block)
    blocks = image_blocks * math.ceil(N_TXT / plan.text_block)
    if case != "vse":  # the job really is cut into many blocks (the VSE engine takes big ones)
        assert blocks >= 3 * image_blocks and image_blocks > 1, (plan.image_block, plan.text_block)
    # the same plan, the same blocks, the same arithmetic: the CPU's scores exactly
    assert got.device.type == "cpu"
    assert torch.equal(got, want), (got - want).abs().max()
    # Bound: one wait per image block (its rows come back once) and one for the finiteness of the whole
    # inputs, read once before the loop; lengths given on the device add their entry checks (max, min) and
    # the one copy to the host the plan is made from. Before: 4-8 per block (SCAN 7, NAAF 6, FILIP 8, TGDT 4).
    bound = image_blocks + 1 + (3 if on_device else 0)
    assert sim.counts.syncs <= bound, (blocks, sim.counts.sync_sites)


@pytest.mark.parametrize("case", ["scan-t2i", "naaf"])
def test_direct_eval_calls_with_device_lengths_still_trim_and_check(case):
    """Outside an engine the forward keeps its value checks and reads the chunk widths from device lengths
    (one read for all chunks, not one per chunk); the scores are the CPU forward's."""
    m = _matcher(case)
    img, caps, lens = _inputs(case)
    want = m(img, caps, lens).sims
    sim = _simulated(m)
    with sim:
        dev = [sim.to_device(t) for t in (img, caps, lens)]
        sim.reset()
        got = m(*dev).sims
        counts = sim.counts
        # image and caption finiteness, length max and min, the widths of all chunks at once
        assert counts.syncs == 5, counts.sync_sites
        assert torch.equal(sim.to_host(got), want)
        with pytest.raises(ValueError, match="img_tokens contains 1 non-finite"):
            bad = img.clone()
            bad[2, 3, 4] = math.nan
            m(sim.to_device(bad), *dev[1:])
        # host lengths with device tokens: the same scores, the widths read without waiting
        sim.reset()
        with _validation.values_checked():
            host_lens = m(*dev[:2], lens).sims
        assert sim.counts.syncs == 0, sim.counts.sync_sites
        assert torch.equal(sim.to_host(host_lens), want)


@pytest.mark.parametrize("case", ["scan-t2i", "filip"])
def test_score_matrix_still_rejects_non_finite_tokens_once_at_the_entry(case):
    m = _matcher(case)
    img, caps, lens = _inputs(case)
    bad_img = img.clone()
    bad_img[5, 1, 2] = math.inf
    with pytest.raises(ValueError, match="img_tokens contains 1 non-finite"):
        score_matrix(m, bad_img, caps, lens, max_memory_mb=BUDGET_MB)
    bad_caps = caps.clone()
    bad_caps[40, 1, 0] = math.nan  # inside every caption (lengths >= 3)
    with pytest.raises(ValueError, match="cap_tokens contains 1 non-finite"):
        score_matrix(m, img, bad_caps, lens, max_memory_mb=BUDGET_MB)


def test_values_checked_skips_value_reads_in_its_own_thread_only():
    nan = torch.tensor([1.0, math.nan])
    too_long = torch.tensor([3, 12])
    seen = {}

    def other_thread() -> None:
        try:
            _validation.check_finite(nan, "x")
        except ValueError as err:
            seen["error"] = str(err)

    with _validation.values_checked():
        _validation.check_finite(nan, "x")  # the caller checked its inputs once already: nothing is read
        assert _validation.check_lengths(too_long, "lens", size=2, max_len=9).tolist() == [3, 12]
        with pytest.raises(ValueError, match="shape"):  # shapes are still checked
            _validation.check_lengths(too_long, "lens", size=3, max_len=9)
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen["error"] == "x contains 1 non-finite value(s) (NaN or inf)"
    with pytest.raises(ValueError, match="non-finite"):
        _validation.check_finite(nan, "x")
    with pytest.raises(ValueError, match="longer than the token axis"):
        _validation.check_lengths(too_long, "lens", size=2, max_len=9)
