"""The simulated accelerator: mixed-device errors name the caller, syncs and copies are counted, results
equal the CPU computation, and dry mode walks real-size shapes.

Over 400 lines: each device rule (host scalars, packed sequences, copies, syncs) is checked next to the
others it must agree with, against the same CUDA behaviour.
"""

import copy
import json
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from patchword.testing.simulated_device import DeviceCounts, MixedDeviceError, SimTensor, SimulatedDevice

pytestmark = pytest.mark.usefixtures("one_thread")


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


def _sites_by_file(counts: DeviceCounts) -> dict[str, int]:
    by_file: dict[str, int] = {}
    for site, n in counts.sync_sites.items():
        name = site.rsplit("/", 1)[-1].split(":")[0]
        by_file[name] = by_file.get(name, 0) + n
    return by_file


def test_pack_padded_sequence_takes_host_lengths_and_keeps_batch_sizes_on_the_host():
    """CUDA requires the lengths on the CPU and returns batch_sizes there (PackedSequence.cpp); the
    simulator refused host lengths as a mixed-device op, so no GRU model could run on it."""
    x = torch.arange(24.0).reshape(3, 4, 2)
    lengths = torch.tensor([4, 2, 3])
    want_packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    want_padded, want_lengths = pad_packed_sequence(want_packed, batch_first=True)
    sim = SimulatedDevice()
    with sim:
        device_x = sim.to_device(x)
        sim.reset()
        pack_line = _next_line()
        packed = pack_padded_sequence(device_x, lengths, batch_first=True, enforce_sorted=False)
        pad_line = _next_line()
        padded, padded_lengths = pad_packed_sequence(packed, batch_first=True)
    assert isinstance(packed.data, SimTensor) and torch.equal(sim.to_host(packed.data), want_packed.data)
    assert type(packed.batch_sizes) is torch.Tensor and packed.batch_sizes.tolist() == [3, 3, 2, 1]
    assert torch.equal(sim.to_host(padded), want_padded)
    assert type(padded_lengths) is torch.Tensor and torch.equal(padded_lengths, want_lengths)
    # enforce_sorted=False: PyTorch uploads the sort order (3 int64) and reads the inverse back in
    # pad_packed_sequence (`lengths[unsorted_indices.cpu()]`): one blocking copy each way, as on CUDA.
    c = sim.counts
    assert (c.h2d_copies, c.h2d_bytes, c.d2h_copies, c.d2h_bytes) == (1, 24, 1, 24)
    assert {s.rsplit(":", 1)[1]: n for s, n in c.sync_sites.items()} == {str(pack_line): 1, str(pad_line): 1}
    sim.reset()
    with sim:  # sorted lengths: nothing crosses
        pad_packed_sequence(pack_padded_sequence(device_x, torch.tensor([4, 3, 2]), batch_first=True))
    assert (sim.counts.syncs, sim.counts.h2d_copies, sim.counts.d2h_copies) == (0, 0, 0)


def test_pack_padded_sequence_refuses_device_lengths_like_cuda():
    """PyTorch does not move device lengths over: CUDA raises "'lengths' argument should be a 1D CPU
    int64 tensor" (the simulator raised an unrelated "batch_sizes should always be on CPU")."""
    sim = SimulatedDevice()
    with sim:
        x = sim.to_device(torch.ones(2, 3, 4))
        lengths = sim.to_device(torch.tensor([3, 2]))
        line = _next_line()
        info = pytest.raises(MixedDeviceError, lambda: pack_padded_sequence(x, lengths, batch_first=True))
    assert "'lengths' argument should be a 1D CPU int64 tensor" in str(info.value)
    assert f"test_simulated_device.py:{line} " in str(info.value)


def test_dry_mode_packs_by_the_values_of_host_lengths():
    """The lengths decide the packed shapes: a dry walk reads them (not a cache keyed by their shape)."""
    sim = SimulatedDevice(dry=True)
    with sim:
        x = torch.empty(3, 5, 2, device=sim.device)
        for lengths, batch_sizes in (([5, 3, 1], [3, 2, 2, 1, 1]), ([2, 2, 2], [3, 3])):
            packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first=True)
            assert packed.batch_sizes.tolist() == batch_sizes
            assert packed.data.shape == (sum(lengths), 2) and isinstance(packed.data, SimTensor)


def test_a_gru_over_packed_sequences_trains_on_the_device_with_cudas_syncs():
    """pack -> bidirectional GRU -> pad, forward and backward: the CPU outputs and gradients; the only
    syncs are PyTorch's own two copies of the sort order (none in the GRU or in backward)."""
    torch.manual_seed(0)
    gru = nn.GRU(2, 3, batch_first=True, bidirectional=True)
    x, lengths = torch.randn(3, 4, 2), torch.tensor([2, 4, 3])

    def run(rnn, inputs):
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=4)
        out.pow(2).sum().backward()
        return out

    want = run(gru, x)
    device_gru = copy.deepcopy(gru)
    device_gru.zero_grad(set_to_none=True)
    sim = SimulatedDevice()
    with sim:
        sim.to_device(device_gru)
        device_x = sim.to_device(x)
        sim.reset()
        got = run(device_gru, device_x)
    torch.testing.assert_close(sim.to_host(got), want, rtol=0, atol=1e-6)
    for p, q in zip(device_gru.parameters(), gru.parameters(), strict=True):
        torch.testing.assert_close(sim.to_host(p.grad), q.grad, rtol=0, atol=1e-6)
    assert (sim.counts.syncs, sim.counts.h2d_copies, sim.counts.d2h_copies) == (2, 1, 1)


def test_bigru_text_encoder_runs_on_the_device_and_counts_its_length_reads():
    """BiGRUTextEncoder (SCAN's text side) on the device: the CPU output; its host reads of device
    lengths are counted where they happen (check_lengths' max/min, ``lens.cpu()``)."""
    from patchword.encoders.rnn import BiGRUTextEncoder, GRUTextConfig

    torch.manual_seed(0)
    enc = BiGRUTextEncoder(GRUTextConfig(vocab_size=20, word_dim=6, embed_dim=5)).eval()
    ids, lens = torch.tensor([[3, 4, 0, 0], [5, 6, 7, 8], [9, 2, 1, 0]]), torch.tensor([2, 4, 3])
    want = enc(ids, lens)
    sim = SimulatedDevice()
    with sim:
        sim.to_device(enc)
        device_ids, device_lens = sim.to_device(ids), sim.to_device(lens)
        sim.reset()
        got = enc(device_ids, device_lens)
    torch.testing.assert_close(sim.to_host(got), want, rtol=0, atol=1e-6)
    # rnn.py: lens.cpu() only (3 int64), the one read packing needs; elsewhere only check_lengths' reads of
    # the lengths' values. (pack_padded_sequence(enforce_sorted=False) added an upload of its sort order and
    # a read of its inverse: the encoder sorts on each side itself.)
    by_file = _sites_by_file(sim.counts)
    assert by_file.pop("rnn.py") == 1 and set(by_file) <= {"_validation.py"}
    assert (sim.counts.h2d_copies, sim.counts.d2h_copies, sim.counts.d2h_bytes) == (0, 1, 3 * 8)


def test_bigru_sorting_itself_matches_packing_unsorted_and_keeps_gradients():
    """The encoder's own longest-first sort gives the outputs and gradients of
    ``pack_padded_sequence(enforce_sorted=False)`` (ties in length included), lengths on host or device."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from patchword.encoders.rnn import BiGRUTextEncoder, GRUTextConfig

    torch.manual_seed(0)
    enc = BiGRUTextEncoder(GRUTextConfig(vocab_size=20, word_dim=6, embed_dim=5)).eval()
    ids = torch.randint(1, 20, (6, 5))
    lens = torch.tensor([2, 5, 2, 1, 5, 3])
    packed = pack_padded_sequence(enc.embed(ids), lens, batch_first=True, enforce_sorted=False)
    want, _ = pad_packed_sequence(enc.rnn(packed)[0], batch_first=True, total_length=5)
    want = (want[..., :5] + want[..., 5:]) / 2
    for given in (lens, lens.tolist()):
        got = enc(ids, given)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    got.sum().backward()
    grad = enc.embed.weight.grad.clone()
    enc.zero_grad()
    want.sum().backward()
    torch.testing.assert_close(grad, enc.embed.weight.grad, rtol=0, atol=1e-6)


def _host0d(kind: str) -> torch.Tensor:
    return torch.tensor(1) if kind == "index" else torch.tensor(1.0)


@pytest.mark.parametrize(
    ("name", "kind", "op"),
    [
        ("aten.stack", "value", lambda d, h: torch.stack([d[0], h])),
        ("aten.index_select", "index", lambda d, h: d.index_select(0, h)),
        ("aten.take", "index", lambda d, h: torch.take(d, h)),
        ("aten.embedding", "index", lambda d, h: F.embedding(h, d[:, None])),
        ("aten.searchsorted", "value", lambda d, h: torch.searchsorted(d, h)),
        ("aten.add_", "value", lambda d, h: h.add_(d[0])),  # a written host scalar is no operand
    ],
)
def test_a_0dim_host_tensor_outside_an_elementwise_op_raises_naming_the_line(name, kind, op):
    """CUDA takes a 0-dim CPU tensor only as a scalar operand of a TensorIterator op; the simulator let
    every 0-dim host tensor through (``torch.stack([dev0d, host0d])`` passed)."""
    sim = SimulatedDevice()
    with sim:
        device = sim.to_device(torch.tensor([0.5, 1.5, 2.5]))
        info = pytest.raises(MixedDeviceError, lambda: op(device, _host0d(kind)))
    message = str(info.value)
    line = op.__code__.co_firstlineno  # the op's own line, in the list above
    assert message.startswith(f"{name}.") and f"test_simulated_device.py:{line} " in message
    assert "only as a scalar operand of an elementwise op" in message


@pytest.mark.parametrize(
    ("op", "h2d_copies"),
    [
        (lambda d, h: d + h, 0),
        (lambda d, h: h * d, 0),
        (lambda d, h: torch.clamp(d, min=h), 0),
        (lambda d, h: d.masked_fill(d > 1, h), 0),  # CUDA reads the value with item() on the host
        (lambda d, h: d.clone().fill_(h), 0),
        (lambda d, h: torch.where(d > 1, d, h), 1),  # where_self_out copies it over: a sync
        (lambda d, h: d.clone().index_put_((torch.tensor([0, 2]),), h), 2),  # host index and value
    ],
)
def test_a_0dim_host_scalar_joins_elementwise_ops_and_where_copies_it(op, h2d_copies):
    host = torch.tensor(2.0)
    want = op(torch.tensor([0.5, 1.5, 2.5]), host)
    sim = SimulatedDevice()
    with sim:
        device = sim.to_device(torch.tensor([0.5, 1.5, 2.5]))
        sim.reset()
        got = op(device, host)
    assert torch.equal(sim.to_host(got), want)
    assert (sim.counts.h2d_copies, sim.counts.syncs) == (h2d_copies, min(h2d_copies, 1))


def test_assigning_a_number_is_a_host_scalar_as_on_cuda():
    """On CUDA ``x[i] = 0.0`` makes the number a CPU tensor (THPVariable_setitem): a device mask turns
    the assignment into masked_fill_ (no sync), device indices copy the value over (a sync)."""
    sim = SimulatedDevice()
    with sim:
        x = sim.to_device(torch.tensor([0.5, 1.5, 2.5]))
        index = sim.to_device(torch.tensor([0]))
        sim.reset()
        x[x > 1] = -1.0
        assert (sim.counts.syncs, sim.counts.h2d_copies) == (0, 0)
        line = _next_line()
        x[index] = 7.0
        _assert_one_sync_at(sim.counts, line)
        assert (sim.counts.h2d_copies, sim.counts.h2d_bytes) == (1, 4)
    assert sim.to_host(x).tolist() == [7.0, -1.0, -1.0]
