"""One matrix product for the query, key and value projections of a transformers attention block.

transformers' ViT, Swin and BERT project the same hidden states three times (``query``, ``key``,
``value``, or ``q_proj``, ``k_proj``, ``v_proj``): three products and, under autocast, three casts of
the input to bf16, three input gradients cast back to float32 and two float32 sums of them in the
backward pass. :func:`fuse_qkv` makes the three ``nn.Linear`` of a training forward share one product
with the concatenated weights: the same parameters and state-dict entries, the same dot products, one
cast, one input gradient (the gradients of the three outputs meet in one ``split`` backward).

Why it matters on a GPU (issue 34): counted with :mod:`patchword.bench.device_work` on one training step
of ViT-B/16 + BERT-base at batch 64, the fusion removes ~560 of ~4,350 kernels and ~10 GB of memory
traffic (docs/benchmarks.md, "Device work").

Only forwards that record gradients share the product: in inference the three projections run as
transformers wrote them (a batch-1 query would pay the concatenation of the weights for nothing). The
sharing is by identity: the first member called on a tensor computes all three outputs and hands the
other two theirs when they are called on that same tensor, unchanged (its version counter), with the
same weights, grad and autocast modes, in the same thread. A block whose members read different tensors
(cross-attention: keys and values from another sequence) stops sharing at its first such call.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from patchword.precision import autocast_enabled

__all__ = ["QKV_NAMES", "FusedProjection", "fuse_qkv", "unfuse_qkv"]

#: the names transformers gives an attention layer's query, key and value projections (BERT; ViT, Swin)
QKV_NAMES = (("query", "key", "value"), ("q_proj", "k_proj", "v_proj"))


@dataclass
class _Shared:
    """One thread's last shared product: its input, what it depended on, its outputs, who took theirs."""

    input: torch.Tensor
    key: tuple
    outputs: tuple[torch.Tensor, ...]
    handed: set[int] = field(default_factory=set)


class _Local(threading.local):
    """One thread's state of a group. ``shared`` is set in every thread before its first use (a
    ``threading.local`` subclass runs ``__init__`` once per thread): a compiled step that found it unset
    on its first call would guard on that and be compiled a second time once the first call had set it
    (the whole ViT-B/16 + BERT-base step: about a minute on an H100 machine)."""

    def __init__(self) -> None:
        self.shared: _Shared | None = None


class _Group:
    """The members of one fused projection and, per thread, the outputs of their last shared product."""

    def __init__(self, members: tuple[nn.Linear, ...]) -> None:
        self.members = members
        self.sharing = True  # False once the members were seen reading different tensors
        self._local = _Local()

    def __deepcopy__(self, memo) -> _Group:
        # In the memo before the members are copied: each member refers to this group, and a member copied
        # from here must find this copy, not start another (members with groups of their own would each
        # compute the whole product, three times the work, with the same results).
        group = memo[id(self)] = _Group(())
        group.members = copy.deepcopy(self.members, memo)
        group.sharing = self.sharing
        return group

    def __getstate__(self) -> dict:  # a thread-local holds nothing worth keeping
        return {"members": self.members, "sharing": self.sharing}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["members"])
        self.sharing = state["sharing"]

    def _key(self, x: torch.Tensor) -> tuple:
        """What a shared product depends on besides ``x`` itself (always computed with gradients)."""
        autocast = autocast_enabled(x.device.type)
        if torch.compiler.is_compiling():  # one traced graph: no in-place change between the calls
            return (autocast,)
        versions = tuple(p._version for m in self.members for p in (m.weight, m.bias) if p is not None)
        return (autocast, x._version, versions)

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        member = self.members[index]
        if not (self.sharing and torch.is_grad_enabled()):
            return F.linear(x, member.weight, member.bias)
        shared = self._local.shared
        key = self._key(x)
        current = shared is not None and shared.input is x and shared.key == key
        if shared is not None and not current and index not in shared.handed:
            # A member reads another tensor than the ones before it in this block: cross-attention.
            self.sharing, self._local.shared = False, None
            return F.linear(x, member.weight, member.bias)
        if not current or index in shared.handed:
            weight = torch.cat([m.weight for m in self.members])
            bias = None if member.bias is None else torch.cat([m.bias for m in self.members])
            product = F.linear(x, weight, bias)  # (..., sum of out_features)
            outputs = product.split([m.out_features for m in self.members], dim=-1)
            shared = self._local.shared = _Shared(x, key, outputs)
        shared.handed.add(index)
        if len(shared.handed) == len(self.members):  # all handed out: hold no activations
            self._local.shared = None
        return shared.outputs[index]


class FusedProjection(nn.Linear):
    """An ``nn.Linear`` that, in a forward that records gradients, computes its output in one product
    with the other members of its group."""

    _qkv_group: _Group
    _qkv_index: int

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._qkv_group.output(self._qkv_index, x)


def fuse_qkv(module: nn.Module) -> int:
    """Fuse every query/key/value triple of ``nn.Linear`` children in ``module`` (in place) that read
    the same width and agree on having a bias; returns how many triples were fused."""
    fused = 0
    for parent in module.modules():
        for names in QKV_NAMES:
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


def unfuse_qkv(module: nn.Module) -> int:
    """Undo :func:`fuse_qkv` in place (benchmarks compare the two); returns how many projections."""
    count = 0
    for child in module.modules():
        if type(child) is FusedProjection:
            child.__class__ = nn.Linear
            del child._qkv_group, child._qkv_index
            count += 1
    return count
