"""The simulated accelerator: mixed-device errors name the caller, syncs and copies are counted, results
equal the CPU computation, and dry mode walks real-size shapes."""

import copy
import json
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from patchword.testing.simulated_device import DeviceCounts, MixedDeviceError, SimTensor, SimulatedDevice


def _next_line() -> int:
    """The line number after the caller's line."""
    return sys._getframe(1).f_lineno + 1


def _this_line() -> int:
    return sys._getframe(1).f_lineno


def _only_site(counts: DeviceCounts) -> tuple[str, int]:
    [(site, n)] = counts.sync_sites.items()
    return site, n


def _assert_one_sync_at(counts: DeviceCounts, line: int) -> None:
    site, n = _only_site(counts)
    assert counts.syncs == 1 and n == 1
    assert site.endswith(f"test_simulated_device.py:{line}"), site


def test_host_tensor_indexed_by_device_indices_raises_naming_the_line():
    sim = SimulatedDevice()
    with sim:
        index = torch.tensor([0, 2], device=sim.device)
        host = torch.arange(4.0)
        line = _next_line()
        info = pytest.raises(MixedDeviceError, lambda: host[index])
    message = str(info.value)
    assert message.startswith("aten.index.Tensor mixes host and device tensors at ")
    assert f"test_simulated_device.py:{line} " in message
    assert "indices should be either on cpu or on the same device" in message


def test_device_with_host_tensor_raises_but_a_host_scalar_mixes():
    sim = SimulatedDevice()
    with sim:
        x = sim.to_device(torch.tensor([1.0, 2.0, 3.0]))
        line = _next_line()
        info = pytest.raises(MixedDeviceError, lambda: x + torch.ones(3))
        assert str(info.value).startswith("aten.add.Tensor mixes host and device tensors at ")
        assert f"test_simulated_device.py:{line} " in str(info.value)
        with pytest.raises(MixedDeviceError, match="index_select"):
            x.index_select(0, torch.tensor([0, 1]))  # CUDA refuses a host index here (unlike x[index])
        y = x + torch.tensor(10.0)
        assert isinstance(y, SimTensor) and y.device == sim.device
    assert sim.to_host(y).tolist() == [11.0, 12.0, 13.0]


def test_each_host_read_is_one_sync_at_its_line():
    sim = SimulatedDevice()
    with sim:
        t = sim.to_device(torch.tensor([3, 1, 2]))
        reads = []
        for read in ["item", "tolist", "int_max", "cpu", "numpy_force", "bool"]:
            sim.reset()
            if read == "item":
                line, value = _this_line(), t[0].item()
            elif read == "tolist":
                line, value = _this_line(), t.tolist()
            elif read == "int_max":
                line, value = _this_line(), int(t.max())
            elif read == "cpu":
                line, value = _this_line(), t.cpu().tolist()
            elif read == "numpy_force":
                line, value = _this_line(), t.numpy(force=True).tolist()
            else:
                line, value = _this_line(), bool(t[1] == 1)
            reads.append((read, value, sim.counts, line))
    for read, value, counts, line in reads:
        assert value == {"item": 3, "int_max": 3, "bool": True}.get(read, [3, 1, 2]), read
        _assert_one_sync_at(counts, line)


def test_numpy_of_a_device_tensor_raises_like_cuda():
    sim = SimulatedDevice()
    with sim, pytest.raises(MixedDeviceError, match="Tensor.numpy of a device tensor"):
        sim.to_device(torch.ones(2)).numpy()


def test_data_dependent_shape_is_a_sync_and_elementwise_is_one_op():
    sim = SimulatedDevice()
    with sim:
        t = sim.to_device(torch.tensor([0.0, 1.0, 0.0, 2.0]))
        sim.reset()
        doubled = t * 2
        assert (sim.counts.ops, sim.counts.syncs) == (1, 0)
        assert sim.counts.op_names == {"aten.mul.Tensor": 1}
        line = _next_line()
        nonzero = t.nonzero()
        _assert_one_sync_at(sim.counts, line)
        masked = t[t > 0]  # boolean-mask indexing: one more sync
        assert sim.counts.syncs == 2
    assert sim.to_host(doubled).tolist() == [0.0, 2.0, 0.0, 4.0]
    assert sim.to_host(nonzero).tolist() == [[1], [3]]
    assert sim.to_host(masked).tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("read", "syncs"),
    [
        (lambda t: torch.unique(t), 1),
        (lambda t: torch.unique_consecutive(t), 1),
        (lambda t: torch.masked_select(t, t > 0), 1),
        (lambda t: torch.where(t > 0), 1),
        (lambda t: torch.equal(t, t), 1),
        (lambda t: torch.bincount(t.long()), 1),
        (lambda t: torch.repeat_interleave(t.long()), 1),
        (lambda t: torch.repeat_interleave(t.long(), output_size=3), 0),
        (lambda t: torch.sort(t).values, 0),
    ],
)
def test_data_dependent_ops_are_syncs(read, syncs):
    sim = SimulatedDevice()
    t = torch.tensor([0.0, 1.0, 0.0, 2.0])
    with sim:
        device_t = sim.to_device(t)
        sim.reset()
        got = read(device_t)
    assert sim.counts.syncs == syncs
    expected = read(t)
    for g, e in zip(
        got if isinstance(got, tuple) else [got],
        expected if isinstance(expected, tuple) else [expected],
        strict=True,
    ):
        assert g == e if isinstance(e, bool) else torch.equal(sim.to_host(g), e)


def test_device_tensor_indexed_by_host_indices_copies_them_over():
    sim = SimulatedDevice()
    with sim:
        x = sim.to_device(torch.arange(12.0).reshape(4, 3))
        sim.reset()
        index = torch.tensor([3, 0, 3])
        line = _next_line()
        rows = x[index]
        assert (sim.counts.h2d_copies, sim.counts.h2d_bytes) == (1, 3 * 8)
        _assert_one_sync_at(sim.counts, line)
        x[torch.tensor([1])] = sim.to_device(torch.full((1, 3), -1.0))  # index_put_ with a host index
    assert isinstance(rows, SimTensor)
    assert torch.equal(sim.to_host(rows), torch.arange(12.0).reshape(4, 3)[[3, 0, 3]])
    assert sim.to_host(x)[1].tolist() == [-1.0, -1.0, -1.0]


def test_copy_bytes_are_numel_times_element_size():
    sim = SimulatedDevice()
    host = torch.zeros(5, 7, dtype=torch.float16)
    with sim:
        x = sim.to_device(host)
        torch.tensor([[1, 2, 3]], device=sim.device)  # int64, built on the host and copied
        x.to("cpu")
        x.to("cpu", non_blocking=True)  # lands in pinned memory on CUDA: a copy, not a sync
        out = torch.empty(5, 7, dtype=torch.float16)
        out.copy_(x)
        z = torch.zeros(3, device=sim.device)  # made on the device: no copy
    c = sim.counts
    assert (c.h2d_copies, c.h2d_bytes) == (2, 5 * 7 * 2 + 3 * 8)
    assert (c.d2h_copies, c.d2h_bytes) == (3, 3 * 5 * 7 * 2)
    assert c.syncs == 4  # the two blocking uploads and the two blocking copies back
    assert c.op_names["aten.zeros.default"] == 1 and isinstance(z, SimTensor)
    assert json.loads(json.dumps(c.as_dict()))["d2h_bytes"] == 3 * 5 * 7 * 2


def test_host_ops_are_counted_apart():
    sim = SimulatedDevice()
    with sim:
        a = torch.ones(3)
        (a + 1).sum()
    assert (sim.counts.ops, sim.counts.host_ops) == (0, 3)


def _chain(x, w, index):
    """A small scoring-like chain: matmul, softmax, topk, scatter_, index_select, cat, stack, views."""
    s = torch.softmax(x @ w, dim=-1)
    values, positions = torch.topk(s, 2, dim=-1)
    z = torch.zeros_like(s).scatter_(1, positions, values)
    z = torch.cat([z, s.index_select(0, index)], dim=0)
    z = torch.stack([z, z.transpose(0, 1).t() * 2]).expand(2, -1, -1)
    z = z.clone()
    z[:, 0].mul_(3)
    out = torch.empty(0, dtype=z.dtype, device=z.device)
    torch.sum(z, dim=0, out=out)
    return out


def test_results_equal_the_cpu_computation():
    torch.manual_seed(0)
    x, w, index = torch.randn(5, 4), torch.randn(4, 6), torch.tensor([4, 0])
    expected = _chain(x, w, index)
    sim = SimulatedDevice()
    with sim:
        args = sim.to_device(x), sim.to_device(w), sim.to_device(index)
        assert sim.counts.syncs == 3  # blocking uploads: PyTorch waits for the stream after each
        sim.reset()
        got = _chain(*args)
    assert isinstance(got, SimTensor) and got.shape == expected.shape
    assert torch.equal(sim.to_host(got), expected)
    assert sim.counts.syncs == 0


def test_views_alias_their_base_and_inplace_returns_the_argument():
    sim = SimulatedDevice()
    with sim:
        x = sim.to_device(torch.zeros(4, 3))
        view = x[0:2]
        returned = view.add_(1)
        x.transpose(0, 1)[2].fill_(5)
        y = sim.to_device(torch.arange(6.0).reshape(2, 3))
        y.t_()  # in-place metadata change reaches the wrapper
    assert isinstance(view, SimTensor) and returned is view
    ops = sim.counts.ops
    after = y * 2  # outside `with sim:` ops on device tensors still run under the same rules
    assert isinstance(after, SimTensor) and sim.counts.ops == ops + 1
    assert sim.to_host(x).tolist() == [[1, 1, 5], [1, 1, 5], [0, 0, 5], [0, 0, 5]]
    assert y.shape == (3, 2) and y.stride() == sim.to_host(y).stride() == (1, 3)


def test_linear_mse_backward_gives_the_cpu_gradients_on_the_device():
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    x, target = torch.randn(6, 4), torch.randn(6, 3)
    F.mse_loss(cpu_model(x), target).backward()

    sim = SimulatedDevice()
    model = copy.deepcopy(cpu_model)
    model.zero_grad(set_to_none=True)
    with sim:
        assert sim.to_device(model) is model
        assert all(isinstance(p, SimTensor) and p.requires_grad for p in model.parameters())
        model.train()
        loss = F.mse_loss(model(sim.to_device(x)), sim.to_device(target))
        loss.backward()
        model.eval()
        with torch.no_grad():
            assert not model(sim.to_device(x)).requires_grad
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters(), strict=True):
        assert isinstance(p.grad, SimTensor), name
        torch.testing.assert_close(sim.to_host(p.grad), q.grad, rtol=0, atol=0)
    assert sim.counts.syncs == sim.counts.h2d_copies  # the blocking uploads only: nothing else waits


def test_module_to_device_inside_the_mode():
    sim = SimulatedDevice()
    model = nn.Linear(2, 2)
    with sim:
        model.to(sim.device)
    assert isinstance(model.weight, SimTensor) and isinstance(model.weight, nn.Parameter)
    assert sim.counts.h2d_copies == 2


def test_dry_mode_walks_real_sizes_with_counts():
    sim = SimulatedDevice(dry=True, fill=7)
    with sim:
        tokens = torch.empty(5000, 197, 512, device=sim.device)
        proj = sim.to_device(torch.empty(512, 512))
        scores = (tokens @ proj).amax(dim=-1)
        best = scores.max().item()
        host = scores[:2, :3].cpu()
        listed = scores[0, :2].tolist()
        masked = sim.to_device(torch.ones(4))[torch.tensor([True, False, True, False])]  # a host mask is fine
        with pytest.raises(RuntimeError, match="depends on device data"):
            scores.nonzero()
    assert scores.shape == (5000, 197) and sim.to_host(scores).device.type == "meta"
    assert best == 7.0 and listed == [7.0, 7.0] and host.tolist() == [[7.0] * 3] * 2
    assert masked.shape == (2,)
    c = sim.counts
    # syncs: item, .cpu(), tolist, the host mask (a copy and a sync) and the two blocking uploads
    assert (c.h2d_copies, c.d2h_copies, c.syncs) == (3, 2, 6)
    assert c.h2d_bytes == 512 * 512 * 4 + 4 * 4 + 4


def test_a_non_blocking_upload_is_a_copy_but_no_sync():
    sim = SimulatedDevice()
    with sim:
        torch.ones(3).to(sim.device, non_blocking=True)
        assert (sim.counts.h2d_copies, sim.counts.syncs) == (1, 0)
        torch.ones(3).to(sim.device)
        assert (sim.counts.h2d_copies, sim.counts.syncs) == (2, 1)
