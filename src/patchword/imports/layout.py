"""What a loaded official checkpoint holds, read before any importer maps it: tensors of a kind no official
code saves (sparse, meta, quantized), refused naming their place; and, for a checkpoint no family
recognises, what its layout says (a bare ``state_dict``, parameter names of a DataParallel wrapper).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from patchword.errors import DataError

__all__ = ["layout_hint", "refuse_unusual_tensors"]


def refuse_unusual_tensors(ckpt: Any, path: str | os.PathLike[str]) -> None:
    """Every tensor of a loaded checkpoint (in its mappings, lists and tuples) is an ordinary one: dense
    (strided), holding its values (not on the ``meta`` device) and not quantized, as the official code saves
    them. Another kind crashed the import inside torch (a traceback from the finiteness check) or, worse,
    would be mapped into a model that cannot hold it.

    Raises:
        DataError: naming the first such tensor by its place in the checkpoint (``model['fc.weight']``).
    """

    def problem(tensor: torch.Tensor) -> str | None:
        if tensor.is_meta:
            return "a meta tensor (a shape without values: saved from a model never given its weights)"
        if tensor.layout != torch.strided:
            return f"a sparse tensor (layout {tensor.layout})"
        if tensor.is_quantized:
            return f"a quantized tensor ({tensor.dtype})"
        return None

    def walk(value: Any, where: str, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if (why := problem(value)) is not None:
                raise DataError(
                    f"{path}: {where} is {why}: patchword imports the plain tensors the official code saves; "
                    "save the weights as dense float tensors (.to_dense(), .dequantize()) or import the "
                    "original checkpoint"
                )
        elif depth < 6 and isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}[{key!r}]" if where else str(key), depth + 1)
        elif depth < 6 and isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]" if where else f"[{i}]", depth + 1)

    walk(ckpt, "", 0)


def layout_hint(ckpt: dict[str, Any]) -> str:
    """What a checkpoint no family recognises holds, when its layout says why: tensors only (a bare
    ``state_dict``, where the official ``train.py`` saves a dict of ``model``, ``opt``...), or parameter names
    that start with ``module.`` (a model saved inside a DataParallel / DistributedDataParallel wrapper);
    else its top-level entries. Empty for an empty checkpoint."""
    if ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        return (
            "it holds tensors only (a bare state_dict): the official train.py saves it under 'model', with "
            "its arguments under 'opt'"
        )
    states = [v for v in ckpt.values() if isinstance(v, dict)]
    states += [s for v in ckpt.values() if isinstance(v, (list, tuple)) for s in v if isinstance(s, dict)]
    for state in states:
        names = [k for k, v in state.items() if isinstance(v, torch.Tensor)]
        if names and all(isinstance(k, str) and k.startswith("module.") for k in names):
            return (
                "its parameter names start with 'module.' (a model saved inside a DataParallel / "
                "DistributedDataParallel wrapper): save the wrapped model's own state dict "
                "(model.module.state_dict()), or strip the prefix"
            )
    keys = ", ".join(sorted(map(repr, ckpt))[:8])
    return f"its top-level entries: {keys}" if keys else ""
