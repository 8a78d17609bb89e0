"""A matcher's options as a :class:`~patchword.model.config.ModelConfig` holds them, against what the
matcher declared at registration: the arguments it is built with, the checks every build runs
(:func:`check_matcher_options`: ``create_model``, ``load_run``, ``patchword eval`` and ``train`` refuse
alike), every option resolved to its value (a default included) for what a run records and saves, and the
keys an evaluation may not override.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from torch import nn

from patchword.config import config_diff, override_keys
from patchword.errors import ConfigError
from patchword.matching import matcher_reads_dense
from patchword.matching.config_check import check_config_fields
from patchword.matching.registry import GEOMETRY, list_matchers, matcher_preset, matcher_spec
from patchword.model.config import ModelConfig, matcher_section, typed_sections

__all__ = [
    "check_matcher_options",
    "check_option_overrides",
    "override_paths",
    "unread_option_overrides",
    "within",
    "matcher_arguments",
    "model_reads_dense",
    "reported_options",
    "resolve_plugin_options",
    "resolved_matcher_options",
    "split_saved_geometry",
    "training_only_keys",
]


def matcher_arguments(cfg: ModelConfig) -> dict[str, Any]:
    """The matcher's config fields from its section (the geometry comes from the encoders); fields the
    registered preset fixes (``laps``: no dense text) keep the preset's value."""
    section = matcher_section(cfg.matcher)
    options = dict(cfg.options) if section == "options" else dataclasses.asdict(getattr(cfg, section))
    preset = matcher_preset(cfg.matcher)
    return {k: v for k, v in options.items() if k not in preset}


def model_reads_dense(cfg: ModelConfig) -> bool:
    """Whether the configured matcher reads dense text (known before building it)."""
    return matcher_reads_dense(cfg.matcher, **matcher_arguments(cfg))


def training_only_keys() -> dict[str, str]:
    """The ``model.*`` override keys of the options every registered matcher declares training-only
    (``register_matcher(..., training_only=)``), with why: ``model.<section>.<field>`` (``model.options.
    <field>`` for a plug-in matcher without a typed section), and the legacy :attr:`ModelConfig.ALIASES`
    spelling of one (``model.detach_selection``), which loads into the same field."""
    keys = {}
    for name in list_matchers():
        section = matcher_section(name)
        for option, why in matcher_spec(name).training_only.items():
            keys[f"model.{section}.{option}"] = why
    for old, new in ModelConfig.ALIASES.items():
        if f"model.{new}" in keys:
            keys[f"model.{old}"] = keys[f"model.{new}"]
    return keys


_GEOMETRY_WHY = (
    "is token geometry, which comes from the encoders (model.embed_dim, the image encoder's patches and CLS "
    "token), not from the matcher's options: drop it"
)


def check_matcher_options(cfg: ModelConfig, *, unread_sections: bool = True) -> None:
    """The options of ``cfg.matcher`` checked against its registration before anything is built: each
    option of ``model.options`` (a plug-in's) one of its config's fields, none of them the token geometry
    (``embed_dim``, ``num_patches``, ``has_cls``: the encoders decide it) or a field its preset fixes, no
    ``model.options`` for a matcher that reads a typed section, a typed section's preset fields at their
    defaults, the values' types and ``Literal`` choices, and the config class's own ``check()``.

    ``unread_sections``: also refuse a typed section of another matcher set off its defaults (it would do
    nothing). :func:`~patchword.model.build.build_model` leaves that out: a recipe rebuilds a run's
    encoders under another matcher (``global_recall``) and keeps the run's own section; ``create_model``
    and ``patchword train`` check it.

    Raises:
        ConfigError: naming the first offending key (``model.options.<field>``, ``model.<section>.<field>``,
            or ``model.<section>`` for what the config class's checks raise).
    """
    section = matcher_section(cfg.matcher)
    spec = matcher_spec(cfg.matcher)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    if section == "options":
        for key in cfg.options:
            if key in GEOMETRY:
                raise ConfigError(f"model.options.{key}", _GEOMETRY_WHY)
            if key not in fields:
                raise ConfigError(
                    f"model.options.{key}",
                    f"is not an option of {cfg.matcher}; valid: {', '.join(sorted(fields - set(GEOMETRY)))}",
                )
            if key in spec.preset:
                raise ConfigError(
                    f"model.options.{key}",
                    f"is fixed to {spec.preset[key]!r} by model.matcher={cfg.matcher}: drop it",
                )
    else:
        values = getattr(cfg, section)
        for key, value in spec.preset.items():
            if getattr(values, key) != getattr(type(values)(), key):
                raise ConfigError(
                    f"model.{section}.{key}",
                    f"is fixed to {value!r} by model.matcher={cfg.matcher}: leave it at its default",
                )
        if cfg.options:
            raise ConfigError(
                f"model.options.{next(iter(cfg.options))}",
                f"has no effect with model.matcher={cfg.matcher} (it reads model.{section})",
            )
    try:  # the options' own checks (those that need no token geometry)
        config = _options_config(cfg)
        check_config_fields(config)
        if hasattr(config, "check"):
            config.check()
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model.{section}", str(err)) from None
    for name in typed_sections() if unread_sections else []:
        changed = config_diff(type(getattr(cfg, name))(), getattr(cfg, name)) if name != section else []
        if changed:
            raise ConfigError(
                f"model.{name}.{changed[0]}",
                f"has no effect with model.matcher={cfg.matcher} (it reads model.{section})",
            )


def override_paths(item: str) -> list[str]:
    """The dotted keys override ``item`` sets: its key, and where it gives a section a mapping (the config
    loader takes ``model.seps={detach_selection: true}`` as the section's new value) every key path inside
    it (``model.seps.detach_selection``); in a whole ``model`` mapping the legacy ``matcher_args`` mapping is
    read as the matcher's section, as the loader reads it. An item without ``=`` sets none (the loader names
    it)."""
    import yaml

    if "=" not in item:
        return []
    key, raw = (part.strip() for part in item.split("=", 1))
    try:
        value = yaml.safe_load(raw) if raw else None  # as the loader parses a section's value
    except yaml.YAMLError:
        value = None  # not a mapping: the loader names the key
    if key == "model" and isinstance(value, dict) and isinstance(value.get("matcher_args"), dict):
        try:
            section = matcher_section(str(value.get("matcher", ModelConfig.matcher)))
        except ConfigError:
            section = "matcher_args"  # an unknown matcher: the loader names it
        value = {**value, section: value["matcher_args"]}

    def paths(prefix: str, value) -> list[str]:
        inner = value.items() if isinstance(value, dict) else ()
        return [prefix, *(path for sub, v in inner for path in paths(f"{prefix}.{sub}", v))]

    return paths(key, value)


def within(key: str, item: str) -> str:
    """Where a refused key that is not the override's own key was set (in a section's mapping)."""
    return "" if item.split("=", 1)[0].strip() == key else f" (in override {item!r})"


def unread_option_overrides(cfg: ModelConfig, overrides: Iterable[str]) -> dict[str, str]:
    """Each override item of ``overrides`` that sets a typed matcher section (dotted, or in a mapping given
    to a section or to the whole ``model``) other than the one ``cfg.matcher`` reads -> the first such key:
    it would do nothing. Aliases are read as the loader reads them (``model.variant``: ``model.seps``)."""
    section, typed, unread = matcher_section(cfg.matcher), typed_sections(), {}
    for item in overrides:
        for key in override_paths(item):
            path = key.removeprefix("model.")
            name = ModelConfig.ALIASES.get(path, path).partition(".")[0]
            if key.startswith("model.") and name in typed and name != section:
                unread[item] = key
                break
    return unread


def check_option_overrides(cfg: ModelConfig, overrides: Iterable[str]) -> None:
    """The ``model.*`` overrides given to a saved run (``patchword eval RUN model.seps.sparse_ratio=0.6``;
    ``cfg``: its config with them applied) checked as a new run's config is: one of a typed section the
    matcher does not read (:func:`unread_option_overrides`), or token geometry in ``model.options``, would
    do nothing or override the encoders'. A build leaves both to this (:func:`check_matcher_options` with
    ``unread_sections=False``: a recipe rebuilds a run's encoders under another matcher and keeps the run's
    own section; a saved run's own geometry is accepted where it agrees, :func:`split_saved_geometry`). An
    item without ``=`` is left to the config loader.

    Raises:
        ConfigError: naming the key.
    """
    overrides = list(overrides)
    if not any(key.startswith("model") for key in override_keys(overrides)):
        return  # a run of a matcher not registered here is read without its section looked up
    section = matcher_section(cfg.matcher)
    for item in overrides:
        for key in override_paths(item):
            path = key.removeprefix("model.")
            name, _, option = ModelConfig.ALIASES.get(path, path).partition(".")
            if name == "options" and section == "options" and option.partition(".")[0] in GEOMETRY:
                raise ConfigError(key, _GEOMETRY_WHY + within(key, item))
    for item, key in unread_option_overrides(cfg, overrides).items():
        why = f"has no effect with model.matcher={cfg.matcher} (it reads model.{section})"
        raise ConfigError(key, why + within(key, item))


def split_saved_geometry(cfg: ModelConfig) -> tuple[ModelConfig, dict[str, Any]]:
    """A saved run's model config without the token geometry (``embed_dim``, ``num_patches``, ``has_cls``)
    its ``model.options`` holds, and those values (``{}``: none; a matcher with a typed section, which
    never held them). A plug-in run saved before every build refused them there kept them (its matcher was
    built with them), and ``config.yaml`` is never rewritten: :func:`~patchword.model.build.build_model`
    (``saved=``) checks them against the encoders' instead. A key its matcher's config lacks stays, for
    :func:`check_matcher_options` to refuse as it always did."""
    if matcher_section(cfg.matcher) != "options":
        return cfg, {}
    fields = {f.name for f in dataclasses.fields(matcher_spec(cfg.matcher).config_cls)}
    geometry = {k: v for k, v in cfg.options.items() if k in GEOMETRY and k in fields}
    if not geometry:
        return cfg, {}
    options = {k: v for k, v in cfg.options.items() if k not in geometry}
    return dataclasses.replace(cfg, options=options), geometry


def _options_config(cfg: ModelConfig) -> Any:
    """The matcher's config object from its preset and options, the token geometry left at the class's
    defaults (a field without one gets a stand-in: the encoders give the real value at the build)."""
    spec = matcher_spec(cfg.matcher)
    required = {
        f.name
        for f in dataclasses.fields(spec.config_cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    stand_in = {"embed_dim": cfg.embed_dim, "num_patches": 1, "has_cls": False}
    stand_in = {k: v for k, v in stand_in.items() if k in required}
    return spec.config_cls(**{**stand_in, **spec.preset, **matcher_arguments(cfg)})


def resolved_matcher_options(cfg: ModelConfig) -> dict[str, Any]:
    """Every option the matcher of ``cfg`` is built with, a default as its value: its config class built
    from the preset and the section (``model.options`` for a plug-in), the token geometry left out."""
    return {k: v for k, v in dataclasses.asdict(_options_config(cfg)).items() if k not in GEOMETRY}


def reported_options(cfg: ModelConfig, matcher: nn.Module | None = None) -> dict[str, Any]:
    """The option fields the registration of ``cfg.matcher`` reports (SEPS / LAPS: ``variant``) with the
    values the matcher used: those of the built ``matcher``'s ``config`` where it keeps one, else resolved
    from ``cfg`` (:func:`resolved_matcher_options`): an option left at its default is recorded as its
    value."""
    built = getattr(matcher, "config", None)
    resolved = None
    out = {}
    for key in matcher_spec(cfg.matcher).report:
        if built is not None and hasattr(built, key):
            out[key] = getattr(built, key)
        else:
            resolved = resolved if resolved is not None else resolved_matcher_options(cfg)
            out[key] = resolved.get(key)
    return out


def _plain(value: Any) -> bool:
    """Whether a YAML file holds ``value`` as it is (a tuple would come back a list)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, dict) and all(isinstance(k, str) and _plain(v) for k, v in value.items())


def resolve_plugin_options(cfg: ModelConfig) -> None:
    """A plug-in matcher's ``model.options`` completed in ``cfg`` with the value of every option it is
    built with (:func:`resolved_matcher_options`), as a typed section holds all its fields: what a new
    run's ``config.yaml`` saves (``options: {}`` in a run saved before keeps loading: the defaults then).
    A value a YAML file would not give back as it is (a tuple) stays unwritten, the default it was. A
    matcher with a typed section is left alone. Call it after :func:`check_matcher_options`."""
    if matcher_section(cfg.matcher) != "options":
        return
    resolved = resolved_matcher_options(cfg)
    cfg.options = {k: v for k, v in resolved.items() if k in cfg.options or _plain(v)}
