"""``precision="tf32"`` of the scoring engine: TF32 for the alignment products only, never for the products
that rank patches for the top-K selection; refused where it would not mean what it says.

The placement is checked on the CPU with the simulated device (an accelerator to the engine): the CUDA flag
that the engine turns on is read at every matrix product and at every top-K. What TF32 does to the scores
and to R@K on a GPU is measured by ``make gpu-check`` (docs/benchmarks.md).
"""

from __future__ import annotations

import pytest
import torch

from matcher_support import seeded_matcher
from patchword.errors import ConfigError
from patchword.eval import score_matrix
from patchword.eval.engine import engine_for
from patchword.eval.engine.base import tf32_products
from patchword.eval.engine.core import declared_precisions, prepare_inputs
from patchword.matching import build_matcher, list_matchers
from patchword.runs.config import RunConfig
from patchword.testing.simulated_device import SimulatedDevice
from patchword.train.validate import check_config

pytestmark = pytest.mark.usefixtures("one_thread")

DIM = 32
SHAPE = (36, True, 0.5, 0.4)  # 36 patches and a CLS token, the ratios of the selection


def _inputs(n_img=4, n_txt=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, 37, DIM, generator=g)
    caps = torch.randn(n_txt, 12, DIM, generator=g)
    lens = torch.randint(3, 13, (n_txt,), generator=g)
    dense = torch.randn(n_img, 25, DIM, generator=g)
    dense_lens = torch.randint(5, 26, (n_img,), generator=g)
    return img, caps, lens, dense, dense_lens, torch.arange(n_txt) % n_img


PRODUCTS = {"mm", "bmm", "addmm", "baddbmm", "matmul"}


class _Recording(SimulatedDevice):
    """The simulated device, noting the CUDA TF32 flag at every matrix product and every top-K."""

    def __init__(self) -> None:
        super().__init__()
        self.products: list[bool] = []
        self.topk: list[bool] = []

    def _dispatch(self, func, args, kwargs):
        name = func.overloadpacket.__name__
        flag = torch.backends.cuda.matmul.allow_tf32
        if name in PRODUCTS:
            self.products.append(flag)
        elif name == "topk":
            self.topk.append(flag)
        return super()._dispatch(func, args, kwargs)


@pytest.mark.parametrize(
    ("variant", "pairing", "t2i"),
    [("code", "image", False), ("code", "caption", True), ("paper", "caption", True)],
)
def test_tf32_covers_the_alignment_and_never_the_patch_ranking(variant, pairing, t2i, monkeypatch):
    m = seeded_matcher("seps", SHAPE, DIM, variant=variant, dense_pairing=pairing)
    img, caps, lens, dense, dense_lens, txt2img = _inputs()
    ranking: list[bool] = []  # the flag in the products that rank patches and in their top-K
    engine = engine_for(m)
    relevance, select = type(engine)._relevance, type(engine)._select

    def noted_relevance(img_block, guide):
        ranking.append(torch.backends.cuda.matmul.allow_tf32)
        return relevance(img_block, guide)

    def noted_select(self, score, net):
        ranking.append(torch.backends.cuda.matmul.allow_tf32)
        return select(self, score, net)

    monkeypatch.setattr(type(engine), "_relevance", staticmethod(noted_relevance))
    monkeypatch.setattr(type(engine), "_select", noted_select)
    want = score_matrix(m, img, caps, lens, dense, dense_lens, txt2img=txt2img if t2i else None)
    engine.precision = "tf32"  # score_matrix refuses TF32 off CUDA: the engine is driven directly
    seen = _Recording()
    inputs = prepare_inputs(m, img, caps, lens, dense, dense_lens, txt2img if t2i else None)
    out = torch.empty(inputs.num_images, inputs.num_texts)
    before = torch.backends.cuda.matmul.allow_tf32
    with seen:
        seen.to_device(m)
        engine.score(inputs, out, budget=64 << 20, device=seen.device, progress=False)
    assert torch.backends.cuda.matmul.allow_tf32 == before  # restored after each block
    assert ranking and not any(ranking)  # every patch ranked and selected with the flag off
    assert any(seen.products)  # the alignment products ran with it on
    # a top-K under TF32 is HRPA's mean of the best words / patches (paper variant): a sum of the top
    # values is continuous in them, unlike a selection of the patches to aggregate
    assert not any(seen.topk) or variant == "paper"
    # on the CPU the flag changes nothing: the same scores as float32
    assert (out - want).abs().max().item() <= 1e-5


def test_fp32_never_turns_tf32_on():
    m = seeded_matcher("seps", SHAPE, DIM, variant="code", dense_pairing="caption")
    img, caps, lens, dense, dense_lens, txt2img = _inputs()
    seen = _Recording()
    inputs = prepare_inputs(m, img, caps, lens, dense, dense_lens, txt2img)
    out = torch.empty(inputs.num_images, inputs.num_texts)
    with seen:
        seen.to_device(m)
        engine_for(m).score(inputs, out, budget=64 << 20, device=seen.device, progress=False)
    assert seen.products and not any(seen.products)


def test_tf32_products_restores_the_flag_after_an_error():
    before = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError), tf32_products(True):
        assert torch.backends.cuda.matmul.allow_tf32
        raise RuntimeError("inside")
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_score_matrix_refuses_a_precision_it_would_not_honour():
    seps = seeded_matcher("seps", SHAPE, DIM, variant="code", dense_pairing="image")
    img, caps, lens, dense, dense_lens, _ = _inputs()
    with pytest.raises(ValueError, match="CUDA tensor cores; the device is cpu"):
        score_matrix(seps, img, caps, lens, dense, dense_lens, precision="tf32")
    with pytest.raises(ValueError, match="precision must be one of fp32, tf32, got 'bf16'"):
        score_matrix(seps, img, caps, lens, dense, dense_lens, precision="bf16")
    vse = build_matcher("vse", embed_dim=DIM)
    with pytest.raises(ValueError, match="the vse engine of .* computes in fp32 only"):
        score_matrix(vse, img, caps, lens, precision="tf32", device="cpu")


def test_every_engine_declares_fp32_and_only_seps_and_laps_offer_tf32():
    offered = {name: declared_precisions(name) for name in list_matchers()}
    assert all("fp32" in p for p in offered.values())
    assert {name for name, p in offered.items() if "tf32" in p} == {"seps", "laps"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"precision": "fp16"}, "must be one of fp32, tf32, got 'fp16'"),
        ({"precision": "tf32"}, "tf32 uses CUDA tensor cores; the run's device is cpu"),
    ],
)
def test_the_run_config_checks_eval_precision_before_anything_runs(overrides, message):
    cfg = RunConfig()
    cfg.device = "cpu"
    for key, value in overrides.items():
        setattr(cfg.eval, key, value)
    with pytest.raises(ConfigError, match=message) as err:
        check_config(cfg)
    assert err.value.key == "eval.precision"


def test_the_run_config_refuses_tf32_for_a_matcher_whose_engine_lacks_it():
    cfg = RunConfig()
    cfg.device, cfg.model.matcher, cfg.eval.precision = "cpu", "scan", "tf32"
    with pytest.raises(ConfigError, match="the scan scoring engine computes in fp32 only"):
        check_config(cfg)
