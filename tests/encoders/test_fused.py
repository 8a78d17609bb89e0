"""Fused query/key/value projections (``patchword.encoders.fused``): the same outputs and gradients as
transformers' three products, the same state dict, fewer products and casts (issue 34)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from patchword.bench.device_work import DeviceWork
from patchword.encoders.fused import FusedProjection, fuse_qkv

transformers = pytest.importorskip("transformers")


# Two blocks of width 32; no dropout, so that two forward passes in training mode are comparable.
_BLOCKS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
_BLOCKS.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _vit():
    config = transformers.ViTConfig(image_size=32, patch_size=8, **_BLOCKS)
    return transformers.ViTModel(config, add_pooling_layer=False), lambda g: {
        "pixel_values": torch.randn(3, 3, 32, 32, generator=g)
    }


def _bert():
    config = transformers.BertConfig(vocab_size=50, max_position_embeddings=32, **_BLOCKS)

    def inputs(g):
        ids = torch.randint(1, 50, (3, 9), generator=g)
        mask = torch.arange(9) < torch.tensor([9, 4, 2])[:, None]
        return {"input_ids": ids * mask, "attention_mask": mask}

    return transformers.BertModel(config, add_pooling_layer=False), inputs


def _swin():
    config = transformers.SwinConfig(
        image_size=32,
        patch_size=4,
        embed_dim=8,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=4,
        drop_path_rate=0.0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.SwinModel(config, add_pooling_layer=False), lambda g: {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=g)
    }


@pytest.mark.parametrize(
    ("build", "triples"), [(_vit, 2), (_bert, 2), (_swin, 2)], ids=["vit", "bert", "swin"]
)
def test_fused_backbone_gives_the_outputs_and_gradients_of_the_original(build, triples):
    torch.manual_seed(0)
    original, make_inputs = build()
    fused = copy.deepcopy(original)
    assert fuse_qkv(fused) == triples
    assert list(fused.state_dict()) == list(original.state_dict())
    inputs = make_inputs(torch.Generator().manual_seed(1))
    outs = []
    for model in (original, fused):
        model.train()  # dropout off in the configs: gradients of the training forward
        out = model(**inputs).last_hidden_state
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        (out * weights).sum().backward()
        outs.append(out)
    assert (outs[0] - outs[1]).abs().max().item() <= 1e-5
    for (name, p), q in zip(original.named_parameters(), fused.parameters(), strict=True):
        # float32 rounding of the same sums in another order: relative to the gradient's scale
        assert (p.grad - q.grad).abs().max().item() <= 1e-6 * max(1.0, p.grad.abs().max().item()), name


def test_a_fused_model_loads_an_unfused_state_dict():
    torch.manual_seed(0)
    original, make_inputs = _bert()
    torch.manual_seed(1)
    fused, _ = _bert()
    fuse_qkv(fused)
    fused.load_state_dict(original.state_dict())
    inputs = make_inputs(torch.Generator().manual_seed(1))
    original.eval(), fused.eval()
    diff = original(**inputs).last_hidden_state - fused(**inputs).last_hidden_state
    assert diff.abs().max().item() <= 1e-5


def test_one_product_and_one_cast_per_block_under_autocast():
    """Under bf16 autocast the three projections of a block read one cast of the hidden states: the
    forward has 2 fewer products and 2 fewer casts per block, the backward 2 fewer float32 sums."""
    counts = []
    for fuse in (False, True):
        torch.manual_seed(0)
        model, make_inputs = _vit()
        if fuse:
            fuse_qkv(model)
        work = DeviceWork()
        with work:
            with torch.autocast("cpu", torch.bfloat16):
                out = model(**make_inputs(torch.Generator().manual_seed(1))).last_hidden_state
            out.float().sum().backward()
        ops = [op.name for op in work.ops]
        counts.append({name: ops.count(name) for name in ("addmm", "_to_copy", "add")})
    blocks = 2
    assert counts[0]["addmm"] - counts[1]["addmm"] == 2 * blocks
    assert counts[0]["_to_copy"] - counts[1]["_to_copy"] >= 4 * blocks  # 2 casts forward, 2 back
    assert counts[0]["add"] - counts[1]["add"] >= 2 * blocks


def test_members_called_on_different_tensors_project_each_their_own():
    """Cross-attention projects keys and values from another sequence: each member then computes its
    own product, whatever the order of the calls."""
    torch.manual_seed(0)
    parent = nn.Module()
    parent.query, parent.key, parent.value = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(4, 5)
    plain = copy.deepcopy(parent)
    assert fuse_qkv(parent) == 1 and isinstance(parent.key, FusedProjection)
    x, y = torch.randn(2, 4), torch.randn(3, 4)
    for name, arg in [("key", y), ("query", x), ("value", y), ("key", x), ("query", x), ("value", x)]:
        got = getattr(parent, name)(arg)
        assert torch.allclose(got, getattr(plain, name)(arg), atol=1e-6), name


def test_a_fused_backbone_compiles_into_one_graph():
    """``train.compile=true`` compiles the encoders: the shared product traces without a graph break
    (``fullgraph=True`` raises on one) and gives the eager outputs."""
    torch.manual_seed(0)
    model, make_inputs = _bert()
    fuse_qkv(model)
    inputs = make_inputs(torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    for _ in range(2):  # the second call reuses the graph: the group holds nothing between calls
        got = compiled(**inputs).last_hidden_state
        assert (got - model(**inputs).last_hidden_state).abs().max().item() <= 1e-6


def test_hugging_face_encoders_fuse_their_projections():
    from patchword.encoders import HFTextEncoder, HFVisionEncoder

    config = transformers.BertConfig(vocab_size=50, max_position_embeddings=32, **_BLOCKS)
    text = HFTextEncoder(config, embed_dim=16)
    vision = HFVisionEncoder(transformers.ViTConfig(image_size=32, patch_size=8, **_BLOCKS), embed_dim=16)
    for encoder in (text, vision):
        projections = [m for m in encoder.modules() if isinstance(m, FusedProjection)]
        assert len(projections) == 3 * _BLOCKS["num_hidden_layers"]


def test_inference_runs_the_three_products_as_written():
    """Without gradients (evaluation, search queries) nothing is shared: no concatenated weights."""
    torch.manual_seed(0)
    model, make_inputs = _bert()
    fuse_qkv(model)
    work = DeviceWork()
    with torch.no_grad(), work:
        model(**make_inputs(torch.Generator().manual_seed(1)))
    assert "cat" not in {op.name for op in work.ops}


def test_a_changed_input_weight_or_grad_mode_is_projected_again():
    torch.manual_seed(0)
    parent = nn.Module()
    parent.query, parent.key, parent.value = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(4, 6)
    plain = copy.deepcopy(parent)
    fuse_qkv(parent)
    x = torch.randn(2, 4, requires_grad=True)
    parent.query(x)
    with torch.no_grad():
        x.mul_(2)  # in place: its version changes
    assert torch.allclose(parent.key(x), plain.key(x), atol=1e-6)
    parent.query(x)
    with torch.no_grad():
        parent.value.weight.add_(1.0)
        plain.value.weight.add_(1.0)
    assert torch.allclose(parent.value(x), plain.value(x), atol=1e-6)
    parent.query(x)
    with torch.no_grad():
        assert parent.key(x).grad_fn is None and torch.allclose(parent.key(x), plain.key(x), atol=1e-6)


def test_threads_running_one_fused_model_get_their_own_outputs():
    """The search server encodes queries in a thread pool, a training process could too: each thread
    shares products with itself only (f07ac7d's first fused version mixed threads' outputs up)."""
    import sys
    import threading

    torch.manual_seed(0)
    model, make_inputs = _bert()
    fuse_qkv(model)
    batches = [make_inputs(torch.Generator().manual_seed(seed)) for seed in range(4)]
    with torch.no_grad():
        fused_off = [model(**b).last_hidden_state for b in batches]  # no sharing without gradients
    errors = []

    def run(i: int) -> None:
        for _ in range(60):
            got = model(**batches[i]).last_hidden_state.detach()
            errors.append((got - fused_off[i]).abs().max().item())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(errors) == 240 and max(errors) <= 1e-5


def test_a_fused_model_deep_copies_and_pickles():
    import pickle

    torch.manual_seed(0)
    model, make_inputs = _bert()
    fuse_qkv(model)
    inputs = make_inputs(torch.Generator().manual_seed(1))
    want = model(**inputs).last_hidden_state
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        attention = other.encoder.layer[0].attention.self
        group = attention.query._qkv_group
        assert group.members == (attention.query, attention.key, attention.value)  # the copy's members
        # ... and one group, so one product: a member with a group of its own computes all three outputs
        assert attention.key._qkv_group is group and attention.value._qkv_group is group
        with FlopCounterMode(display=False) as flops:
            assert (other(**inputs).last_hidden_state - want).abs().max().item() <= 1e-6
        with FlopCounterMode(display=False) as flops_original:
            model(**inputs)
        assert flops.get_total_flops() == flops_original.get_total_flops()
