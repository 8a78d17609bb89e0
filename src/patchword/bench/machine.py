"""What a benchmark records about the machine it ran on, and how it times things.

Timings are the best of several runs: other jobs may share the CPU, and the minimum is the least
disturbed run. The fp32 matrix-product peak measured here is the ceiling the achieved GFLOP/s of the
scoring engine are compared with.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from patchword.device import cpu_model

__all__ = ["machine_description", "load_average", "matmul_peak_gflops", "best_time"]


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (to spot contention), or None where the OS has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_description() -> dict[str, Any]:
    """CPU model, cores, torch build and threads, load average."""
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkl": torch.backends.mkl.is_available(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "load_average": load_average(),
        "python": platform.python_version(),
    }


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn``."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of a (size x size) @ (size x size) product: the machine's practical peak."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up: thread pool, BLAS packing buffers
    return 2 * size**3 / best_time(lambda: a @ b, repeats) / 1e9
