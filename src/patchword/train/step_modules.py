"""What a training step computes with: the model or its bfloat16 copy, compiled as the run asks
(``train.compile``, ``compile_scope``, ``compile_mode``), inside the loss module, wrapped for DDP under
``torchrun``; and the step's forward and backward through them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from patchword.data.batches import ShardBatch
from patchword.distributed import Distributed
from patchword.model import RetrievalModel
from patchword.precision import autocast_context
from patchword.runs.config import CUDA_GRAPH_COMPILE_MODES, RunConfig
from patchword.train.cuda_graphs import CudaGraphSkips
from patchword.train.master_weights import BF16Copy
from patchword.train.step import ShardLoss, sync_batch_norm, wrap_ddp

__all__ = ["StepModules", "build_step"]


@dataclass
class StepModules:
    """The modules of a training step.

    Attributes:
        bf16: the bfloat16 copy the step computes on (``precision=bf16``), else None.
        loss: the loss module over the model (or its copy): ``loss(batch, hardest, global_warmup, scale)``.
        step_fn: ``loss``, or its DDP wrapper in a run of several processes: what a step calls.
        cuda_graphs: whether compiled graphs replay as CUDA graphs (each step must mark its start).
        graph_skips: warns when compiled graphs run without the CUDA graphs asked for.
        precision, device, dist: the run's ``precision``, the device and the processes the step runs on.
    """

    bf16: BF16Copy | None
    loss: ShardLoss
    step_fn: nn.Module
    cuda_graphs: bool
    graph_skips: CudaGraphSkips
    precision: str
    device: torch.device
    dist: Distributed

    def run(
        self, batch: ShardBatch, hardest: bool, global_warmup: bool, scale: float | torch.Tensor, scaler
    ) -> torch.Tensor:
        """Forward and backward of this process's shard of a global batch (the gradients scaled by
        ``scaler``, a ``GradScaler``; with a bfloat16 copy, in the model's float32 ``.grad``); returns
        (3,) [loss, align, ratio] of the global batch, summed over the processes."""
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast_context(self.precision, self.device):
            loss, stats = self.step_fn(batch, hardest, global_warmup, scale)
        scaler.scale(loss).backward()
        self.graph_skips.check()  # warns when more compiled graphs run without the CUDA graphs asked for
        if self.bf16 is not None:
            self.bf16.push_grads()
        return self.dist.all_reduce(stats)


def build_step(model: RetrievalModel, cfg: RunConfig, dist: Distributed, device: torch.device) -> StepModules:
    """The step's modules over ``model`` (on ``device`` already); in a run of several processes its
    BatchNorm layers are synchronised (in place) and every process's master weights are rank 0's."""
    tc = cfg.train
    if dist.enabled:
        sync_batch_norm(model, dist)
    # The model the step computes with: the model itself, or its bfloat16 copy (precision=bf16), whose
    # gradients go to the model's float32 master weights before the optimiser step.
    bf16 = BF16Copy(model) if cfg.precision == "bf16" else None
    step_model = bf16.module if bf16 is not None else model
    mode = None if tc.compile_mode == "default" else tc.compile_mode
    if tc.compile and tc.compile_scope == "modules":
        for module in (step_model.image_encoder, step_model.text_encoder, step_model.matcher):
            module.compile(mode=mode)
    loss = ShardLoss(step_model, cfg, dist)
    if tc.compile and tc.compile_scope == "step":  # encoders, matcher and loss: one graph
        loss.compile(mode=mode)
    # CUDA graph replays: each step starts a new generation, whose replays may overwrite the outputs of
    # the previous step's (its loss and statistics are read before the next step starts).
    wants_graphs = tc.compile and tc.compile_mode in CUDA_GRAPH_COMPILE_MODES
    graph_skips = CudaGraphSkips(tc.compile_mode, wants_graphs, device)
    step_fn: nn.Module = loss
    if dist.enabled:
        step_fn = wrap_ddp(loss, device)
        if bf16 is not None:
            # DDP gave every process rank 0's weights, but in the copy, which the next refresh
            # overwrites: the master weights the optimiser steps must be rank 0's as well.
            with torch.no_grad():
                for p in model.parameters():
                    torch.distributed.broadcast(p, src=0, group=dist.group)
            bf16.pull()
    cuda_graphs = wants_graphs and device.type == "cuda"
    return StepModules(bf16, loss, step_fn, cuda_graphs, graph_skips, cfg.precision, device, dist)
