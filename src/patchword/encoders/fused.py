"""One matrix product for the query, key and value projections of a transformers attention block.

transformers' ViT, Swin and BERT project the same hidden states three times (``query``, ``key``,
``value``, or ``q_proj``, ``k_proj``, ``v_proj``): three products and, under autocast, three casts of
the input to bf16, three input gradients cast back to float32 and two float32 sums of them in the
backward pass. :func:`fuse_qkv` makes the three ``nn.Linear`` share one product with the concatenated
weights: the same parameters and state-dict entries, the same dot products, one cast, one input
gradient (the gradients of the three outputs meet in one ``split`` backward).

Why it matters on a GPU (issue 34): counted with :mod:`patchword.bench.device_work` on one training step
of ViT-B/16 + BERT-base at batch 64 (docs/benchmarks.md, "Device work"), the separate projections cost
about 9 GB of memory traffic for the casts and sums alone.

The sharing is by identity: the first member called on a tensor computes all three outputs and hands the
other two theirs when they are called on that same tensor object; a member called on another tensor
(cross-attention) starts over, so the results never depend on the call order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedProjection", "fuse_qkv"]

_TRIPLES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"))


class _Group:
    """The members of one fused projection and the outputs of their last shared product."""

    def __init__(self, members: tuple[nn.Linear, ...]) -> None:
        self.members = members
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.handed: set[int] = set()

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self.input is not x or index in self.handed:
            members = self.members
            weight = torch.cat([m.weight for m in members])
            bias = None if members[0].bias is None else torch.cat([m.bias for m in members])
            product = F.linear(x, weight, bias)  # (..., sum of out_features)
            self.input, self.handed = x, set()
            self.outputs = product.split([m.out_features for m in members], dim=-1)
        self.handed.add(index)
        out = self.outputs[index]
        if len(self.handed) == len(self.members):  # all handed out: hold no activations
            self.input, self.outputs = None, ()
        return out


class FusedProjection(nn.Linear):
    """An ``nn.Linear`` that computes its output in one product with the other members of its group."""

    _qkv_group: _Group
    _qkv_index: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._qkv_group.output(self._qkv_index, x)


def fuse_qkv(module: nn.Module) -> int:
    """Fuse every query/key/value triple of ``nn.Linear`` children in ``module`` (in place) that read
    the same width and agree on having a bias; returns how many triples were fused."""
    fused = 0
    for parent in module.modules():
        for names in _TRIPLES:
            members = tuple(getattr(parent, name, None) for name in names)
            if not all(type(m) is nn.Linear for m in members):
                continue
            if len({m.in_features for m in members}) != 1 or len({m.bias is None for m in members}) != 1:
                continue
            group = _Group(members)
            for index, member in enumerate(members):
                member.__class__ = FusedProjection  # same parameters, buffers and hooks
                member._qkv_group, member._qkv_index = group, index
            fused += 1
    return fused
