"""Input checks shared by matchers, losses and metrics.

Every check raises ``ValueError`` naming the offending argument, so a user who passes a wrongly shaped
or corrupt tensor learns which one it was instead of reading a stack trace from deep inside an einsum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["check_tensor", "check_lengths", "check_finite"]


def check_tensor(
    x: object,
    name: str,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    finite: bool = True,
    floating: bool = True,
) -> torch.Tensor:
    """Validate a tensor argument and return it.

    Args:
        x: the value to check.
        name: the argument name used in error messages.
        ndim: required number of dimensions.
        shape: required shape; ``None`` entries are wildcards.
        finite: reject NaN and infinite values.
        floating: require a floating-point dtype.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(x.shape, shape, strict=True)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name} has size {got} on axis {axis}, expected {want} (shape {tuple(x.shape)})"
                )
    if floating and not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if finite:
        check_finite(x, name)
    return x


def check_finite(x: torch.Tensor, name: str) -> None:
    """Raise if ``x`` holds NaN or infinite values."""
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf)")


def check_lengths(
    lens: object, name: str, *, size: int, max_len: int, min_len: int = 1, values: bool = True
) -> torch.Tensor:
    """Validate a (size,) vector of valid-token counts and return it as int64.

    Args:
        lens: lengths, a tensor or a sequence of ints.
        name: the argument name used in error messages.
        size: the required number of entries (the batch size of the matching token tensor).
        max_len: the token axis length; no entry may exceed it.
        min_len: the smallest allowed length (an empty caption has nothing to align).
        values: also check the values (range, integrality); reading them makes the host wait for the
            device, so a training step skips it. Never checked while ``torch.compile`` traces: reading a
            value would break the graph.
    """
    if not isinstance(lens, torch.Tensor):
        try:
            lens = torch.as_tensor(lens)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be a 1-D tensor of lengths: {err}") from err
    if lens.dim() != 1 or lens.shape[0] != size:
        raise ValueError(f"{name} must have shape ({size},), got {tuple(lens.shape)}")
    if not values or torch.compiler.is_compiling():
        return lens.long()
    if lens.is_floating_point() and not bool((lens == lens.round()).all()):
        raise ValueError(f"{name} must hold integer lengths")
    lens = lens.long()
    if size and int(lens.max()) > max_len:
        raise ValueError(
            f"{name} has a length {int(lens.max())} longer than the token axis ({max_len} positions)"
        )
    if size and int(lens.min()) < min_len:
        raise ValueError(f"{name} has a length {int(lens.min())} below the minimum of {min_len}")
    return lens
