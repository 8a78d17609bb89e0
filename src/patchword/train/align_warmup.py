"""The official warm-up of the alignment loss's weight: it grows linearly over the first
``train.align_warmup_epochs`` epoch(s), then stays 1."""

from __future__ import annotations

import torch

from patchword.runs.config import TrainConfig

__all__ = ["AlignWarmup"]


class AlignWarmup:
    """The weight of the alignment loss at each step.

    Compiled (``train.compile``) it is a 0-d tensor on the device, one entry of the epoch's schedule
    (uploaded once per epoch): a Python float that changes every step would make the compiler specialise
    on it (a recompilation) and then take it as a host scalar input, which keeps that graph, the one every
    later step reuses, from being replayed as a CUDA graph.

    Args:
        tc: the run's train section (``align_warmup_epochs``, ``compile``).
        dtype: the losses' dtype (float64 in an fp64 run): a float32 schedule would round the weight.
        device: the device the step runs on.
    """

    def __init__(self, tc: TrainConfig, dtype: torch.dtype, device: torch.device) -> None:
        self.tc, self.dtype, self.device = tc, dtype, device
        self._schedule: tuple[tuple[int, int], torch.Tensor] | None = None  # (epoch, batches), weights

    def __call__(self, epoch: int, batch: int, n_batches: int) -> float | torch.Tensor:
        """The weight at batch ``batch`` of ``n_batches`` in ``epoch`` (0-based)."""
        warmup = self.tc.align_warmup_epochs

        def scale(i: int) -> float:
            if epoch >= warmup:
                return 1.0
            return min(1.0, (epoch * n_batches + i) / (warmup * n_batches))

        if not self.tc.compile:
            return scale(batch)
        key = (epoch, n_batches)
        if self._schedule is None or self._schedule[0] != key:
            values = torch.tensor([scale(i) for i in range(n_batches)], dtype=self.dtype, device=self.device)
            self._schedule = (key, values)
        return self._schedule[1][batch]
