"""The CUDA paths against the CPU: exhaustive scoring, re-ranking and one training step give the CPU's values.

Marked ``cuda``: they run once per CUDA device present and skip without one (also under ``CI=true``, see
conftest.py); ``make gpu-check`` runs them on a GPU machine. The CPU side is the ground truth (scores: the
matcher's own forward, ``engine="forward"``), so a failure here is a device bug, not a tolerance. TF32 is
off for the whole comparison: it would round matmuls and convolutions to 10 mantissa bits.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from conftest import tiny_shard_batch
from matcher_support import engine_inputs as _inputs
from matcher_support import engine_matcher as _matcher
from patchword.eval import score_matrix, two_stage_scores
from patchword.eval.engine import engine_for
from patchword.eval.engine.core import prepare_inputs

#: One entry per CUDA device of this machine (none: every test skips).
DEVICES = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []

pytestmark = pytest.mark.cuda

on_each_device = pytest.mark.parametrize(
    "device", DEVICES or [pytest.param(None, marks=pytest.mark.skip(reason="no CUDA device"))]
)


@contextlib.contextmanager
def _fp32_exact():
    """float32 matmuls and convolutions in full precision on CUDA for the block, restored after."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


def _to(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


# ----------------------------------------------------------------------------------------------- scoring


# dense text: tied to the image; tied to captions through txt2img (rows = images); tied to captions with
# one row per caption (no txt2img)
DENSE = ["image", "caption-txt2img", "caption-rows"]


def _scoring_case(kind: str, variant: str, dense: str, n_img: int = 5, n_txt: int = 8):
    """A tiny seeded SEPS matcher and its score_matrix arguments: (matcher, args, txt2img)."""
    m = _matcher(kind, variant, dense_pairing="image" if dense == "image" else "caption")
    img, caps, lens, d, dl, t2i = _inputs(kind, n_img=n_img, n_txt=n_txt)
    if dense == "caption-rows":
        d, dl, t2i = d[t2i], dl[t2i], None
    elif dense == "image":
        t2i = None
    return m, (img, caps, lens, d, dl), t2i


@on_each_device
@pytest.mark.parametrize("inputs_on", ["host", "device"])
@pytest.mark.parametrize("dense", DENSE)
@pytest.mark.parametrize("variant", ["code", "paper"])
def test_score_matrix_on_cuda_equals_the_forward_on_the_cpu(device, variant, dense, inputs_on):
    m, args, t2i = _scoring_case("vit", variant, dense)
    want = score_matrix(m, *args, txt2img=t2i, engine="forward")
    on_device = copy.deepcopy(m).to(device)
    given = _to(device, *args) if inputs_on == "device" else args
    with _fp32_exact():
        got = score_matrix(on_device, *given, txt2img=t2i, device=device)
    assert got.device.type == "cpu" and got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).abs().max().item() <= 1e-5


@on_each_device
@pytest.mark.parametrize("dense", ["image", "caption-txt2img"])
def test_score_matrix_on_cuda_in_many_blocks_equals_the_forward_on_the_cpu(device, dense):
    """A budget of a few images per block: the block seams and the upload of each block are exercised."""
    m, args, t2i = _scoring_case("swin", "paper", dense, n_img=7, n_txt=13)
    want = score_matrix(m, *args, txt2img=t2i, engine="forward")
    with _fp32_exact():
        got = score_matrix(copy.deepcopy(m).to(device), *args, txt2img=t2i, device=device, max_memory_mb=0.5)
    assert (got - want).abs().max().item() <= 1e-5


@on_each_device
@pytest.mark.parametrize("inputs_on", ["host", "device"])
@pytest.mark.parametrize(("variant", "dense"), [("code", "image"), ("paper", "caption-txt2img")])
def test_score_pairs_and_two_stage_re_ranking_on_cuda_equal_the_cpu(device, variant, dense, inputs_on):
    m, args, t2i = _scoring_case("swin", variant, dense, n_img=6, n_txt=12)
    full = score_matrix(m, *args, txt2img=t2i, engine="forward")
    on_device = copy.deepcopy(m).to(device)
    given = _to(device, *args) if inputs_on == "device" else args
    g = torch.Generator().manual_seed(0)
    vi, ti = torch.randint(0, 6, (40,), generator=g), torch.randint(0, 12, (40,), generator=g)
    with _fp32_exact():
        inputs = prepare_inputs(on_device, *given, t2i)
        pairs = engine_for(on_device).score_pairs(inputs, vi, ti, budget=1 << 26, device=torch.device(device))
        cpu = two_stage_scores(m, *args, txt2img=t2i, k=(3, 2))
        gpu = two_stage_scores(on_device, *given, txt2img=t2i, k=(3, 2), device=device)
    assert pairs.device.type == "cpu" and (pairs - full[vi, ti]).abs().max().item() <= 1e-5
    # the same shortlists, and the same fine scores on them (-inf off the shortlist)
    assert torch.equal(gpu.i2t_candidates.cpu(), cpu.i2t_candidates)
    assert torch.equal(gpu.t2i_candidates.cpu(), cpu.t2i_candidates)
    for got, want in ((gpu.sims_i2t.cpu(), cpu.sims_i2t), (gpu.sims_t2i.cpu(), cpu.sims_t2i)):
        shown = torch.isfinite(want)
        assert torch.equal(torch.isfinite(got), shown)
        assert (got[shown] - want[shown]).abs().max().item() <= 1e-5
        assert (want[shown] - full[shown]).abs().max().item() <= 1e-5


@on_each_device
@pytest.mark.parametrize(
    ("variant", "dense"), [("code", "image"), ("code", "caption-txt2img"), ("paper", "image")]
)
def test_tf32_scores_on_cuda_stay_near_float32_and_leave_the_flag_as_found(device, variant, dense):
    m, args, t2i = _scoring_case("vit", variant, dense, n_img=6, n_txt=12)
    on_device = copy.deepcopy(m).to(device)
    with _fp32_exact():
        exact = score_matrix(on_device, *args, txt2img=t2i, device=device)
        fast = score_matrix(on_device, *args, txt2img=t2i, device=device, precision="tf32")
        assert not torch.backends.cuda.matmul.allow_tf32
    # TF32 keeps 10 mantissa bits of each operand: a relative error of ~1e-3 on the alignment products
    assert (fast - exact).abs().max().item() <= 1e-2


# -------------------------------------------------------------------------------------------- training


def _tiny_step(variant: str, pairing: str, device: str):
    """Loss and gradients of one training step (ShardLoss forward + backward, one process, fp32) of the
    seeded seps-tiny-32 model on a fixed batch of 6 captions of 6 images, on ``device``."""
    from patchword.config import apply_overrides
    from patchword.distributed import Distributed
    from patchword.factory import create_model
    from patchword.runs.config import RunConfig
    from patchword.train.step import ShardLoss

    torch.manual_seed(0)
    # no Gumbel noise (the paper variant's default): the CPU and the device would draw different noise
    seps = {"variant": variant, "dense_pairing": pairing, "gumbel": False}
    model = create_model("seps-tiny-32", pretrained=False, vocab_size=40, seps=seps).to(device).train()
    cfg = apply_overrides(RunConfig(), ["precision=fp32"])
    batch = tiny_shard_batch(device)
    with _fp32_exact():
        loss, stats = ShardLoss(model, cfg, Distributed(device=torch.device(device)))(
            batch, False, False, 1.0
        )
        loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().cpu(), stats.detach().cpu(), grads


def assert_gradients_close(got: dict, want: dict, rel: float) -> None:
    """Every parameter's gradient within ``rel`` of its own norm; a structurally zero one (a
    softmax-invariant bias) is rounding noise on both sides, compared against the whole gradient's size."""
    assert got.keys() == want.keys() and len(want) > 10
    total = torch.cat([g.flatten() for g in want.values()]).norm()
    for name, expected in want.items():
        scale = max(float(expected.norm()), 1e-3 * float(total))
        assert float((got[name] - expected).norm()) <= rel * scale, name


@on_each_device
@pytest.mark.parametrize(("variant", "pairing"), [("code", "image"), ("paper", "caption")])
def test_one_training_step_on_cuda_has_the_loss_and_gradients_of_the_cpu(device, variant, pairing):
    loss_cpu, stats_cpu, grads_cpu = _tiny_step(variant, pairing, "cpu")
    loss_dev, stats_dev, grads_dev = _tiny_step(variant, pairing, device)
    assert loss_cpu > 0 and torch.isfinite(loss_cpu)
    assert abs(float(loss_dev - loss_cpu)) <= 1e-4 * abs(float(loss_cpu))
    torch.testing.assert_close(stats_dev, stats_cpu, rtol=1e-4, atol=1e-6)
    assert_gradients_close(grads_dev, grads_cpu, 1e-4)


# ------------------------------------------------------------------------ fused query/key/value on CUDA


@on_each_device
def test_fused_projections_on_cuda_equal_the_unfused_and_do_not_sync(device):
    """A tiny Hugging Face BERT on CUDA with ``fuse_qkv`` (as every patchword HF encoder) against the same
    weights without it: equal outputs and gradients in float32, close under bf16 autocast, and a training
    encode that never makes the host wait (``set_sync_debug_mode("error")`` raises on any sync)."""
    transformers = pytest.importorskip("transformers")
    from patchword.encoders import HFTextEncoder
    from patchword.encoders.fused import unfuse_qkv

    blocks = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = transformers.BertConfig(vocab_size=50, max_position_embeddings=32, **blocks, **no_dropout)
    torch.manual_seed(0)
    fused = HFTextEncoder(config, embed_dim=32).to(device).train()
    plain = copy.deepcopy(fused)
    unfuse_qkv(plain)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (4, 12), generator=g).to(device)
    lens = torch.tensor([12, 7, 3, 9]).to(device)
    outs = {}
    for name, model in (("fused", fused), ("plain", plain)):
        with _fp32_exact():
            out = model(ids, lens)
            out.sum().backward()
        with torch.autocast("cuda", torch.bfloat16):
            outs[name + "_bf16"] = model(ids, lens).float()
        outs[name] = out
    assert (outs["fused"] - outs["plain"]).abs().max().item() <= 1e-5
    for p, q in zip(fused.parameters(), plain.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max().item() <= 1e-5 * max(1.0, q.grad.abs().max().item())
    # bf16 products: another GEMM shape may sum in another order (a few bf16 ulps)
    scale = max(1.0, outs["plain_bf16"].abs().max().item())
    assert (outs["fused_bf16"] - outs["plain_bf16"]).abs().max().item() <= 2e-2 * scale
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", torch.bfloat16):
            fused(ids, lens).float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ------------------------------------------------------------------ the compiled step as CUDA graphs


@on_each_device
def test_the_training_step_replayed_as_cuda_graphs_logs_the_eager_losses(device, tmp_path, monkeypatch):
    """``train.compile_scope=step`` with ``train.compile_mode=reduce-overhead``: five trainer steps on one
    batch (so the CUDA graph is recorded, then replayed) in the alignment warm-up (a new loss weight at
    every step, which reaches the graph as a device tensor) replay the training loss as CUDA graphs and log
    the eager step's losses, without a graph skipped. Dynamo's ``cudagraphs`` backend stands in for
    Inductor's (the same CUDA graph trees, without the code generation that would take longer than the
    rest of this suite). Every step opens a new generation of the graphs, so reading a step's loss and
    statistics never meets an output that a later replay overwrote."""
    from torch._dynamo.utils import counters

    from conftest import TINY_MODEL_32, trainer_losses

    original, marks = torch.compile, []
    mark = torch.compiler.cudagraph_mark_step_begin

    def cuda_graph_compile(fn, *args, **kwargs):
        assert kwargs.pop("mode", None) == "reduce-overhead"
        return original(fn, *args, **{**kwargs, "backend": "cudagraphs"})

    monkeypatch.setattr(torch, "compile", cuda_graph_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: (marks.append(1), mark())[1])
    tiny = [*TINY_MODEL_32, "data.num_train=12", "data.num_dev=6", "data.num_test=6"]
    tiny += ["model.seps.variant=code", "train.batch_size=6", "train.log_every=1"]

    def losses(*extra):
        with _fp32_exact():
            return trainer_losses([*tiny, *extra], tmp_path, steps=5, device=device, same_batch=True)

    eager = losses("train.text_width_multiple=16")  # the widths the CUDA-graph step pads to by default
    assert len(eager) == 5 and not marks
    torch._dynamo.reset()
    counters.clear()
    graphs = losses("train.compile=true", "train.compile_scope=step", "train.compile_mode=reduce-overhead")
    assert graphs == pytest.approx(eager, rel=1e-5)
    assert len(marks) == 5  # one generation per step
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
