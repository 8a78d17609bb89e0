"""The ``precision`` config value: the dtype of a run's weights and the autocast context of its steps.

``fp32`` trains fp32 weights without autocast; ``amp_bf16`` / ``amp_fp16`` keep fp32 weights and run
eligible ops in half precision; ``bf16`` runs the training step's weights, activations and gradients in
bfloat16 (the loss and BatchNorm layers in float32) on a copy of the model while the fp32 model keeps the
master weights the optimiser updates, the checkpoints save and evaluation uses
(:mod:`patchword.train.master_weights`); ``fp64`` keeps weights and every op in float64.

fp64 is for numerical checks, not speed: a fine-grained matcher's discrete choices (top-K selection, a
word's max over patches) flip on fp32 rounding differences, so two fp32 runs that differ only in the order
of float additions (1 vs 2 threads, or 1 vs 2 processes) drift apart within a few steps; in fp64 they stay
equal to ~1e-13 (docs/distributed.md).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Literal, get_args

import torch

__all__ = ["PRECISIONS", "Precision", "autocast_context", "autocast_enabled", "weight_dtype"]

#: The values of ``RunConfig.precision`` (the config checks them through this ``Literal``).
Precision = Literal["fp32", "amp_bf16", "amp_fp16", "bf16", "fp64"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
_AUTOCAST = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}


def _check(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def weight_dtype(precision: str) -> torch.dtype:
    """The dtype of the model's floating-point weights and buffers under ``precision`` (for ``bf16``, of
    the master weights: what checkpoints hold and evaluation uses)."""
    _check(precision)
    return torch.float64 if precision == "fp64" else torch.float32


def autocast_context(precision: str, device: torch.device):
    """``torch.autocast`` for the amp precisions; a null context for fp32, bf16 and fp64."""
    _check(precision)
    if precision not in _AUTOCAST:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST[precision])


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` in this thread; False for a device type autocast does
    not know (the simulated device's ``meta``), where ``torch.is_autocast_enabled`` raises."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False
