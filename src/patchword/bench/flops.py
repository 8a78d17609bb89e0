"""Counting the floating-point work a piece of code does (torch profiler FLOP counts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["count_flops"]


def count_flops(fn: Callable[[], Any]) -> float:
    """FLOPs the torch profiler attributes to the operators ``fn()`` executes.

    Matrix products (``mm``, ``bmm``, ``addmm``, ``matmul``, convolutions) count 2 m n k per (m x k) @
    (k x n) product, element-wise ``add`` / ``mul`` one per element; every other operator (exp, softmax,
    sort, gather, norms) counts 0. For the scoring engines this is essentially the GEMM work, the part
    that can run at the machine's matmul peak.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        fn()
    return float(sum(event.flops for event in prof.key_averages()))
