"""The device-work model: bytes, FLOPs and call sites of ops on hand-made cases, and what it says about
the accelerator plan of the exhaustive-scoring engine at ViT-B/16 shapes (issue 34)."""

from __future__ import annotations

import pytest
import torch

from patchword.bench.device_work import DeviceWork, Machine, OpWork, modelled_seconds
from patchword.bench.inputs import build_bench_matcher, scoring_inputs, stand_in_lengths
from patchword.eval import score_matrix
from patchword.testing.simulated_device import SimulatedDevice


def test_bytes_flops_and_sites_of_hand_made_ops():
    a, b = torch.ones(1000), torch.ones(1000)
    x, y = torch.ones(8, 16), torch.ones(16, 4)
    work = DeviceWork()
    with work:
        a + b  # noqa: B018
        line_add = _line() - 1
        a.view(10, 100).t()  # views move nothing: not recorded
        a.add_(b)
        x @ y  # noqa: B018
    add, add_, mm = work.ops
    assert (add.name, add.read, add.written, add.flops) == ("add", 8000, 4000, 0)
    assert add.site.endswith(f"test_device_work.py:{line_add}")
    assert (add_.name, add_.read, add_.written) == ("add_", 8000, 4000)
    assert (mm.name, mm.flops) == ("mm", 2 * 8 * 16 * 4)
    assert (mm.read, mm.written) == ((8 * 16 + 16 * 4) * 4, 8 * 4 * 4)


def test_destinations_lists_and_gathers_count_what_the_kernel_moves():
    a, b, c = torch.ones(1000), torch.ones(1000), torch.empty(1000)
    xs, ys = [torch.ones(100), torch.ones(200)], [torch.ones(100), torch.ones(200)]
    table, ids = torch.ones(50, 8), torch.tensor([1, 2, 3])
    q = torch.ones(1, 2, 4, 8)
    work = DeviceWork()
    with work:
        torch.mul(a, b, out=c)  # the destination is written, not read
        c.copy_(a)  # likewise
        torch._foreach_add_(xs, ys)  # the first list is read and written
        torch.nn.functional.embedding(ids, table)  # the rows gathered, not the table
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        a.unsqueeze_(0)  # an in-place view: nothing moves
    mul, copy, foreach, embedding, *attention = work.ops
    assert (mul.name, mul.read, mul.written) == ("mul", 8000, 4000)
    assert (copy.name, copy.read, copy.written) == ("copy_", 4000, 4000)
    assert (foreach.name, foreach.read, foreach.written) == ("_foreach_add_", 2400, 1200)
    assert (embedding.read, embedding.written) == (3 * 8 + 3 * 8 * 4, 3 * 8 * 4)
    assert sum(op.flops for op in attention) == 2 * (2 * 1 * 2 * 4 * 8 * 4)  # QK^T and PV
    assert all(op.name != "unsqueeze_" for op in work.ops)


def test_backward_ops_are_attributed_to_the_backward_call():
    w = torch.ones(4, 4, requires_grad=True)
    work = DeviceWork()
    with work:
        loss = (w * 2).sum()
        forward = len(work.ops)
        loss.backward()
        line = _line() - 1
    assert forward == 2 and len(work.ops) > forward
    assert all(op.site.endswith(f"test_device_work.py:{line}") for op in work.ops[forward:])


def test_modelled_seconds_is_the_roofline_of_each_op():
    machine = Machine("toy", bandwidth=1e9, flops_16bit=4e12, flops_32bit=1e12, kernel_floor_s=1e-6)
    memory_bound = OpWork("add", 6000, 3000, 0, torch.float32, "x")  # 9 us of memory
    fp32_gemm = OpWork("mm", 100, 100, 5_000_000, torch.float32, "x")  # 5 us of arithmetic
    bf16_gemm = OpWork("mm", 100, 100, 5_000_000, torch.bfloat16, "x")  # 1.25 us
    assert modelled_seconds([memory_bound], machine) == pytest.approx(10e-6)
    assert modelled_seconds([fp32_gemm, bf16_gemm], machine) == pytest.approx(6e-6 + 2.25e-6)


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


def _modelled_scoring(config: str, n_img: int, n_cap_images: int) -> tuple[float, float]:
    """(modelled H100 us per pair, KB per pair) of the accelerator plan, walked dry at ViT-B/16 shapes."""
    cap_lens, dense_lens = stand_in_lengths()
    img, caps, lens, dense, dlens, t2i = scoring_inputs(n_cap_images, cap_lens, dense_lens)
    matcher = build_bench_matcher(config)
    caption_tied = matcher.dense_pairing == "caption"
    if not caption_tied:
        dense, dlens = dense[:n_img], dlens[:n_img]
    sim, work = SimulatedDevice(dry=True), DeviceWork()
    with sim:
        sim.to_device(matcher)
        with work:
            score_matrix(
                matcher,
                img[:n_img],
                caps,
                lens,
                dense,
                dlens,
                txt2img=t2i if caption_tied else None,
                max_memory_mb=32768,
                device=sim.device,
                progress=False,
            )
    pairs = n_img * caps.shape[0]
    return modelled_seconds(work.ops) / pairs * 1e6, sum(op.bytes for op in work.ops) / pairs / 1e3


@pytest.mark.parametrize(
    "config, us_bound, kb_bound",
    # f07ac7d (one formulation for every caption block, the words copied once per image): 0.454 us and
    # 760 KB (caption-tied), 0.342 us and 521 KB (image-tied) per pair; now 0.373 / 548 and 0.286 / 417
    [("seps-code-caption", 0.41, 650), ("seps-code-image", 0.31, 470)],
)
def test_the_accelerator_plan_moves_fewer_bytes_per_pair(config, us_bound, kb_bound):
    """64 images x 2000 captions (stand-in lengths): caption blocks pick their formulation by their own
    width (short length buckets take "gram"), and dense texts longer than the token set multiply the
    tokens, not a copy of the words per image. Counted from shapes: the same on every CPU."""
    us, kb = _modelled_scoring(config, 64, 400)
    assert us < us_bound and kb < kb_bound
