"""Length arguments are checked in training mode too, except where that would wait for an accelerator.

Before, a matcher in training mode (what ``build_matcher`` / ``create_model`` return) accepted any length
values: lengths past the token axis, a 0 (a NaN column), fractions (silently truncated); and
``global_text`` / ``global_embed`` took lengths longer than the tokens. Only lengths already on an
accelerator skip the value check in training: reading them would make every training step wait for the
device. A None or bool length argument failed with an unnamed RuntimeError, or counted as lengths of 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from matcher_support import BUILTIN_MATCHERS
from patchword._validation import check_lengths
from patchword.matching import build_matcher, list_matchers
from patchword.testing.simulated_device import SimulatedDevice

DIM = 32
WITH_CLS = {"seps", "laps", "vse", "clip", "filip"}  # built for 16 patches + CLS below


def _matcher(name: str):
    """A matcher as ``build_matcher`` returns it: in training mode."""
    torch.manual_seed(0)
    options = {"num_patches": 16, "has_cls": True} if name in WITH_CLS else {}
    return build_matcher(name, embed_dim=DIM, **options)


def _inputs(name: str):
    g = torch.Generator().manual_seed(0)
    img = torch.randn(2, 17 if name in WITH_CLS else 16, DIM, generator=g)
    caps = torch.randn(3, 5, DIM, generator=g)
    return img, caps


BAD_LENGTHS = {
    "past the axis": ([5, 3, 9], r"cap_lens has a length 9 longer than the token axis \(5 positions\)"),
    "zero": ([5, 3, 0], r"cap_lens has a length 0 below the minimum of 1"),
    "negative": ([5, -1, 2], r"cap_lens has a length -1 below the minimum of 1"),
    "fraction": ([5.5, 3, 2], r"cap_lens must hold integer lengths"),
    "bool": ([True, True, True], r"cap_lens must hold integer lengths, got dtype torch.bool"),
}


def test_every_registered_matcher_is_covered():
    assert set(list_matchers()) >= {"seps", "laps", "vse", "clip", "filip", "scan", "naaf", "tgdt"}


@pytest.mark.parametrize("given", ["tensor", "list"])
@pytest.mark.parametrize("case", list(BAD_LENGTHS))
@pytest.mark.parametrize("name", sorted(BUILTIN_MATCHERS))
def test_host_lengths_are_checked_in_training_mode(name, case, given):
    m = _matcher(name)
    assert m.training
    img, caps = _inputs(name)
    lens, message = BAD_LENGTHS[case]
    lens = torch.tensor(lens) if given == "tensor" else lens
    with pytest.raises(ValueError, match=message):
        m(img, caps, lens)
    with pytest.raises(ValueError, match=message):
        m.global_embed(img, caps, lens)


@pytest.mark.parametrize("name", sorted(BUILTIN_MATCHERS))
def test_missing_lengths_are_named(name):
    m = _matcher(name)
    img, caps = _inputs(name)
    with pytest.raises(ValueError, match=r"cap_lens must be \(3,\) valid-token counts .*, got None"):
        m(img, caps, None)
    with pytest.raises(ValueError, match=r"cap_lens must be a 1-D tensor of lengths"):
        m(img, caps, [5, None, 2])


def test_dense_lengths_are_checked_in_training_mode():
    m = _matcher("seps")
    img, caps = _inputs("seps")
    dense = torch.randn(2, 4, DIM)
    with pytest.raises(ValueError, match=r"dense_lens has a length 7 longer than the token axis"):
        m(img, caps, [5, 3, 2], dense, torch.tensor([4, 7]))
    with pytest.raises(ValueError, match=r"dense_lens must be \(2,\) valid-token counts .*, got None"):
        m(img, caps, [5, 3, 2], dense, None)


@pytest.mark.parametrize("name", sorted(BUILTIN_MATCHERS))
def test_valid_lengths_train_as_before(name):
    """Valid lengths give the same training-mode scores whichever way they are given."""
    m = _matcher(name)
    img, caps = _inputs(name)
    torch.manual_seed(5)
    from_tensor = m(img, caps, torch.tensor([5, 3, 2])).sims
    torch.manual_seed(5)
    from_list = m(img, caps, [5, 3, 2]).sims
    assert torch.equal(from_tensor, from_list) and torch.isfinite(from_tensor).all()


def _validation_syncs(sim: SimulatedDevice) -> int:
    return sum(n for site, n in sim.counts.sync_sites.items() if "_validation.py" in site)


@pytest.mark.parametrize("name", ["seps", "scan", "tgdt"])
def test_training_reads_no_length_from_the_device(name):
    """Lengths on an accelerator are not read in training (the step's hot path waits for nothing);
    host lengths with device tokens are checked on the host, also without waiting."""
    m = _matcher(name)
    img, caps = _inputs(name)
    sim = SimulatedDevice()
    with sim:
        sim.to_device(m)
        tokens = [sim.to_device(t) for t in (img, caps)]
        device_lens = sim.to_device(torch.tensor([5, 3, 2]))
        sim.reset()
        m(*tokens, device_lens)
        assert _validation_syncs(sim) == 0, sim.counts.sync_sites
        m(*tokens, torch.tensor([5, 3, 2]))
        assert _validation_syncs(sim) == 0, sim.counts.sync_sites
        with pytest.raises(ValueError, match="cap_lens has a length 9 longer"):
            m(*tokens, torch.tensor([5, 3, 9]))
        assert _validation_syncs(sim) == 0, sim.counts.sync_sites
        m.eval()  # eval mode reads device lengths (the entry check of a direct call)
        sim.reset()
        m(*tokens, device_lens)
        assert _validation_syncs(sim) > 0


@pytest.mark.parametrize(
    ("lens", "message"),
    [
        (None, r"dense_lens must be \(2,\) valid-token counts \(a tensor or a sequence of ints\), got None"),
        ([1, None], r"dense_lens must be a 1-D tensor of lengths: .*NoneType"),
        (torch.tensor([True, False]), r"dense_lens must hold integer lengths, got dtype torch.bool"),
        ([True, True], r"dense_lens must hold integer lengths, got dtype torch.bool"),
        (torch.tensor([1 + 1j, 2]), r"dense_lens must hold integer lengths, got dtype torch.complex64"),
        ("ab", r"dense_lens must be a 1-D tensor of lengths"),
    ],
)
def test_check_lengths_names_the_argument(lens, message):
    for values in (True, False):  # also where values are not read: the dtype needs no read
        with pytest.raises(ValueError, match=message):
            check_lengths(lens, "dense_lens", size=2, max_len=4, values=values)


def test_check_lengths_keeps_valid_lengths():
    got = check_lengths([2.0, 4.0], "cap_lens", size=2, max_len=4)
    assert got.dtype == torch.int64 and got.tolist() == [2, 4]
    assert check_lengths(torch.tensor([1, 3], dtype=torch.int32), "x", size=2, max_len=4).tolist() == [1, 3]
    assert math.isclose(float(check_lengths((3,), "x", size=1, max_len=3)[0]), 3.0)
