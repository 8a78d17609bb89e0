"""``precision=bf16``: the training step computes on a bfloat16 copy of the model; the float32 model keeps
the master weights, which the optimiser updates, checkpoints save and evaluation uses.

Why a copy and not bfloat16 weights: bfloat16 has 8 significant bits. An AdamW update of lr = 1e-5 moves
a weight of 0.05 by 2e-4 of its size, below half a bfloat16 step (at least 2^-9 ~ 2e-3 of it), so
bfloat16 weights updated in place would never move. The float32 master weights accumulate such updates
and the copy follows once they add up to half a bfloat16 step (``tests/train/test_master_weights.py``).

What the step gains over ``amp_bf16`` (autocast): no cast of the residual stream before every product and
of every gradient after it, half the bytes of every elementwise op and of the saved activations. Counted
with :mod:`patchword.bench.device_work` for ViT-B/16 + BERT-base at batch 64: 12% less modelled H100 kernel
time than autocast (docs/benchmarks.md, "Device work").

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
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        in_norms = {id(p) for m in norms for p in m.parameters()}
        # The deep copy takes what the memo holds instead of copying it: the model's own buffers and
        # BatchNorm layers, and a bfloat16 parameter for every other floating parameter (made directly:
        # no float32 duplicate; a tied parameter is one entry, so its uses stay tied in the copy).
        memo: dict[int, object] = {id(b): b for b in model.buffers()}
        memo.update((id(m), m) for m in norms)
        self._pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (master, copy)
        for master in model.parameters():
            if master.is_floating_point() and id(master) not in in_norms:
                own = nn.Parameter(master.detach().to(torch.bfloat16), master.requires_grad)
                memo[id(master)] = own
                self._pairs.append((master, own))
        self.model = model
        self.module = copy.deepcopy(model, memo)
        for module in self.module.modules():
            if isinstance(module, nn.RNNBase):  # cuDNN's weight layout for the new parameters
                module.flatten_parameters()

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
