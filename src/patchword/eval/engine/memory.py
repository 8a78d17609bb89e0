"""Memory accounting for the scoring engines: block plans from a budget, and a tensor-memory meter.

CPU PyTorch has no allocator statistics (``torch.cuda.max_memory_allocated`` exists only on CUDA), and
``tracemalloc`` does not see tensor storage. :class:`TensorMemoryMeter` therefore counts every tensor
storage created while it is active, at the dispatcher (so the temporaries inside composite ops such as
``einsum`` are seen too), and subtracts it when the storage is freed. What it measures is the peak of
*live tensor bytes* allocated by the code it wraps; inputs created before it started are not counted,
and neither is scratch memory that kernels allocate internally without a tensor (BLAS packing buffers,
a few MB at most). The benchmark also reports the growth of the process's peak RSS for comparison.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["BYTES_PER_MB", "TensorMemoryMeter", "budget_bytes", "default_budget_mb", "largest_fitting"]

BYTES_PER_MB = 1 << 20
#: Working-memory budget of a scoring job on the CPU when none is given (MiB).
CPU_BUDGET_MB = 1024
#: The most an accelerator's default budget takes (MiB): blocks of tens of thousands of pairs, enough to
#: amortise the launches of a block (measured: docs/benchmarks.md, "GPU").
ACCELERATOR_BUDGET_MB = 32768


def default_budget_mb(device: torch.device | str) -> float:
    """The working-memory budget (MiB) of a scoring job on ``device`` when the caller gives none: 1024 on
    the CPU; on a CUDA device half of its free memory, at most ``ACCELERATOR_BUDGET_MB``; on any other
    accelerator ``ACCELERATOR_BUDGET_MB``."""
    device = torch.device(device)
    if device.type == "cpu":
        return CPU_BUDGET_MB
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(256.0, min(ACCELERATOR_BUDGET_MB, free / 2 / BYTES_PER_MB))
    return ACCELERATOR_BUDGET_MB


def budget_bytes(max_memory_mb: float) -> int:
    """Validate a memory budget in MiB and return it in bytes."""
    if (
        isinstance(max_memory_mb, bool)
        or not isinstance(max_memory_mb, (int, float))
        or not 0 < max_memory_mb < float("inf")  # NaN fails both comparisons
    ):
        raise ValueError(f"max_memory_mb must be a positive finite number, got {max_memory_mb!r}")
    return int(max_memory_mb * BYTES_PER_MB)


def largest_fitting(cost, lo: int, hi: int, budget: int) -> int:
    """Largest ``n`` in ``[lo, hi]`` with ``cost(n) <= budget`` (``cost`` non-decreasing), else ``lo - 1``."""
    if cost(lo) > budget:
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class _Live:
    nbytes: int


class TensorMemoryMeter(TorchDispatchMode):
    """Peak bytes of tensor storage allocated while active (a context manager).

    Example::

        with TensorMemoryMeter() as meter:
            sims = score_matrix(matcher, img, cap, lens, max_memory_mb=8)
        meter.peak_bytes  # highest simultaneous live tensor bytes, the result matrix included

    Every op's output storage is recorded the first time it is seen and released through a finalizer on
    the storage object (PyTorch keeps one Python object per live storage, so the finalizer fires exactly
    when the memory is returned). In-place ops and ``out=`` writes reuse storage and add nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, _Live] = {}
        self.current_bytes = 0
        self.peak_bytes = 0

    def _release(self, key: int, record: _Live) -> None:
        if self._live.get(key) is record:
            del self._live[key]
            self.current_bytes -= record.nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key == 0 or key in self._live:
                continue
            record = _Live(storage.nbytes())
            self._live[key] = record
            self.current_bytes += record.nbytes
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
            weakref.finalize(storage, self._release, key, record)
        return out


def configured_budget_mb(max_memory_mb: int, device) -> float:
    """A config's ``eval.max_memory_mb``: the number itself, or (0) the automatic budget of ``device``
    (:func:`default_budget_mb`)."""
    return default_budget_mb(device) if max_memory_mb == 0 else max_memory_mb
