"""``precision=bf16``: the step computes on a bfloat16 copy of the model, the float32 model keeps the master
weights (``patchword.train.master_weights``). What the copy shares and casts, why the master weights are
needed (an update below a bfloat16 step), gradients moved to them, and runs of every matcher family that
train, save float32 weights and resume bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from conftest import TRAINING_FAMILIES, tiny_hf_laps_overrides, tiny_shard_batch
from patchword.checkpoint import load_checkpoint
from patchword.config import apply_overrides
from patchword.precision import autocast_context, weight_dtype
from patchword.runs.config import RunConfig
from patchword.train.master_weights import BF16Copy

pytestmark = pytest.mark.usefixtures("one_thread")


class _WithStatistics(nn.Module):
    """A linear layer, a BatchNorm layer and a float64 statistic (as NAAF's thresholds)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.unused = nn.Linear(3, 3)
        self.register_buffer("threshold", torch.tensor(0.25, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x)) * self.threshold.to(x.dtype)


def test_precision_bf16_keeps_float32_master_weights_without_autocast():
    assert weight_dtype("bf16") == torch.float32
    with autocast_context("bf16", torch.device("cpu")):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_the_copy_casts_the_weights_and_shares_batchnorm_and_buffers():
    torch.manual_seed(0)
    model = _WithStatistics()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copy = BF16Copy(model)
    twin = copy.module
    assert twin.fc.weight.dtype == twin.fc.bias.dtype == torch.bfloat16
    assert torch.equal(twin.fc.weight, model.fc.weight.bfloat16())
    assert twin.bn is model.bn and twin.threshold is model.threshold  # the same tensors, not copies
    assert model.fc.weight.dtype == torch.float32  # the model is untouched
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    out = twin(torch.randn(5, 4).bfloat16())  # BatchNorm takes bfloat16 inputs with float32 weights
    assert out.dtype == torch.bfloat16
    assert int(model.bn.num_batches_tracked) == 1  # statistics kept by the model's own layer


def test_the_master_gradients_are_the_float32_gradients_within_bfloat16_rounding():
    """A smooth loss (no selection to flip): the gradients ``push_grads`` leaves on the master weights are
    the float32 model's, within bfloat16 rounding (2^-8 per operation)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    x = torch.randn(64, 16)
    model(x).square().mean().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    copy = BF16Copy(model)
    copy.module(x.bfloat16()).float().square().mean().backward()
    copy.push_grads()
    for name, p in model.named_parameters():
        assert float((p.grad - want[name]).norm()) <= 2e-2 * float(want[name].norm()), name


def test_tied_weights_stay_tied_in_the_copy():
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # an output layer tied to the embedding
    copy = BF16Copy(model)
    assert copy.module[1].weight is copy.module[0].weight
    assert copy.module[0].weight.dtype == torch.bfloat16
    copy.module(torch.tensor([1, 2])).float().sum().backward()
    copy.push_grads()
    assert model[0].weight.grad is not None and model[0].weight.grad.abs().sum() > 0


def test_push_grads_moves_the_gradients_to_the_master_weights():
    torch.manual_seed(0)
    model = _WithStatistics().train()
    copy = BF16Copy(model)
    copy.module(torch.randn(5, 4).bfloat16()).float().square().sum().backward()
    want = copy.module.fc.weight.grad.float()
    model.unused.weight.grad = torch.ones(3, 3)  # stale: the copy has no gradient for it this step
    copy.push_grads()
    assert model.fc.weight.grad.dtype == torch.float32 and torch.equal(model.fc.weight.grad, want)
    assert copy.module.fc.weight.grad is None  # released
    assert model.unused.weight.grad is None
    assert model.bn.weight.grad is not None and model.bn.weight.grad.dtype == torch.float32


def test_the_copy_of_a_fused_backbone_computes_one_query_key_value_product():
    """The copy of a Hugging Face BERT (fused query/key/value projections) does the model's arithmetic:
    its projections share one product as the model's do."""
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from patchword.encoders import HFTextEncoder

    blocks = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = transformers.BertConfig(vocab_size=50, max_position_embeddings=32, **blocks)
    model = HFTextEncoder(config, embed_dim=16).train()
    copy = BF16Copy(model)
    ids, lens = torch.randint(1, 50, (4, 12)), torch.tensor([12, 7, 3, 9])
    flops = []
    for encoder in (model, copy.module):
        with FlopCounterMode(display=False) as counter:
            encoder(ids, lens).float().sum().backward()
        flops.append(counter.get_total_flops())
    assert flops[0] == flops[1]
    attention = copy.module.backbone.encoder.layer[0].attention.self
    assert attention.query._qkv_group is attention.key._qkv_group is attention.value._qkv_group


def test_updates_below_a_bfloat16_step_accumulate_in_the_master_weights():
    """AdamW at lr 1e-3 moves a weight of 1 by 1e-3 per step (constant gradient), a 1/8 of bfloat16's step
    at 1 (2^-7): bfloat16 weights updated in place never move, the master weights do and the copy
    follows them once they have moved half a bfloat16 step."""
    master = nn.Linear(1, 1, bias=False)
    in_place = nn.Linear(1, 1, bias=False).bfloat16()
    with torch.no_grad():
        master.weight.fill_(1.0)
        in_place.weight.fill_(1.0)
    copy = BF16Copy(master)
    opt = torch.optim.AdamW(master.parameters(), lr=1e-3, weight_decay=0.0)
    opt_in_place = torch.optim.AdamW(in_place.parameters(), lr=1e-3, weight_decay=0.0)
    x = torch.ones(1, 1, dtype=torch.bfloat16)
    copies = []
    for _ in range(10):
        (-copy.module(x)).sum().backward()
        copy.push_grads()
        opt.step()
        opt.zero_grad()
        copy.pull()
        copies.append(copy.module.weight.item())
        (-in_place(x)).sum().backward()
        opt_in_place.step()
        opt_in_place.zero_grad()
    assert master.weight.item() == pytest.approx(1.01, abs=1e-6)
    assert in_place.weight.item() == 1.0  # every update rounded away
    assert copies[:3] == [1.0] * 3 and copies[-1] == 1.0 + 2**-7  # 1.004 and up round to 1 + 2^-7


# --------------------------------------------------------------------------------------------- runs

FAMILIES = TRAINING_FAMILIES


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _fit(overrides: list[str], run_dir, cache):
    """(trainer, the model's weights before training) after ``fit`` of a Trainer built as ``train_run``
    builds it."""
    from patchword.train.runner import _build
    from patchword.train.trainer import Trainer

    cfg = apply_overrides(RunConfig(), [*overrides, f"data.cache_dir={cache}"])
    data, model = _build(cfg, None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_dir.mkdir()
    trainer = Trainer(cfg, model, data.splits["train"], data.splits["dev"], run_dir, tokenizer=data.tokenizer)
    trainer.fit()
    return trainer, before


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_in_bf16_like_fp32(family, tmp_path, cache):
    """Three steps of every matcher family in fp32 and in bf16 from the same weights and batches: the first
    losses agree within bfloat16 rounding, the float32 master weights move, the copy holds them rounded
    to bfloat16, and what is not copied (BatchNorm layers, NAAF's float64 statistics) keeps its dtype."""
    overrides = [*FAMILIES[family], "train.max_steps=3", "train.align_warmup_epochs=0"]
    losses, norms = {}, {}
    for precision in ("fp32", "bf16"):
        trainer, before = _fit([*overrides, f"precision={precision}"], tmp_path / precision, cache)
        records = [r for r in trainer.history if r["split"] == "train"]
        losses[precision], norms[precision] = [r["loss"] for r in records], records[0]["grad_norm"]
    assert len(losses["bf16"]) == 3 and all(torch.isfinite(torch.tensor(losses["bf16"])))
    assert losses["bf16"][0] == pytest.approx(losses["fp32"][0], rel=3e-2, abs=1e-2)
    # the selections (top-K, hardest negatives) flip on bfloat16 rounding: the first gradient norms differ
    # by up to ~20% (LAPS), a gradient of twice or half the size would be 100% or 50% off
    assert norms["bf16"] == pytest.approx(norms["fp32"], rel=0.4)
    model, copy = trainer.model, trainer.bf16.module
    after = model.state_dict()
    assert _dtypes(after) == _dtypes(before)  # float32, and NAAF's float64 statistics
    params = dict(model.named_parameters())
    moved = [k for k, v in params.items() if not torch.equal(v, before[k])]
    assert len(moved) >= len(params) // 2, moved
    for (name, master), own in zip(model.named_parameters(), copy.parameters(), strict=True):
        if own is master:  # BatchNorm: shared
            assert master.dtype == torch.float32, name
        else:
            assert own.dtype == torch.bfloat16 and torch.equal(own, master.bfloat16()), name
    saved = load_checkpoint(tmp_path / "bf16" / "last.pt")["model"]
    for k, v in after.items():  # the master weights, saved (NAAF's statistics may still be NaN)
        torch.testing.assert_close(saved[k], v, rtol=0, atol=0, equal_nan=True)


def _dtypes(state: dict) -> dict:
    return {k: v.dtype for k, v in state.items()}


def test_hugging_face_backbones_train_in_bf16(tiny_hf, laps_dataset, tmp_path, cache):
    """BERT and ViT from transformers (fused query/key/value projections) on the bfloat16 copy."""
    overrides = [
        *tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path),
        "train.max_steps=2",
        "train.log_every=1",
    ]
    losses = {}
    for precision in ("fp32", "bf16"):
        trainer, before = _fit([*overrides, f"precision={precision}"], tmp_path / precision, cache)
        losses[precision] = [r["loss"] for r in trainer.history if r["split"] == "train"]
    assert losses["bf16"][0] == pytest.approx(losses["fp32"][0], rel=3e-2, abs=1e-2)
    assert {p.dtype for p in trainer.bf16.module.parameters()} == {torch.bfloat16}
    query = next(k for k in before if k.endswith("attention.self.query.weight"))
    assert not torch.equal(trainer.model.state_dict()[query], before[query])


def test_a_bf16_resume_equals_the_uninterrupted_run(tmp_path, cache):
    """Resuming rebuilds the copy from the saved master weights: 2 + 2 steps equal 4, bit for bit."""
    from patchword.train.runner import resume_run, train_run

    args = [*FAMILIES["seps_paper"], "precision=bf16", f"data.cache_dir={cache}", f"output_dir={tmp_path}"]
    train_run(apply_overrides(RunConfig(), [*args, "name=full", "train.max_steps=4"]))
    train_run(apply_overrides(RunConfig(), [*args, "name=half", "train.max_steps=2"]))
    assert resume_run(tmp_path / "half", ["train.max_steps=4"])["steps"] == 4
    full, half = (load_checkpoint(tmp_path / name / "last.pt") for name in ("full", "half"))
    for key, value in full["model"].items():
        assert torch.equal(value, half["model"][key]), key
    assert value.dtype == torch.float32
    assert _train_losses(tmp_path / "full") == _train_losses(tmp_path / "half")


def _train_losses(run_dir) -> list[float]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["split"] == "train"]


def _bf16_step(device) -> dict:
    """Master weights after one bf16 step (copy forward + backward, gradients to the master weights,
    clipping, AdamW, copy refreshed) of the seeded seps-tiny-32 model on a fixed batch, on ``device``."""
    from patchword.distributed import Distributed
    from patchword.factory import create_model
    from patchword.train.step import ShardLoss

    torch.manual_seed(0)
    seps = {"variant": "paper", "dense_pairing": "caption", "gumbel": False}
    model = create_model("seps-tiny-32", pretrained=False, vocab_size=40, seps=seps).to(device).train()
    copy = BF16Copy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)  # none on the meta device
    batch = tiny_shard_batch(device)
    cfg = apply_overrides(RunConfig(), ["precision=bf16"])
    loss, _ = ShardLoss(copy.module, cfg, Distributed(device=torch.device(device)))(batch, False, False, 1.0)
    loss.backward()
    copy.push_grads()
    grads = {n: p.grad.cpu().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0, foreach=False)
    optimizer.step()
    copy.pull()
    own = dict(copy.module.named_parameters())
    assert all(torch.equal(own[n].float(), p.bfloat16().float()) for n, p in model.named_parameters())
    return float(loss.detach()), grads


def test_the_bf16_step_on_a_device_never_waits_and_equals_the_cpu():
    """On the simulated accelerator: no op mixes devices, nothing waits for the device after the uploads
    of the model and the batch, and the loss and the master weights' gradients are the CPU step's within
    bfloat16 rounding (the device runs the ops as dispatched, the CPU some of them as fused bfloat16
    kernels, which round differently)."""
    from patchword.testing import SimulatedDevice

    loss_cpu, grads_cpu = _bf16_step("cpu")
    sim = SimulatedDevice()
    with sim:
        loss, grads = _bf16_step(sim.device)
    assert loss == pytest.approx(loss_cpu, rel=1e-2)
    assert all(g.dtype == torch.float32 for g in grads.values())
    assert grads.keys() == grads_cpu.keys() and len(grads) > 10
    total = torch.cat([g.flatten() for g in grads_cpu.values()]).norm()
    for name, want in grads_cpu.items():  # a structurally zero gradient against the whole gradient's size
        assert float((grads[name] - want).norm()) <= 0.15 * max(float(want.norm()), 1e-3 * float(total)), name
    waits = set(sim.counts.sync_sites)
    assert all("test_master_weights.py" in site or "nn/modules/module.py" in site for site in waits), waits
