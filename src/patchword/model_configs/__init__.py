"""The shipped named architectures: one YAML file per name (``seps-vit-b16-code.yaml``...), each a ``model``
section and, optionally, the ``random_init`` Hugging Face architectures a model built without pretrained
weights uses. This is the table; :func:`patchword.factory.create_model` builds from it."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from patchword.errors import ConfigError

__all__ = ["list_models", "named_model_mapping", "named_random_init"]


@cache
def _named() -> dict[str, dict[str, Any]]:
    configs = {}
    for entry in resources.files(__name__).iterdir():
        if entry.name.endswith(".yaml"):
            configs[entry.name[: -len(".yaml")]] = yaml.safe_load(entry.read_text())
    return configs


def list_models() -> list[str]:
    """Names of the shipped model configs, sorted."""
    return sorted(_named())


def named_model_mapping(name: str) -> dict[str, Any]:
    """The ``model`` mapping of named architecture ``name`` (with ``name`` itself), as its YAML file holds it.

    Raises:
        ConfigError: ``name`` is not a shipped model config (the message lists them).
    """
    if name not in _named():
        raise ConfigError("model.name", f"unknown model {name!r}; shipped: {', '.join(list_models())}")
    return {**_named()[name]["model"], "name": name}


def named_random_init(name: str) -> dict[str, dict[str, Any]]:
    """The Hugging Face architectures named model ``name`` is built from without pretrained weights
    (``{}`` for a name that is not shipped or has none)."""
    return dict(_named().get(name, {}).get("random_init", {}))
