"""A simulated accelerator for CPU tests: cross-device mistakes raise, GPU-relevant costs are counted.

The scoring engine runs on GPUs, but development and CI have only CPUs. :class:`SimulatedDevice` stands
in for the GPU: its tensors (:class:`SimTensor`) report ``device.type == "meta"`` and keep their data in
a wrapped CPU tensor, and while it is active (``with sim:``) a dispatch mode sees every aten op, factory
ops included. Each op runs on the wrapped CPU tensors, so results equal the CPU computation, and:

* an op mixing device tensors with host tensors raises :class:`MixedDeviceError` naming the op and the
  first caller line outside torch, as CUDA would refuse it. CUDA's exceptions are followed: a 0-dim host
  tensor is a scalar operand of an elementwise (TensorIterator) op (``x + torch.tensor(2.)``) and the
  value of ``masked_fill``/``fill_``/``index_put_``, but not an input of ``cat``, ``stack``,
  ``index_select``, ``gather``, ``embedding``, ...; ``where`` and ``index_put_`` copy such a scalar over
  (a copy plus a sync). A device tensor indexed by host indices (``aten.index``, ``index_put_``) is
  allowed and counted as a copy plus a sync; ``x[i] = 0.0`` assigns a host scalar, as on CUDA.
  PackedSequence ops keep lengths and ``batch_sizes`` on the host by design: ``pack_padded_sequence``
  takes CPU lengths (device lengths raise, as on CUDA) and returns a host ``batch_sizes``;
* host<->device copies (``.to``, ``.cpu()``, ``copy_``, ``torch.tensor(..., device=dev)``) are counted
  with their bytes, the bytes of the host-side tensor;
* host syncs are counted with their call site: ``item()``/``int()``/``bool()``, ``tolist()``,
  ``numpy(force=True)``, blocking copies in either direction (PyTorch waits for the stream after them), and
  ops whose output shape depends on device data (``nonzero``, ``masked_select``, boolean-mask indexing,
  ``unique*``, ``bincount``, ``repeat_interleave`` without ``output_size``) or return a Python value
  (``equal``, ``allclose``, ``is_nonzero``). ``numpy()`` of a device tensor raises, as on CUDA;
  ``numpy(force=True)`` copies.

With ``dry=True`` the wrapped tensors are ``meta`` tensors (shapes only), so real-size problems can be
walked for their op, copy and sync counts in seconds (meta outputs are cached by the inputs' metadata:
about 40 us an op); what a sync reads is built from ``fill``, and ops with data-dependent shapes raise.

Counting rule: ``ops`` counts each aten op the mode sees with a device input or a device output
(factory ops with ``device=meta``), once: the op then runs below the mode, so its internal
decompositions are not seen again. CompositeImplicitAutograd ops (``linear``, ``matmul`` of 3-d inputs,
``einsum``, ...) decompose above the dispatcher and are counted as the ops they decompose into, which is
what a CUDA build launches as well. Metadata-only ops (``view``, ``t``, ``detach``) count like the rest;
``op_names`` tells them apart.

What it cannot see: CUDA streams, asynchronous execution and memory limits; ops inside custom C++/CUDA
extensions; device-specific kernel choices (SDPA backends, TF32); ``repr()`` of a SimTensor (uncounted,
while printing a CUDA tensor syncs); and host syncs hidden inside an op's CUDA kernel that are not in the
list above (``histc`` without a range, ...); the one-CPU-scalar limit of some TensorIterator kernels; an
op that copies several host tensors over counts one sync, not one per copy. The device is ``meta``, so a
plain meta tensor made outside the simulated device (shape inference with ``torch.device("meta")``)
cannot join its ops.

Over 400 lines: the tensor subclass, its dispatch rules and its counters share one state and are read
together.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

__all__ = ["DeviceCounts", "MixedDeviceError", "SimTensor", "SimulatedDevice", "call_site"]

_DEVICE = torch.device("meta")
_HOST = torch.device("cpu")
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_THIS_FILE = os.path.abspath(__file__)
# Dispatch modes that may run above this one (their frames are not the caller of an op).
_MODE_FILES = (
    _THIS_FILE,
    os.path.join(os.path.dirname(os.path.dirname(_THIS_FILE)), "bench", "device_work.py"),
)

aten = torch.ops.aten

# CUDA accepts host index tensors here (it copies them over), as long as `self` is on the device.
_HOST_INDEX_OPS = {
    aten.index,
    aten.index_put,
    aten.index_put_,
    aten._index_put_impl_,
    aten._unsafe_index,
    aten._unsafe_index_put,
}
# Ops that read device data on the host: their answer (a Python value) or their output shape.
_SCALAR_SYNC_OPS = {aten._local_scalar_dense, aten.equal, aten.allclose, aten.is_nonzero}
_SHAPE_SYNC_OPS = {
    aten.nonzero,
    aten.masked_select,
    aten._unique,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.unique_dim_consecutive,
    aten.bincount,  # sizes its output from the maximum
}
_REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
# Python-level constructors that build a meta tensor directly, never reaching the dispatcher.
_DATA_CONSTRUCTORS = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}

# Arguments a CUDA kernel reads on the host by design (PackedSequence.cpp's checkLongTensor: "'lengths'
# argument should be a 1D CPU int64 tensor"; cudnn takes batch_sizes as a host array). Only
# `_pack_padded_sequence` reaches the mode in PyTorch 2.x; the others decompose above it (their parts are
# device ops, batch_sizes is read in C++) and are listed for a build that dispatches them whole.
_HOST_ARGUMENTS = {
    aten._pack_padded_sequence: "lengths",
    aten._pad_packed_sequence: "batch_sizes",
    aten._pack_padded_sequence_backward: "batch_sizes",
    aten.gru: "batch_sizes",
    aten.lstm: "batch_sizes",
    aten.rnn_tanh: "batch_sizes",
    aten.rnn_relu: "batch_sizes",
}
# Returns that stay on the host: the packed `batch_sizes` and the padded `lengths`.
_HOST_RETURNS = {aten._pack_padded_sequence: 1, aten._pad_packed_sequence: 1}
# Non-elementwise ops whose CUDA kernel takes a 0-dim host value: read with `item()` on the host
# (masked_fill, fill_) or copied to the device (index_put_, see `_host_scalars`).
_HOST_SCALAR_ARGUMENTS = {
    aten.masked_fill: "value",
    aten.masked_fill_: "value",
    aten.fill: "value",
    aten.fill_: "value",
    aten.index_put: "values",
    aten.index_put_: "values",
    aten._index_put_impl_: "values",
    aten._unsafe_index_put: "values",
}

_CUDA_HINTS = {
    aten.index: "indices should be either on cpu or on the same device as the indexed tensor",
    aten.index_select: "Input, output and indices must be on the current device",
}
_SAME_DEVICE_HINT = "Expected all tensors to be on the same device, but found at least two devices"
_SCALAR_HINT = "a 0-dim host tensor joins a device op only as a scalar operand of an elementwise op"
_HOST_ARGUMENT_HINT = "'lengths' argument should be a 1D CPU int64 tensor"


class MixedDeviceError(RuntimeError):
    """An op mixes host and device tensors in a way CUDA refuses."""


@dataclass
class DeviceCounts:
    """What a :class:`SimulatedDevice` has seen since it was made or last reset."""

    ops: int = 0
    host_ops: int = 0
    syncs: int = 0
    h2d_copies: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    sync_sites: Counter = field(default_factory=Counter)
    op_names: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        """Plain values for JSON; ``sync_sites`` and ``op_names`` as their ten most common ``[name, n]``."""
        out = {k: v for k, v in vars(self).items() if not isinstance(v, Counter)}
        out["sync_sites"] = [[k, n] for k, n in self.sync_sites.most_common(10)]
        out["op_names"] = [[k, n] for k, n in self.op_names.most_common(10)]
        return out


def call_site() -> str:
    """``path:line`` of the innermost frame outside torch and the counting modes (this file and
    :mod:`patchword.bench.device_work`), the path relative to the cwd when below it."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not (path.startswith(_TORCH_DIR) or path in _MODE_FILES or frame.f_code.co_filename[0] == "<"):
            relative = os.path.relpath(path)
            return f"{path if relative.startswith('..') else relative}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def _leaves(args, kwargs) -> list:
    """The arguments of an aten op, ``Tensor[]``/``Tensor?[]`` lists opened (they nest no deeper); faster
    than pytree, which the per-op cost of a dry walk over a whole dataset notices."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


def _unwrap(x):
    if isinstance(x, SimTensor):
        return x.elem
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _meta_key(x):
    """Hashable description of an argument: a tensor's metadata, a scalar with its type (1, 1.0 and True
    hash alike but promote differently)."""
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.layout)
    if isinstance(x, (list, tuple)):
        return tuple(_meta_key(v) for v in x)
    return (type(x), x)


def _meta_spec(out):
    """How to rebuild ``out`` from its metadata, or ``None`` when it is not a plain fresh tensor."""
    if isinstance(out, torch.Tensor):
        if out.layout != torch.strided or out.storage_offset() != 0:
            return None
        return (out.shape, out.stride(), out.dtype)
    if isinstance(out, (list, tuple)):
        specs = [_meta_spec(o) for o in out]
        return None if any(s is None for s in specs) else (type(out), specs)
    return None


def _from_spec(spec):
    if isinstance(spec[0], torch.Size):
        return torch.empty_strided(spec[0], spec[1], dtype=spec[2], device=_DEVICE)
    return spec[0](_from_spec(s) for s in spec[1])


@functools.cache
def _op_name(func) -> str:
    return str(func)


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


@functools.cache
def _alias_plan(func) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    """From the op's schema: (return, argument) pairs that a view shares, and the arguments that the
    returns of an in-place or ``out=`` op are (as ``(position, name)``)."""
    arguments, returns = func._schema.arguments, func._schema.returns
    views, writes = [], []
    for r, ret in enumerate(returns):
        if ret.alias_info is None:
            continue
        for a, arg in enumerate(arguments):
            if arg.alias_info is None or not set(ret.alias_info.before_set) & set(arg.alias_info.before_set):
                continue
            position = -1 if arg.kwarg_only else a
            if arg.alias_info.is_write:
                writes.append((position, arg.name))
            else:
                views.append((r, position, arg.name))
    return views, writes


@functools.cache
def _argument_position(func, name: str) -> int | None:
    """Where the schema argument ``name`` goes (-1: keyword-only), ``None`` when the op has none."""
    for position, arg in enumerate(func._schema.arguments):
        if arg.name == name:
            return -1 if arg.kwarg_only else position
    return None


def _argument(func, args, kwargs, name: str):
    """The value passed for the schema argument ``name`` (``None`` when absent or defaulted)."""
    position = _argument_position(func, name)
    if position is None:
        return None
    return args[position] if 0 <= position < len(args) else kwargs.get(name)


def _written(func, args, kwargs) -> list:
    """The arguments an in-place or ``out=`` op writes."""
    return [args[p] if 0 <= p < len(args) else kwargs.get(n) for p, n in _alias_plan(func)[1]]


@functools.cache
def _takes_host_scalars(func) -> bool:
    """Whether CUDA runs ``func`` as a TensorIterator op, which takes 0-dim host inputs as scalars."""
    return torch.Tag.pointwise in func.tags or func.overloadpacket is aten.where


def _index_put_fills_a_mask(func, args, kwargs) -> bool:
    """Whether CUDA's ``index_put_`` runs as ``masked_fill_`` (``canDispatchToMaskedFill``): a single
    boolean index on the device, a one-element host value, no accumulation. It then reads the value on the
    host and neither copies it nor counts the mask's ``nonzero`` (no sync)."""
    if _HOST_SCALAR_ARGUMENTS.get(func.overloadpacket) != "values" or _argument(
        func, args, kwargs, "accumulate"
    ):
        return False
    values = _argument(func, args, kwargs, "values")
    if isinstance(values, SimTensor) or values.numel() != 1:
        return False
    indices = [t for t in args[1] if t is not None]
    return (
        len(indices) == 1
        and isinstance(indices[0], SimTensor)
        and indices[0].dtype in (torch.bool, torch.uint8)
    )


def _host_scalars(func, args, kwargs, on_host: list[torch.Tensor]) -> tuple[list, list]:
    """The host values CUDA takes in this device op: (read as scalars, copied to the device first)."""
    packet = func.overloadpacket
    if _takes_host_scalars(func):
        written = {id(t) for t in _written(func, args, kwargs)}
        operands = [t for t in on_host if t.dim() == 0 and id(t) not in written]
        # `where_self_out` moves 0-dim CPU operands to the device (`.to(device)`); TensorIterator reads them.
        return ([], operands) if packet is aten.where else (operands, [])
    name = _HOST_SCALAR_ARGUMENTS.get(packet)
    value = None if name is None else _argument(func, args, kwargs, name)
    if not isinstance(value, torch.Tensor) or isinstance(value, SimTensor):
        return [], []
    if name == "values" and _index_put_fills_a_mask(func, args, kwargs):
        return [value], []
    if value.dim() != 0:
        return [], []
    # `_index_put_impl_` copies a 0-dim value over; masked_fill/fill_ read it with `item()`.
    return ([], [value]) if name == "values" else ([value], [])


def _alias_outputs(func, args, kwargs, out):
    """Give view outputs their base's (wrapper) storage and return the mutated argument itself from an
    in-place or ``out=`` op, as eager PyTorch does (a lighter ``return_and_correct_aliasing``)."""
    views, writes = _alias_plan(func)

    def argument(position: int, name: str):
        return args[position] if 0 <= position < len(args) else kwargs[name]

    outs = out if isinstance(out, tuple) else (out,)
    for r, position, name in views:
        base = argument(position, name)
        for view in outs[r] if isinstance(outs[r], list) else [outs[r]]:
            if isinstance(view, SimTensor) and isinstance(base, SimTensor):
                torch._functionalize_unsafe_set(view, base)
    if not writes:
        return out
    mutated = [argument(*w) for w in writes]
    for t in mutated:
        if isinstance(t, SimTensor):
            _refresh_metadata(t)
    if len(writes) == 1 and not isinstance(out, tuple):
        return mutated[0]
    return tuple(mutated)


def _refresh_metadata(outer: SimTensor) -> None:
    """Copy the sizes/strides of a wrapped tensor that an op changed (``out=``, ``resize_``, ``t_``)."""
    inner = outer.elem
    if (
        outer.shape == inner.shape
        and outer.stride() == inner.stride()
        and outer.storage_offset() == inner.storage_offset()
    ):
        return
    with torch.no_grad(), no_dispatch():
        # Run `set_` on the wrapper itself as a meta tensor, below its Python dispatch key.
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            storage = torch.empty(0, dtype=torch.uint8, device=_DEVICE).untyped_storage()
            storage.resize_(inner.untyped_storage().nbytes())
            aten.set_.source_Storage_storage_offset(
                outer, storage, inner.storage_offset(), inner.shape, inner.stride()
            )
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)


class SimTensor(torch.Tensor):
    """A tensor on the simulated device: reports ``device="meta"``, holds its data in ``elem``.

    ``elem`` is a CPU tensor (a ``meta`` tensor in dry mode) with the same sizes, strides and storage
    offset; views of a SimTensor wrap views of its ``elem``, so writes through a view reach the base.
    """

    elem: torch.Tensor
    sim: SimulatedDevice
    # Tensor methods must not rewrap plain outputs (``x.cpu()``) as SimTensors.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor, sim: SimulatedDevice, requires_grad: bool = False):
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=_DEVICE,
            requires_grad=requires_grad,
        )
        out.elem = elem
        out.sim = sim
        return out

    def __repr__(self) -> str:
        # Printing is a debugging aid, not device work: keep it out of the counts.
        with _disable_current_modes():
            return f"SimTensor({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached only while the device's mode is inactive (after ``with sim:``): same rules.
        kwargs = kwargs or {}
        sim = next(t.sim for t in _leaves(args, kwargs) if isinstance(t, SimTensor))
        return sim._dispatch(func, args, kwargs)


class _DispatchMode(TorchDispatchMode):
    def __init__(self, sim: SimulatedDevice) -> None:
        super().__init__()
        self.sim = sim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.sim._dispatch(func, args, kwargs or {})


class _FunctionMode(TorchFunctionMode):
    """Host reads and constructors that never reach the dispatcher as an op on a SimTensor."""

    def __init__(self, sim: SimulatedDevice) -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DATA_CONSTRUCTORS:
            return self.sim._construct(func, args, kwargs)
        if func is torch.Tensor.tolist and isinstance(args[0], SimTensor):
            return self.sim._read_to_host(args[0]).tolist()
        if func is torch.Tensor.numpy and isinstance(args[0], SimTensor):
            if not (kwargs.get("force") or (len(args) > 1 and args[1])):
                raise MixedDeviceError(
                    f"Tensor.numpy of a device tensor at {call_site()} (CUDA: can't convert cuda:0 device "
                    "type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.)"
                )
            return self.sim._read_to_host(args[0]).numpy().copy()
        if (
            func is torch.Tensor.__setitem__
            and isinstance(args[0], SimTensor)
            and isinstance(args[2], (bool, int, float, complex))
        ):
            # THPVariable_setitem makes a Python number a CPU tensor when `self` is on CUDA (on `self`'s
            # device otherwise): a mask then becomes a masked_fill (no sync), tensor indices copy it over.
            args = (args[0], args[1], torch.tensor(args[2], dtype=args[0].dtype, device=_HOST))
        return func(*args, **kwargs)


class SimulatedDevice:
    """A simulated accelerator: device tensors are SimTensors, every aten op is checked and counted.

    Example::

        sim = SimulatedDevice()
        with sim:
            matcher = sim.to_device(matcher)  # parameters and buffers wrapped in place
            scores = engine(matcher, sim.to_device(images), ...)
        sim.counts.syncs, sim.counts.sync_sites.most_common(3)

    Args:
        dry: wrap ``meta`` tensors instead of CPU tensors: shapes and counts only, no arithmetic.
        fill: in dry mode, the value every host read of device data returns.
    """

    def __init__(self, dry: bool = False, fill: float = 1) -> None:
        self.dry = dry
        self.fill = fill
        self.counts = DeviceCounts()
        self._modes = (_FunctionMode(self), _DispatchMode(self))
        self._active = False
        self._meta_cache: dict = {}
        # Where device data actually lives.
        self._storage_device = _DEVICE if dry else _HOST

    def __deepcopy__(self, memo) -> SimulatedDevice:
        # Copies of device tensors (`copy.deepcopy(model)`) stay on this device, as with torch.device.
        return self

    @property
    def device(self) -> torch.device:
        """The device to pass to ``.to()`` and factory functions: ``torch.device("meta")``."""
        return _DEVICE

    def __enter__(self) -> SimulatedDevice:
        if self._active:
            raise RuntimeError("SimulatedDevice is already active")
        for mode in self._modes:
            mode.__enter__()
        self._active = True
        return self

    def __exit__(self, *exc) -> None:
        self._active = False
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    @contextlib.contextmanager
    def _activated(self):
        if self._active:
            yield
        else:
            with self:
                yield

    def reset(self) -> None:
        """Zero the counters (a new ``counts`` object: one read before keeps its values)."""
        self.counts = DeviceCounts()

    def to_device(self, obj):
        """Move a tensor (counted as ``obj.to(device)``) or an ``nn.Module`` (parameters and buffers, in
        place, ``requires_grad`` kept; returned) to the device."""
        if isinstance(obj, torch.Tensor) and obj.is_meta and not isinstance(obj, SimTensor):
            raise ValueError(f"a plain meta tensor {_describe(obj)} has no data to copy to the device")
        with self._activated():
            return obj.to(_DEVICE)

    def to_host(self, t: SimTensor) -> torch.Tensor:
        """The wrapped tensor of ``t`` (CPU, or meta in dry mode), uncounted: for test assertions."""
        if not isinstance(t, SimTensor):
            raise TypeError(f"expected a SimTensor, got {type(t).__name__} on {t.device}")
        return t.elem

    # -- implementation -------------------------------------------------------------------------------

    def _sync(self) -> None:
        self.counts.syncs += 1
        self.counts.sync_sites[call_site()] += 1

    def _fill_value(self, dtype: torch.dtype):
        if dtype == torch.bool:
            return bool(self.fill)
        if dtype.is_floating_point:
            return float(self.fill)
        if dtype.is_complex:
            return complex(self.fill)
        return int(self.fill)

    def _host_copy(self, t: SimTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or t.dtype
        if self.dry:
            return torch.full(t.shape, self._fill_value(dtype), dtype=dtype)
        return t.elem.to(dtype=dtype, copy=True)

    def _read_to_host(self, t: SimTensor) -> torch.Tensor:
        """``tolist()``/``numpy()``: one device->host copy and one sync."""
        self.counts.d2h_copies += 1
        self.counts.d2h_bytes += t.numel() * t.element_size()
        self._sync()
        return self._host_copy(t)

    def _construct(self, func, args, kwargs):
        """``torch.tensor(data, device=dev)`` and friends: build on the host, then copy over (as CUDA)."""
        device = kwargs.get("device")
        if device is None and func is torch.as_tensor and len(args) > 2:
            device, args = args[2], args[:2]
        if device is None and func is torch.Tensor.new_tensor and isinstance(args[0], SimTensor):
            device = _DEVICE
        data = args[1] if func is torch.Tensor.new_tensor else args[0]
        if device is None or torch.device(device) != _DEVICE or isinstance(data, torch.Tensor):
            return func(*args, **kwargs)
        kwargs = dict(kwargs)
        requires_grad = kwargs.pop("requires_grad", False)
        host_args = args
        if func is torch.Tensor.new_tensor and isinstance(args[0], SimTensor):
            host_args = (torch.empty(0, dtype=kwargs.pop("dtype", None) or args[0].dtype), *args[1:])
        host = func(*host_args, **{**kwargs, "device": _HOST})
        return host.to(_DEVICE).requires_grad_(requires_grad)

    def _dispatch(self, func, args, kwargs):
        leaves = _leaves(args, kwargs)
        on_device = [t for t in leaves if isinstance(t, SimTensor)]
        on_host = [t for t in leaves if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor)]
        for t in on_host:
            if t.device.type == "meta":
                raise RuntimeError(
                    f"{func} got a plain meta tensor {_describe(t)} at {call_site()}: it was made outside "
                    "the SimulatedDevice (make device tensors inside `with sim:` or with sim.to_device)"
                )
        device_kw = kwargs.get("device")
        makes_device = device_kw is not None and torch.device(device_kw).type == "meta"
        if not on_device and not makes_device:
            self.counts.host_ops += 1
            return func(*args, **kwargs)

        self.counts.ops += 1
        self.counts.op_names[_op_name(func)] += 1
        if func is aten._to_copy.default or func is aten.copy_.default:
            transfer = self._transfer(func, args, kwargs)
            if transfer is not None:
                return transfer
        packet = func.overloadpacket
        # A factory op reads only the shape and dtype of a host template (`zeros_like(x, device=dev)`).
        sync = False if makes_device else self._check_mixing(func, args, kwargs, on_host)
        if packet in _HOST_INDEX_OPS and not _index_put_fills_a_mask(func, args, kwargs):
            masks = [t for t in args[1] if t is not None and t.dtype in (torch.bool, torch.uint8)]
            if self.dry and any(isinstance(t, SimTensor) for t in masks):
                raise self._dry_error(func)
            sync |= bool(masks)
        if packet in _SCALAR_SYNC_OPS:
            self._sync()
            if self.dry:
                value = self._fill_value(on_device[0].dtype)
                return value if packet is aten._local_scalar_dense else bool(value)
        elif packet in _SHAPE_SYNC_OPS or (func in _REPEAT_INTERLEAVE and kwargs.get("output_size") is None):
            if self.dry:
                raise self._dry_error(func)
            sync = True
        if sync:
            self._sync()

        inner_args, inner_kwargs = _unwrap(args), {k: _unwrap(v) for k, v in kwargs.items()}
        if makes_device:
            inner_kwargs["device"] = self._storage_device
        if self.dry and on_host:
            inner_args, inner_kwargs = self._host_to_meta(func, inner_args, inner_kwargs)
        # A host argument's values can decide the output's shape (lengths): no cached metadata then.
        if self.dry and packet not in _HOST_ARGUMENTS:
            out = self._meta_call(func, inner_args, inner_kwargs)
        else:
            out = func(*inner_args, **inner_kwargs)
        if device_kw is None or makes_device:
            host_return = _HOST_RETURNS.get(packet)
            out = (
                self._wrap(out)
                if host_return is None
                else tuple(v if r == host_return else self._wrap(v) for r, v in enumerate(out))
            )
        return _alias_outputs(func, args, kwargs, out)

    def _meta_call(self, func, args, kwargs):
        """Run a meta kernel, or rebuild its output from a cache keyed by the inputs' metadata: many meta
        kernels are Python references (~100 us a call), and a dry walk repeats the same shapes."""
        views, writes = _alias_plan(func)
        if views or writes:
            return func(*args, **kwargs)
        try:
            key = (func, _meta_key(args), _meta_key(tuple(kwargs.items())))
            spec = self._meta_cache.get(key)
        except TypeError:  # an unhashable argument
            return func(*args, **kwargs)
        if spec is not None:
            return _from_spec(spec)
        out = func(*args, **kwargs)
        spec = _meta_spec(out)
        if spec is not None:
            self._meta_cache[key] = spec
        return out

    def _wrap(self, x):
        if isinstance(x, torch.Tensor):
            return SimTensor(x, self)
        if isinstance(x, (list, tuple)):
            return type(x)(self._wrap(v) for v in x)
        return x

    def _check_mixing(self, func, args, kwargs, on_host: list[torch.Tensor]) -> bool:
        """Raise on a host tensor that CUDA refuses in this device op; count the copies CUDA makes of the
        ones it takes over (host indices, scalars that ``where``/``index_put_`` copy). Returns whether the
        op waits for such a copy (one sync per op)."""
        packet = func.overloadpacket
        by_design = self._host_argument(func, args, kwargs)
        if not on_host:
            return False
        copied: list[torch.Tensor] = []
        if packet in _HOST_INDEX_OPS and isinstance(args[0], SimTensor):
            copied = [t for t in args[1] if t is not None and not isinstance(t, SimTensor)]
        read, copied_scalars = _host_scalars(func, args, kwargs, on_host)
        copied += copied_scalars
        taken = {id(t) for t in (*by_design, *read, *copied)}
        refused = [t for t in on_host if id(t) not in taken]
        if refused:
            hint = _CUDA_HINTS.get(packet, _SAME_DEVICE_HINT)
            if all(t.dim() == 0 for t in refused):
                hint = f"{hint}; {_SCALAR_HINT}"
            raise MixedDeviceError(
                f"{func} mixes host and device tensors at {call_site()} (CUDA: {hint}); "
                f"host: {', '.join(_describe(t) for t in refused)}"
            )
        for t in copied:
            self.counts.h2d_copies += 1
            self.counts.h2d_bytes += t.numel() * t.element_size()
        return bool(copied)

    def _host_argument(self, func, args, kwargs) -> list[torch.Tensor]:
        """The argument this op reads on the host by design (``[]`` when none); raise when it is on the
        device, as CUDA does (``pack_padded_sequence`` does not move device lengths over)."""
        name = _HOST_ARGUMENTS.get(func.overloadpacket)
        value = None if name is None else _argument(func, args, kwargs, name)
        if isinstance(value, SimTensor):
            raise MixedDeviceError(
                f"{func} got `{name}` on the device ({_describe(value)}) at {call_site()} (CUDA: "
                f"{_HOST_ARGUMENT_HINT}, but got a cuda:0 tensor); pass `{name}` on the host (`.cpu()`)"
            )
        return [] if value is None else [value]

    def _transfer(self, func, args, kwargs):
        """A copy between host and device: count it and run it; ``None`` when it stays on one side."""
        if func is aten._to_copy.default:
            src, target = args[0], kwargs.get("device")
            if isinstance(src, SimTensor) and target is not None and torch.device(target) != _DEVICE:
                dtype = kwargs.get("dtype") or src.dtype
                self._count_d2h(src.numel() * dtype.itemsize, kwargs.get("non_blocking", False))
                if self.dry:
                    return self._host_copy(src, dtype)
                return func(src.elem, **kwargs)
            if not isinstance(src, SimTensor) and target is not None and torch.device(target) == _DEVICE:
                self._count_h2d(src.numel() * src.element_size(), kwargs.get("non_blocking", False))
                return SimTensor(func(src, **{**kwargs, "device": self._storage_device}), self)
            return None
        dst, src = args[0], args[1]
        if isinstance(dst, SimTensor) and not isinstance(src, SimTensor):
            self._count_h2d(src.numel() * src.element_size(), kwargs.get("non_blocking", False))
            dst.elem.copy_(src.to(_DEVICE) if self.dry else src)
            return dst
        if not isinstance(dst, SimTensor) and isinstance(src, SimTensor):
            # A copy into pageable host memory blocks even with non_blocking=True.
            self._count_d2h(
                dst.numel() * dst.element_size(), kwargs.get("non_blocking", False) and dst.is_pinned()
            )
            if self.dry:
                return dst.fill_(self._fill_value(dst.dtype))
            return dst.copy_(src.elem)
        return None

    def _count_h2d(self, nbytes: int, non_blocking: bool) -> None:
        # PyTorch waits for the stream after a blocking host->device copy (copy_kernel_cuda); with
        # non_blocking=True it does not (pageable memory is staged before the call returns).
        self.counts.h2d_copies += 1
        self.counts.h2d_bytes += nbytes
        if not non_blocking:
            self._sync()

    def _count_d2h(self, nbytes: int, non_blocking: bool) -> None:
        self.counts.d2h_copies += 1
        self.counts.d2h_bytes += nbytes
        if not non_blocking:
            self._sync()

    def _dry_error(self, func) -> RuntimeError:
        return RuntimeError(
            f"{func} at {call_site()} has an output shape that depends on device data, "
            "which a dry SimulatedDevice (meta tensors, no values) cannot compute"
        )

    def _host_to_meta(self, func, args, kwargs):
        """Dry mode: host tensors joining a device op become meta (those it reads on the host by design
        stay); host masks become their indices."""
        packet = func.overloadpacket
        keep = _argument_position(func, _HOST_ARGUMENTS[packet]) if packet in _HOST_ARGUMENTS else None
        if packet in _HOST_INDEX_OPS:
            indices = []
            for t in args[1]:
                if t is not None and t.device == _HOST and t.dtype in (torch.bool, torch.uint8):
                    indices.extend(t.nonzero().unbind(1))
                else:
                    indices.append(t)
            args = (args[0], indices, *args[2:])

        def to_meta(x):
            if isinstance(x, torch.Tensor):
                return x if x.device == _DEVICE else x.to(_DEVICE)
            if isinstance(x, (list, tuple)):
                return type(x)(to_meta(v) for v in x)
            return x

        args = tuple(a if p == keep else to_meta(a) for p, a in enumerate(args))
        return args, {k: v if k == _HOST_ARGUMENTS.get(packet) else to_meta(v) for k, v in kwargs.items()}
