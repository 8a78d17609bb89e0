"""What a piece of code asks of a GPU's memory and arithmetic units, counted on the CPU (issue 34).

Op and sync counts (:mod:`patchword.testing.simulated_device`) tell whether code is launch-bound. Once it
is not, a GPU's time is set by each kernel's bytes and FLOPs: :class:`DeviceWork` is a dispatch mode that
records, for every aten op, the bytes it reads and writes (its tensor arguments and outputs; views and
metadata-only ops move nothing), its FLOPs (``torch.utils.flop_counter``'s formulas: matrix products,
convolutions, attention) and the line of the caller that issued it. :func:`modelled_seconds` turns the
records into a roofline estimate: per op ``max(bytes / bandwidth, FLOPs / peak) + a per-kernel floor``.

The constants of :data:`H100` are not the data sheet's peaks but rates an H100 reached on this project's
work (docs/benchmarks.md, "Device work"): 2.8 TB/s, 515 TFLOP/s on bf16 products (a training step's
12.4 TFLOP in ~24 ms of products and attention), 45 TFLOP/s in fp32. With them the model gave 37.9 / 51.8 s
for COCO 5K image- / caption-tied SEPS scoring (measured 44.0 / 65.4 s) and 72.8 ms of kernels for a
ViT-B/16 + BERT-base training step (measured 70.2 ms). It is a guide for choosing between formulations,
not a measurement: caches, kernel choices and overlap are not modelled, and an elementwise op counts
every argument as read once.

Usage (the mode goes inside a :class:`~patchword.testing.simulated_device.SimulatedDevice` to see the
accelerator plan; ``dry=True`` walks real sizes without arithmetic)::

    work = DeviceWork()
    with sim, work:
        score_matrix(matcher, ..., device=sim.device)
    modelled_seconds(work.ops), work.by_site()
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from patchword.testing.simulated_device import call_site

__all__ = ["H100", "DeviceWork", "Machine", "OpWork", "modelled_seconds"]

# Ops that move no data besides their views: allocation without initialisation, scalar reads, profiler
# markers. (Views, including in-place ones such as ``squeeze_``, are recognised from their schema.)
_NO_DATA = frozenset(
    ["empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "_local_scalar_dense"]
    + ["_unsafe_view", "_reshape_alias"]
    + ["_record_function_enter", "_record_function_enter_new", "_record_function_exit", "lift_fresh"]
)
# In-place ops that overwrite their first argument without reading it.
_WRITE_ONLY = frozenset(
    ["copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_"]
    + ["geometric_", "cauchy_", "log_normal_"]
)
_aten = torch.ops.aten
# FLOPs of the CPU attention kernels, which the flop counter's registry does not list (the CUDA ones it
# does): the same formulas as scaled_dot_product_attention's.
_EXTRA_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: lambda a: flop_counter.sdpa_flop_count(
        a[0].shape, a[1].shape, a[2].shape
    ),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda a: (
        flop_counter.sdpa_backward_flop_count(a[0].shape, a[1].shape, a[2].shape, a[3].shape)
    ),
}


@dataclass(frozen=True)
class Machine:
    """Sustained rates of one accelerator: bytes/s, FLOP/s of 16-bit and 32-bit products, and the
    shortest time a kernel takes (launch and tail)."""

    name: str
    bandwidth: float
    flops_16bit: float
    flops_32bit: float
    kernel_floor_s: float


H100 = Machine("NVIDIA H100 (rates measured on this project's work)", 2.8e12, 515e12, 45e12, 2.5e-6)


@dataclass(frozen=True)
class OpWork:
    """One aten op: its name, bytes read and written, FLOPs, output dtype and issuing ``path:line``
    (:func:`~patchword.testing.simulated_device.call_site`: a backward op's is the line that called
    ``backward()``, ``<unknown>`` when the autograd engine runs it on a thread of its own)."""

    name: str
    read: int
    written: int
    flops: int
    dtype: torch.dtype | None
    site: str

    @property
    def bytes(self) -> int:
        return self.read + self.written


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _flops(func, args, kwargs, out) -> int:
    extra = _EXTRA_FLOPS.get(func.overloadpacket)
    if extra is not None:
        return int(extra(args))
    formula = flop_counter.flop_registry.get(func.overloadpacket)
    # The registered formulas read shapes from the arguments and the output (``out_val``).
    return 0 if formula is None else int(formula(*args, **kwargs, out_val=out))


def _returns_view(schema) -> bool:
    returns = [r.alias_info for r in schema.returns]
    return bool(returns) and all(a is not None and not a.is_write for a in returns)


@functools.cache
def _is_view(func) -> bool:
    """Whether ``func`` returns a view of an argument, or is the in-place form of an op that does
    (``squeeze_``, ``t_``: they only change metadata)."""
    if _returns_view(func._schema):
        return True
    name = func.overloadpacket.__name__
    packet = getattr(_aten, name[:-1], None) if name.endswith("_") and not name.endswith("__") else None
    overload = getattr(packet, func._overloadname, None) if packet is not None else None
    return overload is not None and _returns_view(overload._schema)


def _traffic(func, args, kwargs, out) -> tuple[int, int] | None:
    """(bytes read, bytes written) of one op from its schema, or None for an op that moves no data.

    Arguments are read, except ``out=`` destinations and the first argument of ``_WRITE_ONLY`` ops;
    arguments the schema marks as written (in place, ``out=``, the lists of ``_foreach_*`` and fused
    optimizer ops) are written; outputs are written unless they alias an argument (views, in-place and
    ``out=`` results)."""
    schema = func._schema
    name = func.overloadpacket.__name__
    if _is_view(func):
        return None
    read = written = 0
    values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args) :]]
    for position, (arg, value) in enumerate(zip(schema.arguments, values, strict=False)):
        size = sum(_nbytes(t) for t in _tensors(value))
        writes = arg.alias_info is not None and arg.alias_info.is_write
        if not (arg.is_out or (position == 0 and name in _WRITE_ONLY)):
            read += size
        if writes:
            written += size
    aliasing = [r.alias_info is not None for r in schema.returns]
    outputs = out if isinstance(out, (list, tuple)) else (out,)
    for value, aliases in zip(outputs, aliasing, strict=False):
        if not aliases:
            written += sum(_nbytes(t) for t in _tensors(value))
    if name == "embedding":  # reads the rows it gathers, not the whole table
        read = _nbytes(args[1]) + written
    return read, written


class DeviceWork(TorchDispatchMode):
    """Records an :class:`OpWork` for every aten op run while active (``ops``, in order).

    Bytes are the full sizes of the tensors an op reads and writes, as its schema says (:func:`_traffic`);
    an expanded argument counts its expanded size, as a kernel reading it through stride 0 issues those
    loads (mostly from cache). Views and allocations are not recorded.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpWork] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        traffic = None if name in _NO_DATA else _traffic(func, args, kwargs, out)
        if traffic is None:
            return out
        outputs = list(_tensors(out))
        dtype = outputs[0].dtype if outputs else None
        flops = _flops(func, args, kwargs, out)
        self.ops.append(OpWork(name, *traffic, flops, dtype, call_site()))
        return out

    def by(self, key, machine: Machine = H100) -> list[tuple[object, int, int, int, float]]:
        """``(key, ops, bytes, FLOPs, modelled seconds)`` per ``key(op)``, the most expensive first."""
        rows = defaultdict(lambda: [0, 0, 0, 0.0])
        for op in self.ops:
            row = rows[key(op)]
            row[0] += 1
            row[1] += op.bytes
            row[2] += op.flops
            row[3] += modelled_seconds([op], machine)
        return sorted(((k, *v) for k, v in rows.items()), key=lambda r: -r[4])

    def by_site(self, machine: Machine = H100):
        return self.by(lambda op: op.site, machine)

    def by_op(self, machine: Machine = H100):
        return self.by(lambda op: (op.name, str(op.dtype).replace("torch.", "")), machine)


def modelled_seconds(ops: list[OpWork], machine: Machine = H100) -> float:
    """Roofline time of ``ops`` run one after another on ``machine``: per op the longer of its memory
    time and its arithmetic time (16-bit rate for 16-bit outputs), plus the machine's kernel floor."""
    total = 0.0
    for op in ops:
        peak = machine.flops_16bit if op.dtype in (torch.bfloat16, torch.float16) else machine.flops_32bit
        total += max(op.bytes / machine.bandwidth, op.flops / peak) + machine.kernel_floor_s
    return total
