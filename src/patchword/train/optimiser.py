"""The optimiser side of a training step: AdamW over the model's parameter groups, the official learning
rate schedule, the ``amp_fp16`` gradient scaler, gradient clipping and the count of skipped steps.

The optimiser step has no host synchronisation where the fused AdamW runs: a non-finite loss skips the
update on the device (``found_inf``) and the skipped steps are counted on the device too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from patchword.device import read_together
from patchword.model import RetrievalModel
from patchword.runs.config import RunConfig
from patchword.train.step import fused_supported

__all__ = ["Optimiser"]


class Optimiser:
    """AdamW (fused where the device has it and no gradient scaler runs, else foreach), its epoch
    milestones (``MultiStepLR``, ``train.lr_milestones``) and step milestones (``train.lr_milestone_steps``),
    the gradient scaler (enabled under ``amp_fp16``) and the steps skipped so far.

    Args:
        model: the model whose (float32 master) weights the optimiser steps and whose gradients are clipped.
    """

    def __init__(self, model: RetrievalModel, cfg: RunConfig, device: torch.device) -> None:
        tc = self.tc = cfg.train
        self.model: nn.Module = model
        params = model.parameter_groups(tc.lr, tc.backbone_lr_mult)
        self.fused = fused_supported(device) and cfg.precision != "amp_fp16"
        extra = {"fused": True} if self.fused else {"foreach": True}
        self.optimizer = torch.optim.AdamW(params, weight_decay=tc.weight_decay, **extra)
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=list(tc.lr_milestones), gamma=tc.lr_decay
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "amp_fp16")
        self.device = device
        self.skipped = torch.zeros((), device=device)  # steps skipped (a 0-d tensor: read off the hot path)
        self.grad_norm: torch.Tensor | None = None  # of the last step (read on logging steps only)

    @property
    def host_decides(self) -> bool:
        """Whether a step's skip needs the loss on the host (amp_fp16, or no fused optimiser)."""
        return self.scaler.is_enabled() or not self.fused

    @property
    def skipped_steps(self) -> int:
        """Steps skipped: the loss was not finite, or under ``amp_fp16`` the gradient scaler found inf / NaN
        gradients (read from the device: not in the hot path)."""
        return int(self.skipped.item())

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.skipped = torch.tensor(float(value), device=self.device)

    def read_with(self, stats: torch.Tensor) -> tuple[list[float], float | None, int]:
        """``stats`` (a 1-d tensor on the device), the last step's gradient norm (None before the first
        step) and the steps skipped, read from the device in one copy (a logging step's one host sync)."""
        extra = [] if self.grad_norm is None else [self.grad_norm.detach()]
        stats, skipped, *grad_norm = read_together(stats, self.skipped, *extra)
        return stats.reshape(-1).tolist(), float(grad_norm[0]) if grad_norm else None, int(skipped)

    def learning_rates(self) -> dict[str, float]:
        """``lr`` (the first parameter group's) and ``lr_<name>`` of every named group after it."""
        groups = self.optimizer.param_groups
        return {"lr": groups[0]["lr"], **{f"lr_{g['name']}": g["lr"] for g in groups[1:] if "name" in g}}

    def skip(self) -> None:
        """Skip a step whose loss is not finite (the host decided: :attr:`host_decides`)."""
        self.skipped += 1
        self.optimizer.zero_grad(set_to_none=True)

    def clip_and_step(self, found_inf: torch.Tensor | None) -> None:
        """Clip to the global gradient norm (gradients are already summed over processes) and step; the
        fused optimiser skips the update on the device where ``found_inf`` is 1."""
        if self.tc.grad_clip:
            self.scaler.unscale_(self.optimizer)
            self.grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), self.tc.grad_clip, foreach=True
            )
        if found_inf is not None:
            self.optimizer.found_inf = found_inf  # read by the fused AdamW kernel
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None  # amp_fp16: synced anyway
        try:
            self.scaler.step(self.optimizer)
        finally:
            if found_inf is not None:
                del self.optimizer.found_inf
        self.scaler.update()
        if scale is not None and self.scaler.get_scale() < scale:
            # the scaler skipped the step (inf / NaN gradients) and backed its scale off: a skipped step
            self.skipped += 1

    def decay_at(self, step: int) -> None:
        """The step milestones' decay, after ``step`` steps (the epoch milestones are the scheduler's)."""
        if step in self.tc.lr_milestone_steps:
            for group in self.optimizer.param_groups:
                group["lr"] *= self.tc.lr_decay

    def state_dict(self) -> dict[str, Any]:
        """The optimiser's, the scheduler's and the scaler's states (``last.pt``'s keys)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
