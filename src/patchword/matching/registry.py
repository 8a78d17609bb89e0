"""Registry and factory for matchers: ``build_matcher("seps", embed_dim=512, ...)``.

A matcher is one plug-in: the ``@register_matcher`` decorator on its class declares everything the rest of
patchword needs to know about it (as timm's ``@register_model``), so nothing else names it:

* its options dataclass (every constructor argument) and a preset (``laps`` is ``seps`` without dense text);
* ``section``: where its options live in a run config (``model.<section>``; ``laps`` reads ``seps``);
* ``losses``: the training losses it can be trained with (``infonce`` needs a learned temperature: the
  class overrides :meth:`~patchword.matching.Matcher.temperature_scale`, checked at registration);
* ``pair_chunk``: whether its training step can be scored in blocks of captions (``train.pair_chunk``);
* ``engine``: its fast exact scoring engine, as ``"module:Class"`` (the shape is checked at registration,
  the import waits until first use; without one the evaluation calls its forward block by block);
* ``report``: option fields every metrics file records (SEPS: ``variant``);
* ``training_only``: option fields that change training only (gradients, training losses, what training
  fits), each with why: an evaluation, whose scores they cannot change, refuses an override of one
  (``patchword eval RUN model.<section>.<field>=...``) rather than applying it and ignoring it.

Its options dataclass may define ``check(self) -> None``, the options' own checks that need no token
geometry (a range, values that cannot work together), raising ``ValueError`` / ``TypeError``: a training
run's config is checked with it before anything is written (``train/matcher_checks.py``), what it raises
reported as one line naming ``model.<section>`` (``model.options`` for a plug-in without a typed section).
:func:`build_matcher` does not call it: a constructor that needs it calls it too (as ``SEPSConfig``'s).

The built-in matchers register when :mod:`patchword.matching` is imported (its ``__init__`` imports them);
a third-party matcher registers by being imported: by the user's code, or by patchword itself when its
distribution declares an entry point in the ``patchword.matchers`` group (``[project.entry-points.
"patchword.matchers"] my_matcher = "my_package.matcher"``), so ``patchword train model.matcher=...`` finds
it from the shell. The registry itself imports no matcher; it imports the entry points the first time a
name is looked up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from patchword.errors import ConfigError
from patchword.matching.base import Matcher
from patchword.matching.config_check import check_config_fields

__all__ = [
    "MatcherSpec",
    "UnknownMatcherError",
    "register_matcher",
    "build_matcher",
    "list_matchers",
    "matcher_spec",
    "matcher_spec_for",
    "matcher_config_class",
    "matcher_reads_dense",
    "matcher_preset",
    "GEOMETRY",
    "LOSSES",
    "matcher_reads_stage1_tokens",
    "ENTRY_POINT_GROUP",
    "load_plugins",
]

#: Training losses a matcher may declare: the VSE++ hinge on its sims, or CLIP's symmetric InfoNCE scaled
#: by the matcher's learned temperature (``Matcher.temperature_scale``).
LOSSES = ("hinge", "infonce")


class UnknownMatcherError(ConfigError, KeyError):
    """A matcher name nothing registered: a :class:`~patchword.errors.ConfigError` on ``model.matcher`` (the
    command line prints it as one line, exit code 2), and a ``KeyError`` as before, for callers catching
    that. ``args[0]`` is the message without the key (what the ``KeyError`` said)."""

    def __init__(self, name: str, registered: list[str]) -> None:
        super().__init__(
            "model.matcher",
            f"unknown matcher {name!r}; registered: {', '.join(registered)} (a plug-in matcher registers "
            "when its module is imported, or from its installed distribution's entry point)",
        )
        self.name, self.registered = name, registered
        self.args = (self.detail,)

    def __reduce__(self):  # pickled across processes: rebuilt from what __init__ takes
        return type(self), (self.name, self.registered)

    # KeyError's str() would quote the message as a key; ConfigError's says "model.matcher: ..."
    def __str__(self) -> str:
        return f"{self.key}: {self.detail}"


@dataclass(frozen=True)
class MatcherSpec:
    """What registration declares about a matcher (see the module docstring)."""

    name: str
    cls: type
    config_cls: type
    preset: dict[str, Any]
    section: str
    losses: tuple[str, ...] = ("hinge",)
    pair_chunk: bool = False
    engine: str | None = None
    report: tuple[str, ...] = ()
    training_only: dict[str, str] = dataclasses.field(default_factory=dict)


_REGISTRY: dict[str, MatcherSpec] = {}


def _check_engine_string(name: str, engine: object) -> None:
    """``engine`` must be ``None`` or ``"module:Class"`` (a dotted module path and a class name). Only its
    shape is checked here, naming the matcher: the module is imported when the matcher is first scored (an
    engine may import heavy dependencies), where a failing import names the matcher and this string."""
    if engine is None:
        return
    module, colon, attr = engine.partition(":") if isinstance(engine, str) else ("", "", "")
    if not (colon and attr.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        raise ValueError(
            f"matcher {name!r}: engine must be 'module:Class' (a module path and the engine class in it, "
            f"e.g. 'my_package.engine:MyEngine'), got {engine!r}"
        )


def register_matcher(
    name: str,
    config_cls: type,
    *,
    section: str | None = None,
    losses: tuple[str, ...] = ("hinge",),
    pair_chunk: bool = False,
    engine: str | None = None,
    report: tuple[str, ...] = (),
    training_only: dict[str, str] | None = None,
    **preset: Any,
) -> Callable[[type], type]:
    """Class decorator registering a matcher under ``name``.

    Args:
        name: the registry name (``model.matcher``).
        config_cls: the dataclass holding every constructor argument.
        section: the run-config section of its options (default ``name``).
        losses: training losses it supports (of :data:`LOSSES`).
        pair_chunk: its training step may be chunked over captions.
        engine: ``"module:Class"`` of its scoring engine (a :class:`~patchword.eval.engine.ScoringEngine`
            taking the matcher), or None for block-wise forward calls. Its shape is checked now; the module
            is imported when the matcher is first scored.
        report: option fields written into every metrics file.
        training_only: option field -> why it changes training only (``{"detach_selection": "it only
            changes gradients"}``); an evaluation refuses an override of one, saying why.
        **preset: option values fixed for this name (the same class may be registered several times).

    ``config_cls`` may define ``check(self) -> None``: the options' own checks that need no token geometry,
    raising ``ValueError`` / ``TypeError``; a training run's config is checked with it before anything is
    written (the error one line naming ``model.<section>``, or ``model.options``). :func:`build_matcher`
    does not call it (a constructor that needs it calls it itself).

    Raises:
        ValueError: unknown fields in ``preset``/``report``/``training_only``, unknown losses, an
            ``engine`` that is not ``"module:Class"``, a name registered twice.
        TypeError: the decorated class is not a :class:`~patchword.matching.Matcher` subclass, or declares
            the ``infonce`` loss without overriding :meth:`~patchword.matching.Matcher.temperature_scale`
            (the learned temperature that loss multiplies the sims by).
    """
    fields = {f.name for f in dataclasses.fields(config_cls)}
    training_only = dict(training_only or {})
    unknown = (set(preset) | set(report) | set(training_only)) - fields
    if unknown:
        raise ValueError(
            f"matcher {name!r}: preset, report or training_only names unknown fields {sorted(unknown)}"
        )
    if set(losses) - set(LOSSES) or not losses:
        raise ValueError(f"matcher {name!r}: losses must be a non-empty subset of {LOSSES}, got {losses}")
    _check_engine_string(name, engine)

    def decorator(cls: type) -> type:
        # The rest of patchword reads the Matcher contract's attributes (consumes_dense, global_embed...):
        # a plain nn.Module would register and then fail far from here with an AttributeError.
        if not (isinstance(cls, type) and issubclass(cls, Matcher)):
            raise TypeError(
                f"matcher {name!r}: {getattr(cls, '__qualname__', cls)!r} is not a subclass of "
                "patchword.matching.Matcher (the contract every matcher implements)"
            )
        # InfoNCE multiplies the sims by temperature_scale(): the base class's None would fail at the first
        # training step (Tensor * None), far from the registration that declared the loss
        if "infonce" in losses and cls.temperature_scale is Matcher.temperature_scale:
            raise TypeError(
                f"matcher {name!r}: losses include 'infonce', which scales the sims by a learned "
                f"temperature, but {cls.__qualname__} does not override Matcher.temperature_scale() (return "
                "the learned inverse temperature, as clip / filip do), or declare losses=('hinge',)"
            )
        if name in _REGISTRY:
            raise ValueError(f"matcher {name!r} is already registered")
        _REGISTRY[name] = MatcherSpec(
            name,
            cls,
            config_cls,
            dict(preset),
            section or name,
            tuple(losses),
            pair_chunk,
            engine,
            report,
            training_only,
        )
        return cls

    return decorator


#: The entry-point group third-party matchers declare (each entry point names a module that registers one).
ENTRY_POINT_GROUP = "patchword.matchers"
_plugins_loaded = False


def load_plugins() -> list[str]:
    """Import every module declared in the :data:`ENTRY_POINT_GROUP` entry points (once per process);
    returns the names of the entry points imported now. A plug-in that fails to import is logged with its
    error and left out: one broken distribution must not stop patchword."""
    import logging
    from importlib.metadata import entry_points

    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as err:  # a third party's import error, whatever its type
            logging.getLogger(__name__).warning(
                "matcher plug-in %r (%s) failed to load: %s: %s",
                entry.name,
                entry.value,
                type(err).__name__,
                err,
            )
        else:
            loaded.append(entry.name)
    return loaded


def list_matchers() -> list[str]:
    """Names of all registered matchers (entry-point plug-ins included), sorted."""
    load_plugins()
    return sorted(_REGISTRY)


def matcher_spec(name: str) -> MatcherSpec:
    """What matcher ``name`` declared at registration.

    Raises:
        UnknownMatcherError: unknown matcher name (a ``ConfigError`` on ``model.matcher`` and a ``KeyError``).
    """
    if name not in _REGISTRY:
        load_plugins()
    if name not in _REGISTRY:
        raise UnknownMatcherError(name, sorted(_REGISTRY))
    return _REGISTRY[name]


def matcher_spec_for(matcher: nn.Module) -> MatcherSpec | None:
    """The registration of a matcher instance's class (the first of its names; None if unregistered)."""
    for cls in type(matcher).__mro__:
        for spec in _REGISTRY.values():
            if spec.cls is cls:
                return spec
    return None


def matcher_config_class(name: str) -> type:
    """The config dataclass of matcher ``name``."""
    return matcher_spec(name).config_cls


def matcher_preset(name: str) -> dict[str, Any]:
    """The config values registration fixes for ``name`` (``laps``: ``use_dense=False``)."""
    return dict(matcher_spec(name).preset)


def matcher_reads_dense(name: str, **kwargs: Any) -> bool:
    """Whether matcher ``name`` built with ``kwargs`` reads dense text, without building it."""
    spec = matcher_spec(name)
    return spec.cls.reads_dense(spec.config_cls(**{**spec.preset, **kwargs}))


def matcher_reads_stage1_tokens(name: str, **kwargs: Any) -> bool:
    """Whether matcher ``name`` built with ``kwargs`` reads stage-1 context tokens, without building it."""
    spec = matcher_spec(name)
    return spec.cls.reads_stage1_tokens(spec.config_cls(**{**spec.preset, **kwargs}))


#: The token geometry every matcher is offered (``build_model`` passes the image encoder's). A matcher whose
#: config lacks one of these fields does not use it: ``num_patches`` is then dropped, and ``has_cls=True``
#: is an error (a region matcher would treat the CLS token as one more region).
GEOMETRY = ("embed_dim", "num_patches", "has_cls")


def _geometry_for(name: str, fields: set[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(kwargs)
    if "num_patches" not in fields:
        kwargs.pop("num_patches", None)
    if "has_cls" not in fields and kwargs.pop("has_cls", False):
        raise ValueError(
            f"matcher {name!r} takes image tokens without a CLS token (region features, Swin patches), but "
            "has_cls=True: the image encoder puts a CLS token first (a ViT, the tiny encoder); use a Swin "
            "backbone (model.hf_vision) or region features (model.image_encoder=precomp)"
        )
    return kwargs


def build_matcher(name: str, config: Any = None, **kwargs: Any) -> Matcher:
    """Build a registered matcher.

    The preset ``name`` was registered with (``laps``: ``use_dense=False``; ``clip``:
    ``learn_temperature=True``) holds on both construction paths: ``build_matcher(name, config=cfg)``
    builds the same matcher as ``build_matcher(name, **fields_cfg_sets)``.

    * A keyword is the caller's explicit choice and wins over the preset (as it wins over ``config``).
    * A ``config`` value for a preset key that equals the config class's default is taken as unset and the
      preset's value is used: a config object carries every field, so ``SEPSConfig(embed_dim=...)`` given
      for ``laps`` builds laps, not SEPS.
    * A ``config`` value that differs from both the preset and the class default was set by the caller for
      another family: refused with a ``ValueError`` naming the key and the family, rather than silently
      building something else. (The built-in presets flip a boolean default, so for them every config
      value is the preset's or the default; the check matters for presets of other values.)

    Args:
        name: registry name (see :func:`list_matchers`).
        config: an optional config dataclass instance (or dict) to start from instead of the defaults.
        **kwargs: config fields to override, e.g. ``embed_dim=512, sparse_ratio=0.5``; the
            :data:`GEOMETRY` keys may be given to every matcher.

    Raises:
        UnknownMatcherError: unknown matcher name (a ``KeyError``).
        TypeError: a keyword that is not a field of the matcher's config.
        TypeError / ValueError: a field of the wrong type or outside its ``Literal`` choices, named
            (:func:`~patchword.matching.config_check.check_config_fields`); ``has_cls=True`` for a matcher
            that takes no CLS token; a ``config`` that sets a preset key of ``name`` to another value.
    """
    spec = matcher_spec(name)
    base = (
        {} if config is None else (dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config)
    )
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    kwargs = _geometry_for(name, fields, kwargs)
    unknown = (set(base) | set(kwargs)) - fields
    if unknown:
        raise TypeError(
            f"matcher {name!r} got unknown argument(s) {sorted(unknown)}; valid: {sorted(fields)}"
        )
    base = _config_under_preset(spec, base, set(kwargs))
    cfg = spec.config_cls(**{**spec.preset, **base, **kwargs})
    check_config_fields(cfg)
    return spec.cls(cfg)


def _config_under_preset(spec: MatcherSpec, base: dict[str, Any], by_keyword: set[str]) -> dict[str, Any]:
    """``base`` (a ``config`` given to :func:`build_matcher`) without the preset keys it leaves at the
    config class's default: a whole config object carries every field, so a default value there says
    nothing about the caller's intent and must not replace the family's preset. A value that differs from
    both is a config written for another family: refused (keywords, the explicit choice, are not checked)."""
    defaults = {f.name: _field_default(f) for f in dataclasses.fields(spec.config_cls)}
    kept = dict(base)
    for key, preset_value in spec.preset.items():
        if key not in kept or key in by_keyword or kept[key] == preset_value:
            continue
        if kept[key] != defaults[key]:
            raise ValueError(
                f"matcher {spec.name!r} fixes {key}={preset_value!r}, but the config sets {key}="
                f"{kept[key]!r} (that is not {spec.name}): leave {key} at its default or pass it by keyword"
            )
        del kept[key]
    return kept


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING
