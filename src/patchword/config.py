"""Dataclass configs: the single source of truth, with YAML files and dotted overrides on top.

``load_config(RunConfig, "run.yaml", ["model.sparse_ratio=0.6", "train.epochs=3"])`` builds the
dataclass from its defaults, applies the YAML file, then the overrides (values parsed as YAML scalars,
so ``true``, ``1e-4`` and ``[9, 15]`` work). Unknown keys are errors, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

__all__ = ["load_config", "apply_overrides", "config_to_dict", "save_config", "from_dict"]

T = TypeVar("T")


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass (nested) as plain dicts, lists and scalars."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (what ``--config`` reads back)."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a (nested) dict; unknown keys raise ``ValueError`` naming them."""
    if not isinstance(data, dict):
        raise ValueError(f"config{where or ''} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {', '.join(where + '.' + k if where else k for k in unknown)}"
        )
    kwargs = {}
    for name, value in data.items():
        sub = _dataclass_type(hints[name])
        key = f"{where}.{name}" if where else name
        if sub is not None and isinstance(value, dict):
            kwargs[name] = from_dict(sub, value, key)
        else:
            kwargs[name] = _coerce(value, hints[name], key)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Fix the scalar types YAML gets wrong for a field: PyYAML reads ``1e-4`` as a string and ``1`` as
    an int where a float is declared."""
    scalar = {hint} if isinstance(hint, type) else set(typing.get_args(hint))
    if float in scalar and isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError as err:
            raise ValueError(f"config key {key} expects a number, got {value!r}") from err
    if int in scalar and isinstance(value, str) and bool not in scalar:
        try:
            return int(value)
        except ValueError as err:
            raise ValueError(f"config key {key} expects an integer, got {value!r}") from err
    return value


def apply_overrides(cfg: T, overrides: list[str]) -> T:
    """Return a copy of ``cfg`` with ``section.field=value`` overrides applied."""
    data = config_to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key.path=value")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"unknown config section {part!r} in override {item!r}")
            node = node[part]
        if parts[-1] not in node:
            raise ValueError(f"unknown config key {key!r} in override {item!r}")
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    return from_dict(type(cfg), data)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Defaults of ``cls``, then the YAML file at ``path`` (if any), then dotted ``overrides``."""
    cfg = cls()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        merged = _deep_merge(config_to_dict(cfg), data, str(path))
        cfg = from_dict(cls, merged)
    return apply_overrides(cfg, overrides or [])


def _deep_merge(base: dict[str, Any], update: dict[str, Any], source: str) -> dict[str, Any]:
    if not isinstance(update, dict):
        raise ValueError(f"{source}: expected a mapping at the top level")
    out = dict(base)
    for key, value in update.items():
        if key not in base:
            raise ValueError(f"{source}: unknown config key {key!r}")
        # An empty default mapping is a free-form field (model.matcher_args): its keys are not known here.
        if isinstance(base[key], dict) and isinstance(value, dict) and base[key]:
            out[key] = _deep_merge(base[key], value, f"{source}:{key}")
        else:
            out[key] = value
    return out


def _dataclass_type(hint: Any) -> type | None:
    """The dataclass inside a type hint (``Foo`` or ``Foo | None``), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg):
                return arg
    return None
