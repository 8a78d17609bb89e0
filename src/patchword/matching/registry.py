"""Registry and factory for matchers: ``build_matcher("seps", embed_dim=512, ...)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

__all__ = [
    "register_matcher",
    "build_matcher",
    "list_matchers",
    "matcher_config_class",
    "matcher_reads_dense",
    "matcher_preset",
    "GEOMETRY",
]

# name -> (matcher class, config dataclass, preset overrides applied before the user's keywords)
_REGISTRY: dict[str, tuple[type[nn.Module], type, dict[str, Any]]] = {}


def register_matcher(name: str, config_cls: type, **preset: Any) -> Callable[[type], type]:
    """Class decorator registering a matcher under ``name``.

    The same class may be registered several times with different presets (``laps`` is ``seps`` without
    the dense branch). ``config_cls`` is the dataclass holding every constructor argument.
    """

    def decorator(cls: type) -> type:
        if name in _REGISTRY:
            raise ValueError(f"matcher {name!r} is already registered")
        unknown = set(preset) - {f.name for f in dataclasses.fields(config_cls)}
        if unknown:
            raise ValueError(f"preset for {name!r} sets unknown fields {sorted(unknown)}")
        _REGISTRY[name] = (cls, config_cls, dict(preset))
        return cls

    return decorator


def list_matchers() -> list[str]:
    """Names of all registered matchers, sorted."""
    _import_builtin_matchers()
    return sorted(_REGISTRY)


def matcher_config_class(name: str) -> type:
    """The config dataclass of matcher ``name``."""
    return _lookup(name)[1]


def matcher_preset(name: str) -> dict[str, Any]:
    """The config values registration fixes for ``name`` (``laps``: ``use_dense=False``)."""
    return dict(_lookup(name)[2])


def matcher_reads_dense(name: str, **kwargs: Any) -> bool:
    """Whether matcher ``name`` built with ``kwargs`` reads dense text, without building it."""
    cls, config_cls, preset = _lookup(name)
    return cls.reads_dense(config_cls(**{**preset, **kwargs}))


#: The token geometry every matcher is offered (``build_model`` passes the image encoder's). A matcher whose
#: config lacks one of these fields does not use it: ``num_patches`` is then dropped, and ``has_cls=True``
#: is an error (a region matcher would treat the CLS token as one more region).
GEOMETRY = ("embed_dim", "num_patches", "has_cls")


def _geometry_for(name: str, fields: set[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(kwargs)
    if "num_patches" not in fields:
        kwargs.pop("num_patches", None)
    if "has_cls" not in fields and kwargs.pop("has_cls", False):
        raise ValueError(f"matcher {name!r} takes tokens without a CLS token, but has_cls=True")
    return kwargs


def build_matcher(name: str, config: Any = None, **kwargs: Any) -> nn.Module:
    """Build a registered matcher.

    Args:
        name: registry name (see :func:`list_matchers`).
        config: an optional config dataclass instance (or dict) to start from instead of the defaults.
        **kwargs: config fields to override, e.g. ``embed_dim=512, sparse_ratio=0.5``; the
            :data:`GEOMETRY` keys may be given to every matcher.

    Raises:
        KeyError: unknown matcher name.
        TypeError: a keyword that is not a field of the matcher's config.
        ValueError: ``has_cls=True`` for a matcher that takes no CLS token.
    """
    cls, config_cls, preset = _lookup(name)
    base = (
        {} if config is None else (dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config)
    )
    fields = {f.name for f in dataclasses.fields(config_cls)}
    kwargs = _geometry_for(name, fields, kwargs)
    unknown = (set(base) | set(kwargs)) - fields
    if unknown:
        raise TypeError(
            f"matcher {name!r} got unknown argument(s) {sorted(unknown)}; valid: {sorted(fields)}"
        )
    values = {**preset, **base, **kwargs}
    return cls(config_cls(**values))


def _lookup(name: str) -> tuple[type[nn.Module], type, dict[str, Any]]:
    _import_builtin_matchers()
    if name not in _REGISTRY:
        raise KeyError(f"unknown matcher {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def _import_builtin_matchers() -> None:
    # Importing the modules runs their @register_matcher decorators; done lazily so that importing the
    # registry never pulls in every model.
    from patchword.matching import naaf, scan, seps, tgdt, vse  # noqa: F401
