"""Whether the compiled training step replays as CUDA graphs when the run asks for them
(``train.compile_mode`` reduce-overhead or max-autotune).

PyTorch runs a compiled graph it cannot capture (a CPU device, a mutated input, a dynamic shape it will
not record, ...) without CUDA graphs: the same results, more host time per step. It says so only in a
log that is off by default (``TORCH_LOGS=cudagraphs``), so a run asking for CUDA graphs would be slower
than asked without a word. :class:`CudaGraphSkips` reads PyTorch's count of such graphs after each step
and logs a warning whenever it grew.
"""

from __future__ import annotations

import logging

import torch

_logger = logging.getLogger(__name__)


def _skipped_graphs() -> int:
    """Compiled graphs PyTorch has run without CUDA graphs in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


class CudaGraphSkips:
    """Warns when a compiled graph of a run that asked for CUDA graphs runs without them.

    Args:
        mode: ``train.compile_mode``.
        wanted: whether the run compiles with a mode that replays CUDA graphs.
        device: the device the step runs on (named in the warning when it has no CUDA graphs).
    """

    def __init__(self, mode: str, wanted: bool, device: torch.device) -> None:
        self.mode, self.wanted, self.device = mode, wanted, device
        self.seen = _skipped_graphs() if wanted else 0

    def check(self) -> None:
        """After a step (forward and backward: each compiles its own graph): warn if the count grew."""
        if not self.wanted:
            return
        skipped = _skipped_graphs()
        if skipped <= self.seen:
            return
        new, self.seen = skipped - self.seen, skipped
        why = (
            "TORCH_LOGS=cudagraphs may print PyTorch's reasons"
            if self.device.type == "cuda"
            else f"the device is {self.device.type}, which has none"
        )
        _logger.warning(
            "train.compile_mode=%s: %d more compiled graph(s) run without CUDA graphs (same results, "
            "more host time per step); %s",
            self.mode,
            new,
            why,
        )
