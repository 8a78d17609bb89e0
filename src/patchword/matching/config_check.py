"""Every matcher config's field values checked against the field's annotation, before anything is built.

A run config is checked key by key as it is read (:func:`patchword.config.from_dict`); a matcher built from
Python (:func:`~patchword.matching.build_matcher`, ``SEPSConfig(...)``) gets the same check here, from the
same annotations: ``min_samples=2.5`` for an ``int`` option, ``has_cls="yes"`` for a ``bool`` one (read as
True) or ``saliency="foo"`` outside its ``Literal`` were accepted and either failed deep in torch or silently
computed something else.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from functools import cache
from typing import Any

__all__ = ["POSITIVE_COUNTS", "check_config_fields"]

_KINDS = {bool: "a bool", int: "an int", float: "a number", str: "a string"}

#: Token geometry every matcher config that has it must hold at least 1 of (``embed_dim=0`` built layers of
#: width 0 whose every forward failed later, or a matcher scoring nothing): one rule for every matcher.
POSITIVE_COUNTS = ("embed_dim", "num_patches")


def _accepts(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # True is an int to Python, never a count or a ratio to a config
        return False
    if kind is int:
        return isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, numbers.Real)
    return isinstance(value, kind)


@cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a config class (resolved once: a SEPS config is checked on every build
    and twice when resolved)."""
    return typing.get_type_hints(cls)


def check_config_fields(cfg: Any) -> None:
    """Each field of the dataclass instance ``cfg`` whose annotation is ``bool``, ``int``, ``float``,
    ``str`` or a ``Literal`` (each possibly ``| None``) holds such a value; fields of other annotations are
    the class's own to check.

    The token geometry (:data:`POSITIVE_COUNTS`, where the config has it) must be at least 1.

    Raises:
        TypeError: ``"{name} must be an int, got 2.5 (float)"`` for the first field of the wrong type.
        ValueError: ``"{name} must be one of ('a', 'b'), got 'c'"`` for a value outside a ``Literal``;
            ``"embed_dim must be a positive int, got 0"``; ``"{name} must be a finite number, got nan"``.
    """
    hints = _hints(type(cfg))
    for field in dataclasses.fields(cfg):
        value, hint = getattr(cfg, field.name), hints[field.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        options = typing.get_args(hint) if union else (hint,)
        if value is None and type(None) in options:
            continue
        options = tuple(option for option in options if option is not type(None))
        if len(options) != 1:
            continue
        (want,) = options
        if typing.get_origin(want) is typing.Literal:
            allowed = typing.get_args(want)
            if not any(type(value) is type(choice) and value == choice for choice in allowed):
                raise ValueError(f"{field.name} must be one of {allowed}, got {value!r}")
        elif want in _KINDS and not _accepts(want, value):
            raise TypeError(f"{field.name} must be {_KINDS[want]}, got {value!r} ({type(value).__name__})")
        elif want is float and not math.isfinite(value):  # a NaN weight turned every score NaN
            raise ValueError(f"{field.name} must be a finite number, got {value!r}")
    for name in POSITIVE_COUNTS:
        value = getattr(cfg, name, 1)
        if not isinstance(value, numbers.Real) or not value >= 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
