"""Input checks shared by matchers, losses and metrics, and the range checks of config values.

Every check raises ``ValueError`` naming the offending argument, so a user who passes a wrongly shaped
or corrupt tensor learns which one it was instead of reading a stack trace from deep inside an einsum.
The range checks (:func:`check_at_least`, :func:`check_finite_number`) raise its subclass
:class:`~patchword.errors.ConfigError`, naming the config key (or flag).

Checking a value (finiteness, a length range) reads it on the host, which makes the host wait for an
accelerator. A block loop whose caller checked the values of its whole inputs once runs its blocks under
:func:`values_checked`, so the matcher forward it calls per block checks shapes only.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading
from collections.abc import Iterator, Sequence

import torch

from patchword.errors import ConfigError

__all__ = [
    "check_tensor",
    "check_lengths",
    "check_finite",
    "check_all_finite",
    "finite_flag",
    "raise_non_finite",
    "values_checked",
    "values_are_checked",
    "check_at_least",
    "check_finite_number",
    "check_positive_int",
    "check_token_ids_dtype",
]

# Per thread: the CPU scoring engines run their blocks in worker threads, and a caller checking its own
# inputs in another thread must not be affected by a loop that runs beside it.
_checked = threading.local()


@contextlib.contextmanager
def values_checked() -> Iterator[None]:
    """Within the block, in this thread only: :func:`check_finite` and the value checks of
    :func:`check_lengths` pass without reading anything (shapes are still checked).

    For the block loop of a caller that has checked the values of its whole inputs once (a scoring engine:
    :func:`check_all_finite` and host-side length checks before the loop): the per-block checks would read
    the same values again, one wait for the device each.
    """
    before = getattr(_checked, "active", False)
    _checked.active = True
    try:
        yield
    finally:
        _checked.active = before


def _values_already_checked() -> bool:
    return getattr(_checked, "active", False)


def values_are_checked() -> bool:
    """Whether this thread runs under :func:`values_checked` (a caller checked the values of its whole
    inputs once): a scoring engine called there checks shapes only."""
    return _values_already_checked()


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


def check_finite(x: torch.Tensor, name: str, *, why: str = "") -> None:
    """Raise if ``x`` holds NaN or infinite values (nothing is read under :func:`values_checked`); ``why``
    (what cannot be computed from them) is added to the message."""
    if _values_already_checked():
        return
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        _raise_non_finite(x, name, why)


def _raise_non_finite(x: torch.Tensor, name: str, why: str = "") -> None:
    bad = int((~torch.isfinite(x)).sum())
    raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf){'; ' + why if why else ''}")


def check_all_finite(named: Sequence[tuple[torch.Tensor, str]]) -> None:
    """:func:`check_finite` of several ``(tensor, name)`` with one read for all of them on one device
    (always, also under :func:`values_checked`: it is the check done once)."""
    by_device: dict[torch.device, list[tuple[torch.Tensor, str]]] = {}
    for x, name in named:  # tensors given on several devices: one read per device
        by_device.setdefault(x.device, []).append((x, name))
    for group in by_device.values():
        flag = finite_flag(group)
        if flag is not None and not bool(flag):
            raise_non_finite(group)


def finite_flag(named: Sequence[tuple[torch.Tensor, str]]) -> torch.Tensor | None:
    """Whether every value of the floating tensors of ``named`` (all on one device) is finite: a 0-dim
    bool tensor on their device, computed without reading anything (a caller may read it together with a
    value it waits for anyway); None when there is nothing to check.

    Whole inputs can be large: their minimum and maximum are finite exactly when every value is (both
    propagate NaN and reach an infinity), so no temporary as large as a tensor is made; ``aminmax`` reads
    each tensor once for both.
    """
    floating = [x for x, _ in named if x.is_floating_point() and x.numel()]
    if not floating:
        return None
    return torch.stack([torch.isfinite(torch.stack(torch.aminmax(x))).all() for x in floating]).all()


def raise_non_finite(named: Sequence[tuple[torch.Tensor, str]]) -> None:
    """Raise naming the first of ``named`` that holds a non-finite value (after :func:`finite_flag` read
    False; reads each tensor)."""
    for x, name in named:
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            _raise_non_finite(x, name)
    raise ValueError(f"{', '.join(name for _, name in named)}: non-finite values (NaN or inf)")


def check_lengths(
    lens: object, name: str, *, size: int, max_len: int, min_len: int = 1, values: bool = True
) -> torch.Tensor:
    """Validate a (size,) vector of valid-token counts and return it as int64.

    Args:
        lens: lengths, a tensor or a sequence of ints (None and bool values are refused).
        name: the argument name used in error messages.
        size: the required number of entries (the batch size of the matching token tensor).
        max_len: the token axis length; no entry may exceed it.
        min_len: the smallest allowed length (an empty caption has nothing to align).
        values: also check the values (range, integrality); reading them makes the host wait for the
            device, so a training step skips it. Never checked while ``torch.compile`` traces: reading a
            value would break the graph, nor under :func:`values_checked`.
    """
    if lens is None:
        raise ValueError(
            f"{name} must be ({size},) valid-token counts (a tensor or a sequence of ints), got None"
        )
    if not isinstance(lens, torch.Tensor):
        try:
            lens = torch.as_tensor(lens)
        except (TypeError, ValueError, RuntimeError) as err:  # RuntimeError: e.g. a None among the values
            raise ValueError(f"{name} must be a 1-D tensor of lengths: {err}") from err
    if lens.dim() != 1 or lens.shape[0] != size:
        raise ValueError(f"{name} must have shape ({size},), got {tuple(lens.shape)}")
    # A dtype is known without reading a value: refused even where the values are not checked. A bool
    # tensor (a mask given for the lengths) would silently count as lengths of 0 and 1.
    if lens.dtype == torch.bool or lens.is_complex():
        raise ValueError(f"{name} must hold integer lengths, got dtype {lens.dtype}")
    if not values or torch.compiler.is_compiling() or _values_already_checked():
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


def check_at_least(key: str, value: float, low: float, why: str = "") -> None:
    """Raise a :class:`ConfigError` naming ``key`` unless ``value >= low`` (NaN fails too); ``why`` (what
    the bound means, e.g. ``"0 = torch's default"``) is added to the message."""
    if not value >= low:
        note = f" ({why})" if why else ""
        raise ConfigError(key, f"must be >= {low:g}{note}, got {value!r}")


def check_finite_number(key: str, value: float, *, inclusive: bool = True) -> None:
    """Raise a :class:`ConfigError` naming ``key`` unless ``value`` is a finite number ``>= 0`` (``> 0``
    when not ``inclusive``): NaN and infinities fail."""
    if not (0 <= value < math.inf if inclusive else 0 < value < math.inf):
        raise ConfigError(key, f"must be a finite number {'>=' if inclusive else '>'} 0, got {value!r}")


def check_positive_int(name: str, value: object) -> int:
    """``value`` as an int when it is a positive integer of any kind (``int``, ``np.int64``...), else a
    ValueError naming ``name``: a float would be truncated (2.5 -> 2) and a bool read as 0 or 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_token_ids_dtype(ids: torch.Tensor, name: str = "ids") -> None:
    """Token ids an embedding table reads: int64 or int32 (float ids were torch's error about index scalar
    types). The dtype only: nothing is read (a training step calls it).

    Raises:
        ValueError: naming ``name`` and the dtype.
    """
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be int64 (or int32) token ids, got {ids.dtype}")
