"""The SEPS engine's ``patch_priors`` (index-time pruning) and ``two_stage_scores`` check inputs at entry.

Before: ``SEPSEngine.patch_priors`` checked nothing (a wrong image token count gave priors over the wrong
patches, a NaN token NaN priors that ``prune_patches`` ranked), unlike ``score`` / ``score_pairs`` /
``image_constants``; ``two_stage_scores`` refused a wrong token count only in the re-ranker, after the whole
global stage had run; and the engine called the matcher's private ``_validate_images``.
"""

from __future__ import annotations

import math

import pytest
import torch

import patchword.eval.two_stage as two_stage
from patchword.eval.engine import engine_for
from patchword.eval.engine.seps_align import SEPSAlignment
from patchword.matching import build_matcher
from patchword.search.pruning import prune_patches
from patchword.testing.simulated_device import SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")

DIM = 32


def _seps(name: str = "seps"):
    torch.manual_seed(0)
    return build_matcher(name, embed_dim=DIM, num_patches=16, has_cls=True).eval()


def _images(n_tok: int = 17, dim: int = DIM) -> torch.Tensor:
    return torch.randn(5, n_tok, dim, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["seps", "laps"])
@pytest.mark.parametrize("n_tok", [16, 20])
def test_patch_priors_refuse_the_wrong_image_token_count(name, n_tok):
    engine = engine_for(_seps(name))
    img = _images(n_tok)
    match = rf"img_tokens has {n_tok} tokens per image, the matcher expects 17 \(16 patches \+ CLS"
    with pytest.raises(ValueError, match=match):
        engine.patch_priors(img, device="cpu")
    with pytest.raises(ValueError, match=match):
        prune_patches(engine, img, 8, device="cpu")


def test_patch_priors_refuse_another_width_and_name_a_non_finite_token():
    engine = engine_for(_seps())
    with pytest.raises(ValueError, match=r"img_tokens has size 16 on axis 2, expected 32"):
        engine.patch_priors(_images(dim=16), device="cpu")
    bad = _images()
    bad[2, 4, 1] = math.nan
    with pytest.raises(ValueError, match="img_tokens contains 1 non-finite value"):
        prune_patches(engine, bad, 8, device="cpu")


def test_checked_priors_are_the_unchecked_ones_with_no_wait_of_their_own():
    """Same values; device tokens: the finiteness rides on the first block's stability flags (no sync of
    its own), and a NaN given on the device is still named."""
    m = _seps()
    engine = engine_for(m)
    img = _images()
    want = SEPSAlignment.patch_priors(engine, img, device="cpu")
    assert torch.equal(engine.patch_priors(img, device="cpu"), want)
    sim = SimulatedDevice()
    with sim:
        sim.to_device(m)
        tokens = sim.to_device(img)
        sim.reset()
        unchecked = SEPSAlignment.patch_priors(engine, tokens, device=sim.device, block=2)
        syncs = sim.counts.syncs
        sim.reset()
        got = engine.patch_priors(tokens, device=sim.device, block=2)
        assert sim.counts.syncs == syncs, sim.counts.sync_sites
        bad = img.clone()
        bad[4, 0, 0] = math.inf  # in the last block: read with the first one's flags all the same
        with pytest.raises(ValueError, match="img_tokens contains 1 non-finite value"):
            engine.patch_priors(sim.to_device(bad), device=sim.device, block=2)
    assert torch.equal(got, unchecked) and torch.allclose(got, want, atol=1e-6)


def test_the_matchers_image_check_is_public():
    m = _seps()
    m.validate_images(_images())  # accepted
    with pytest.raises(ValueError, match="img_tokens has 20 tokens per image"):
        m.validate_images(_images(20))
    with pytest.raises(ValueError, match=r"patch_prior has size 4 on axis 0"):
        m.validate_images(_images(13), torch.zeros(4, 12))  # 4 priors for 5 images


def test_two_stage_refuses_the_wrong_token_count_before_the_global_stage(monkeypatch):
    m = _seps()
    g = torch.Generator().manual_seed(1)
    caps, lens = torch.randn(7, 6, DIM, generator=g), torch.tensor([6, 3, 2, 4, 5, 6, 1])
    calls = []
    original = two_stage.global_embeddings

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(two_stage, "global_embeddings", counted)
    with pytest.raises(ValueError, match="img_tokens has 20 tokens per image, the matcher expects 17"):
        two_stage.two_stage_scores(m, _images(20), caps, lens, k=2)
    assert not calls  # refused before any global embedding was computed
    result = two_stage.two_stage_scores(m, _images(), caps, lens, k=2)
    assert calls and result.pairs_scored > 0
