"""The Hugging Face text encoder under ``torch.compile``: its attention sees key lengths padded to a
multiple of 16 (an unaligned masked attention lowers to the float32 "math" attention on a GPU: measured
on an H100, docs/benchmarks.md), and its output is the eager one."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from patchword.encoders.hf import HFTextEncoder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _encoder(max_positions: int) -> HFTextEncoder:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
    )
    return HFTextEncoder(config, embed_dim=16).eval()


def _batch(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, length) ids, padded with 0 after each row's length, and the (3,) lengths."""
    g = torch.Generator().manual_seed(1)
    lens = torch.tensor([length, length // 2, 3])
    ids = torch.randint(5, 50, (3, length), generator=g)
    ids[torch.arange(length) >= lens[:, None]] = 0
    return ids, lens


def _compiled_key_lengths(encoder, ids, lens) -> tuple[list[int], torch.Tensor]:
    """The key lengths of every attention in the traced graph, and the compiled encoder's output."""
    seen: list[int] = []

    def recording_backend(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target is torch.nn.functional.scaled_dot_product_attention:
                seen.append(node.args[1].meta["example_value"].shape[-2])
        return graph_module.forward

    torch._dynamo.reset()
    try:
        out = torch.compile(encoder, backend=recording_backend, fullgraph=True)(ids, lens)
    finally:
        torch._dynamo.reset()
    return seen, out


@pytest.mark.parametrize(("length", "max_positions", "keys"), [(35, 64, 48), (48, 64, 48), (35, 40, 40)])
def test_a_compiled_text_encoder_pads_attention_keys_to_a_multiple_of_16(length, max_positions, keys):
    encoder = _encoder(max_positions)
    ids, lens = _batch(length)
    seen, out = _compiled_key_lengths(encoder, ids, lens)
    # two layers; a length past the position embeddings is not padded further (40 = max_positions)
    assert seen == [keys, keys]
    with torch.no_grad():
        eager = encoder(ids, lens)
    assert out.shape == eager.shape == (3, length, 16)
    valid = torch.arange(length) < lens[:, None]
    torch.testing.assert_close(out[valid], eager[valid], rtol=0, atol=1e-5)


def test_the_eager_text_encoder_attends_over_the_given_length():
    encoder = _encoder(64)
    ids, lens = _batch(35)
    seen: list[int] = []

    def record(module, args, kwargs, output):
        seen.append(kwargs["attention_mask"].shape[-1])

    handle = encoder.backbone.register_forward_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            encoder(ids, lens)
    finally:
        handle.remove()
    assert seen == [35]  # eager attention kernels pad their masks themselves: no extra positions
