"""``precision=bf16``: the training step computes on a bfloat16 copy of the model; the float32 model keeps
the master weights, which the optimiser updates, checkpoints save and evaluation uses.

Why a copy and not bfloat16 weights: bfloat16 has 8 significant bits. An AdamW update of lr = 1e-5 moves
a weight of 0.05 by 2e-4 of its size, below half a bfloat16 step (at least 2^-9 ~ 2e-3 of it), so
bfloat16 weights updated in place would never move. The float32 master weights accumulate such updates
and the copy follows once they add up to a bfloat16 step (``tests/train/test_master_weights.py``).

What the step gains over ``amp_bf16`` (autocast): no cast of the residual stream before every product and
of every gradient after it, half the bytes of every elementwise op and of the saved activations. Counted
with :mod:`patchword.bench.device_work` for ViT-B/16 + BERT-base at batch 64 (docs/benchmarks.md): 68.8 ms
of modelled H100 kernel time under autocast, 60.4 ms in bf16, 3,758 -> 3,043 kernels.

What is not copied (the copy shares the model's tensors): buffers (learned statistics such as NAAF's
thresholds, BatchNorm's running statistics) and every BatchNorm layer whole, whose kernels take bfloat16
inputs with float32 parameters; the gradients of those parameters land in the model's own ``.grad``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["BF16Copy"]


class BF16Copy:
    """The bfloat16 copy of ``model`` a training step runs on.

    Usage, once per step::

        loss = loss_fn(copy.module, batch)   # forward in bfloat16
        loss.backward()                      # gradients in bfloat16, on the copy
        copy.push_grads()                    # -> model's .grad in float32 (the copy's are released)
        clip_grad_norm_(model.parameters()); optimizer.step()   # on the float32 master weights
        copy.pull()                          # master weights -> copy

    and :meth:`pull` again whenever the model's weights change otherwise (loading a checkpoint).

    Args:
        model: the float32 model; it is left untouched.
    """

    def __init__(self, model: nn.Module) -> None:
        shared: dict[int, object] = {id(b): b for b in model.buffers()}
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                shared[id(module)] = module
        self.model = model
        self.module = copy.deepcopy(model, shared)
        # copied parameter's id -> (master, copied parameter), which stays alive while ids are looked up
        masters = {
            id(own): (master, own)
            for master, own in zip(model.parameters(), self.module.parameters(), strict=True)
        }
        cast: dict[int, nn.Parameter] = {}  # one bfloat16 parameter per copied one (tied weights stay tied)
        for module in self.module.modules():
            for name, own in module._parameters.items():
                if own is None or own is masters[id(own)][0] or not own.is_floating_point():
                    continue
                if id(own) not in cast:
                    cast[id(own)] = nn.Parameter(own.detach().to(torch.bfloat16), own.requires_grad)
                module._parameters[name] = cast[id(own)]
        # (master, copy) of every parameter the copy does not share with the model
        self._pairs = [(masters[key][0], own) for key, own in cast.items()]

    def pull(self) -> None:
        """Copy the master weights into the copy (rounded to bfloat16)."""
        if self._pairs:
            with torch.no_grad():
                torch._foreach_copy_([own for _, own in self._pairs], [master for master, _ in self._pairs])

    def push_grads(self) -> None:
        """Move the copy's gradients into the master weights' ``.grad`` (float32; None where the copy has
        none, as an unused parameter's) and release the copy's."""
        masters, grads = [], []
        for master, own in self._pairs:
            if own.grad is None:
                master.grad = None
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
            masters.append(master.grad)
            grads.append(own.grad)
            own.grad = None
        if masters:
            torch._foreach_copy_(masters, grads)
