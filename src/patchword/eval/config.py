"""How a model is evaluated: the ``eval`` section of a run config."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EvalConfig"]


@dataclass
class EvalConfig:
    """Evaluation after training (and ``patchword eval``)."""

    split: str = "test"  # which split to report
    batch_size: int = 128  # images / texts per encoder batch
    coco_1k: bool = False  # also report the COCO 1K five-fold protocol (5K test)
    coco_extended: bool = False  # also report ECCV Caption / CxC metrics (COCO 5K test; extra: coco)
    # working-memory budget of the scoring engine in MiB (block sizes follow it); 0: automatic, 1024 on
    # the CPU and half the free memory of an accelerator, at most 32 GiB (engine.memory.configured_budget_mb)
    max_memory_mb: int = 0
    # precision of the scoring engine's matrix products: "fp32" (exact) or "tf32" (CUDA, SEPS / LAPS: the
    # alignment products on TF32 tensor cores, the patch ranking in float32; score_matrix's ``precision``)
    precision: str = "fp32"
