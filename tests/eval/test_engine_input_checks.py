"""The scoring engines check what the matcher's forward checks, once per call, at their entry.

Before, the SEPS / LAPS engine (``score_matrix``, ``two_stage_scores``, the search re-ranker, the image
constants of an index) checked none of the matcher's input rules: images with the wrong number of tokens
failed deep inside with a size mismatch (after a resize warning), tokens narrower than the matcher with a
LayerNorm error, and a NaN token gave a NaN row without an error; the forward engine raised on all three.
The default ``score_pairs`` of the forward engines checked the finiteness of the inputs once per image.

The check is one reduction over all the inputs: on an accelerator the SEPS engine reads it with the
stability flags of its first image block (no wait of its own), counted on the simulated device.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from patchword.eval import score_matrix
from patchword.eval.engine import engine_for
from patchword.eval.engine.core import prepare_inputs
from patchword.eval.two_stage import two_stage_scores
from patchword.matching import build_matcher
from patchword.testing.simulated_device import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")

DIM = 32
BUDGET = 64 << 20


def _seps(name: str = "seps", **options):
    """A matcher as ``build_matcher`` returns it: in training mode."""
    torch.manual_seed(0)
    return build_matcher(name, embed_dim=DIM, num_patches=16, has_cls=True, **options)


def _inputs(n_img: int = 5, n_tok: int = 17, dim: int = DIM):
    g = torch.Generator().manual_seed(0)
    img = torch.randn(n_img, n_tok, dim, generator=g)
    caps = torch.randn(7, 6, dim, generator=g)
    lens = torch.tensor([6, 3, 2, 4, 5, 6, 1])
    dense = torch.randn(n_img, 8, dim, generator=g)
    dense_lens = torch.tensor([8, 7, 6, 5, 4, 3, 2, 1][:n_img])
    return img, caps, lens, dense, dense_lens


def _pairs(matcher, img, caps, lens, dense=None, dense_lens=None, engine=None):
    inputs = prepare_inputs(matcher, img, caps, lens, dense, dense_lens, None)
    index = (torch.tensor([0, 1, 4]), torch.tensor([2, 0, 6]))
    return engine_for(matcher, engine).score_pairs(inputs, *index, budget=BUDGET, device="cpu")


# every entry of the SEPS engine, with the arguments a test replaces one of
ENTRIES = {
    "score_matrix": lambda m, img, caps, lens, d, dl: score_matrix(m, img, caps, lens, d, dl),
    "score_pairs": lambda m, img, caps, lens, d, dl: _pairs(m, img, caps, lens, d, dl),
    "two_stage": lambda m, img, caps, lens, d, dl: two_stage_scores(m, img, caps, lens, d, dl, k=2),
    "image_constants": lambda m, img, caps, lens, d, dl: engine_for(m).image_constants(
        img, d, dl, device="cpu"
    ),
}


@pytest.mark.parametrize("name", ["seps", "laps"])
@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("n_tok", [197, 16, 20])
def test_image_token_count_is_the_matchers_at_every_entry(entry, n_tok, name):
    m = _seps(name)
    img, caps, lens, dense, dense_lens = _inputs(n_tok=n_tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before: a resize warning, then a RuntimeError
        with pytest.raises(
            ValueError, match=rf"img_tokens has {n_tok} tokens per image, the matcher expects 17 "
        ):
            ENTRIES[entry](m, img, caps, lens, dense, dense_lens)
    with pytest.raises(ValueError, match=r"\(16 patches \+ CLS; shape"):
        ENTRIES[entry](m, img, caps, lens, dense, dense_lens)


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_token_width_is_the_matchers(entry):
    m = _seps()
    img, caps, lens, dense, dense_lens = _inputs(dim=16)
    with pytest.raises(ValueError, match=r"img_tokens has size 16 on axis 2, expected 32"):
        ENTRIES[entry](m, img, caps, lens, dense, dense_lens)


# image constants read no caption
NON_FINITE = [
    (entry, where, name)
    for entry in ENTRIES
    for where, name in [(0, "img_tokens"), (1, "cap_tokens"), (3, "dense_tokens")]
    if (entry, name) != ("image_constants", "cap_tokens")
]


@pytest.mark.parametrize(("entry", "where", "name"), NON_FINITE)
def test_non_finite_tokens_are_named_at_every_entry(entry, where, name):
    m = _seps()
    args = list(_inputs())
    args[where] = args[where].clone()
    args[where][1, 0 if where else 3, 2] = math.nan  # position 0: inside every caption
    with pytest.raises(ValueError, match=rf"{name} contains 1 non-finite value"):
        ENTRIES[entry](m, *args)
    assert m.training  # the call restored the mode it found


def test_non_finite_image_constants_and_priors_are_named():
    """Checked with the tokens now (one read), no longer on their own in ``prepare_inputs``."""
    m = _seps().eval()
    img, caps, lens, dense, dense_lens = _inputs()
    engine = engine_for(m)
    constants = engine.image_constants(img, dense, dense_lens, device="cpu")
    constants[2] = math.inf
    with pytest.raises(ValueError, match="image_constants contains 1 non-finite"):
        inputs = prepare_inputs(m, img, caps, lens, None, None, None, image_constants=constants)
        engine.score(inputs, torch.empty(5, 7), budget=BUDGET, device=torch.device("cpu"), progress=False)
    from patchword.search.pruning import prune_patches

    pruned = prune_patches(engine, img, 12, device="cpu")
    prior = pruned.prior.clone()
    prior[1, 3] = math.nan
    with pytest.raises(ValueError, match="patch_prior contains 1 non-finite"):
        inputs = prepare_inputs(m, pruned.tokens, caps, lens, None, None, None, patch_prior=prior)
        engine.score(inputs, torch.empty(5, 7), budget=BUDGET, device=torch.device("cpu"), progress=False)


def test_nan_past_the_longest_caption_is_never_read_and_accepted():
    m = _seps()
    img, caps, lens, dense, dense_lens = _inputs()
    wide = torch.cat([caps, torch.full((7, 2, DIM), math.nan)], dim=1)  # positions 6, 7: never valid
    assert torch.equal(
        score_matrix(m, img, wide, lens, dense, dense_lens),
        score_matrix(m, img, caps, lens, dense, dense_lens),
    )


def test_missing_dense_lengths_are_named():
    m = _seps()
    img, caps, lens, dense, _ = _inputs()
    with pytest.raises(ValueError, match=r"dense_lens must be \(5,\) valid-token counts .* got None"):
        score_matrix(m, img, caps, lens, dense, None)
    with pytest.raises(ValueError, match=r"cap_lens must be \(7,\) valid-token counts .* got None"):
        score_matrix(m, img, caps, None)
    with pytest.raises(ValueError, match=r"cap_lens must hold integer lengths, got dtype torch.bool"):
        score_matrix(m, img, caps, torch.ones(7, dtype=torch.bool))


@pytest.mark.parametrize("pairing", ["image", "caption"])
@pytest.mark.parametrize("name", ["seps", "laps"])
def test_valid_inputs_keep_the_forwards_scores(name, pairing):
    """A matcher straight from ``build_matcher`` (training mode): the checks change no score."""
    m = _seps(name, dense_pairing=pairing)
    img, caps, lens, dense, dense_lens = _inputs()
    if pairing == "caption":
        dense, dense_lens = torch.cat([dense, dense[:2]]), torch.cat([dense_lens, dense_lens[:2]])
    got = score_matrix(m, img, caps, lens, dense, dense_lens)
    assert m.training
    m.eval()
    want = m(img, caps, lens, dense, dense_lens).sims
    assert (got - want).abs().max().item() <= 1e-5
    pairs = _pairs(m, img, caps, lens, dense, dense_lens)
    assert (pairs - got[[0, 1, 4], [2, 0, 6]]).abs().max().item() <= 1e-5


def _simulated(matcher) -> SimulatedDevice:
    sim = SimulatedDevice()
    with sim:
        sim.to_device(matcher)
    return sim


def _validation_reads(sim) -> int:
    return sum(n for site, n in sim.counts.sync_sites.items() if "_validation.py" in site)


# (host inputs, device inputs): one image block, lengths (caption and dense) given with the tokens
SYNCS = {"score_matrix": (2, 8), "score_pairs": (2, 8), "image_constants": (2, 3)}


@pytest.mark.parametrize("on_device", [False, True], ids=["host-inputs", "device-inputs"])
@pytest.mark.parametrize("entry", list(SYNCS))
def test_the_seps_check_adds_no_wait_on_an_accelerator(entry, on_device):
    """The finiteness of all the inputs is one reduction, read with the first image block's stability
    flags: no sync of its own (device lengths are read by their own entry check, as before), and a NaN
    given on the device is still named."""
    m = _seps().eval()
    img, caps, lens, dense, dense_lens = _inputs()
    want = {
        "score_matrix": lambda: score_matrix(m, img, caps, lens, dense, dense_lens),
        "score_pairs": lambda: _pairs(m, img, caps, lens, dense, dense_lens),
        "image_constants": lambda: engine_for(m).image_constants(img, dense, dense_lens, device="cpu"),
    }[entry]()
    bad = img.clone()
    bad[3, 5, 1] = math.nan
    sim = _simulated(m)
    with sim:
        place = (lambda t: sim.to_device(t)) if on_device else (lambda t: t)
        args = [place(t) for t in (img, caps, lens, dense, dense_lens)]

        def call(tokens):
            if entry == "score_matrix":
                return score_matrix(m, tokens, *args[1:], device=sim.device)
            if entry == "image_constants":
                return engine_for(m).image_constants(tokens, args[3], args[4], device=sim.device)
            inputs = prepare_inputs(m, tokens, *args[1:], None)
            index = (torch.tensor([0, 1, 4]), torch.tensor([2, 0, 6]))
            return engine_for(m).score_pairs(inputs, *index, budget=BUDGET, device=sim.device)

        sim.reset()
        got = call(args[0])
        # exactly the syncs of these calls before they checked anything (c2a901e): the rows / the result
        # back, the stability flags (which carry the check), device lengths' entry checks and host copies
        assert sim.counts.syncs == SYNCS[entry][on_device], sim.counts.sync_sites
        assert _validation_reads(sim) == (2 * 2 if on_device and entry != "image_constants" else 0)
        with pytest.raises(ValueError, match="img_tokens contains 1 non-finite"):
            call(place(bad))
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["scan", "vse", "filip"])
def test_default_score_pairs_checks_the_inputs_once_not_per_image(name):
    torch.manual_seed(0)
    m = build_matcher(name, embed_dim=DIM).eval()
    img, caps, lens, _, _ = _inputs()
    img = img[:, 1:]  # no CLS for the region matchers; any count for the others
    index = (torch.tensor([0, 1, 2, 3, 4, 4]), torch.tensor([2, 0, 6, 1, 1, 3]))
    want = m(img, caps, lens).sims[index]
    sim = _simulated(m)
    with sim:
        dev = [sim.to_device(t) for t in (img, caps)]
        inputs = prepare_inputs(m, *dev, lens, None, None, None)
        sim.reset()
        got = engine_for(m).score_pairs(inputs, *index, budget=BUDGET, device=sim.device)
        assert _validation_reads(sim) == 1  # before: one per image (5)
        bad = img.clone()
        bad[4, 2, 0] = math.nan
        inputs = prepare_inputs(m, sim.to_device(bad), dev[1], lens, None, None, None)
        with pytest.raises(ValueError, match="img_tokens contains 1 non-finite"):
            engine_for(m).score_pairs(inputs, *index, budget=BUDGET, device=sim.device)
    assert (got - want).abs().max().item() <= 1e-5
