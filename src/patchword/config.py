"""Dataclass configs: the single source of truth, with YAML files and dotted overrides on top.

``load_config(RunConfig, "run.yaml", ["model.seps.sparse_ratio=0.6", "train.epochs=3"])`` builds the
dataclass from its defaults, applies the YAML file, then the overrides (values parsed as YAML scalars,
so ``true``, ``1e-4`` and ``[9, 15]`` work). Every value is checked against its field's type hint:
unknown keys, wrong types and values outside a ``Literal[...]`` are :class:`~patchword.errors.ConfigError`
naming the dotted key, never silently accepted; an unknown key's message lists the valid keys of its section
and suggests the closest one (``model.sesp: unknown config key (did you mean model.seps?); valid keys of
model: ...``).

A dataclass may declare ``ALIASES`` (a class variable: old field name -> dotted path of its new place)
so that config files, saved runs and overrides written for an earlier layout keep loading; each use logs a
deprecation warning.

Over 400 lines: parsing, overrides, type checks, aliases and named sections share their helpers and their
error messages.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
import types
import typing
from collections.abc import Iterable, KeysView
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from patchword.errors import ConfigError

__all__ = [
    "load_config",
    "config_from_mapping",
    "parse_with_overrides",
    "unknown_key_error",
    "apply_overrides",
    "override_keys",
    "config_to_dict",
    "save_config",
    "from_dict",
    "config_diff",
    "refuse_edited_config",
    "flat_config",
    "field_subset",
    "check_common_values",
    "check_dir_name",
]

T = TypeVar("T")

_logger = logging.getLogger(__name__)


def _aliases(cls: type) -> dict[str, str]:
    return dict(vars(cls).get("ALIASES", {})) if isinstance(cls, type) else {}


def _set_path(data: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        data = data.setdefault(part, {})
    data.setdefault(path[-1], value)  # an explicit new-style value wins over its alias


def _upgrade(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """Move legacy keys of ``cls`` (its ``upgrade_legacy`` hook, then its ``ALIASES``) to their new place,
    recursively."""
    hook = vars(cls).get("upgrade_legacy")
    if hook is not None:
        data = hook.__get__(None, cls)(dict(data))
    aliases = _aliases(cls)
    if aliases and any(k in aliases for k in data):
        data = dict(data)
        for old, new in aliases.items():
            if old in data:
                _logger.warning("config key %s%s is deprecated: use %s%s", where, old, where, new)
                _set_path(data, new.split("."), data.pop(old))
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = _dataclass_type(hints[f.name])
        if sub is not None and isinstance(data.get(f.name), dict):
            data = {**data, f.name: _upgrade(sub, data[f.name], f"{where}{f.name}.")}
    return data


def field_subset(cls: type, exclude: tuple[str, ...], name: str, module: str, doc: str = "") -> type:
    """A dataclass with the fields of dataclass ``cls`` (types and defaults) except ``exclude``.

    Used for config sections that expose a component's own config minus what the builder supplies
    (a matcher's options without the token geometry its encoders decide). Assign the result to ``name``
    in ``module`` (pickle finds it there; its string annotations resolve in that module's namespace).
    """
    kept = [
        (f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
        for f in dataclasses.fields(cls)
        if f.name not in exclude
    ]
    made = dataclasses.make_dataclass(name, kept)
    made.__module__ = module
    made.__doc__ = doc or f"The fields of :class:`{cls.__name__}` except {', '.join(exclude)}."
    made.__qualname__ = name
    return made


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass (nested) as plain dicts, lists and scalars."""
    return dataclasses.asdict(cfg)


def flat_config(cfg: Any) -> dict[str, Any]:
    """A dataclass (nested) as ``{"dotted.key": value}``, the keys overrides use."""

    def flat(d: dict[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            nested = isinstance(v, dict) and v and all(isinstance(x, str) for x in v)
            out.update(flat(v, f"{prefix}{k}.") if nested else {f"{prefix}{k}": v})
        return out

    return flat(config_to_dict(cfg), "")


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (what ``--config`` reads back), atomically."""
    from patchword.fileio import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from a (nested) dict, checking every key and value against the field types.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or a value outside a ``Literal``.
    """
    if not isinstance(data, dict):
        raise ConfigError(where, f"must be a mapping, got {type(data).__name__}")
    data = _upgrade(cls, data, f"{where}." if where else "")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise unknown_key_error(unknown, fields, where)
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        sub = _dataclass_type(hints[name])
        if sub is not None and isinstance(value, dict):
            kwargs[name] = from_dict(sub, value, key)
        else:
            kwargs[name] = _check_value(value, hints[name], key)
    return cls(**kwargs)


def unknown_key_error(
    unknown: str | list[str], valid: typing.Iterable[str], where: str = "", context: str = ""
) -> ConfigError:
    """The :class:`ConfigError` for keys ``unknown`` of section ``where`` (dotted, "" at the top level).

    One line: the dotted unknown keys, the closest valid key of each where there is one
    (``difflib.get_close_matches``), then the valid keys of the section; ``context`` follows "unknown
    config key" (`` in override '...'``).
    """
    names = [unknown] if isinstance(unknown, str) else list(unknown)
    valid = sorted(str(k) for k in valid)
    prefix = f"{where}." if where else ""
    suggestions = []
    for name in names:
        close = difflib.get_close_matches(str(name), valid, n=1)
        if close:
            suggestions.append(prefix + close[0] + (f" for {prefix}{name}" if len(names) > 1 else ""))
    hint = f" (did you mean {', '.join(suggestions)}?)" if suggestions else ""
    section = f" of {where}" if where else ""
    listing = ", ".join(valid) or "(none)"
    return ConfigError(
        ", ".join(prefix + str(n) for n in names),
        f"unknown config key{context}{hint}; valid keys{section}: {listing}",
    )


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


#: The strings a numeric field takes: plain decimal numerals (``1e-4`` is a string to PyYAML's YAML 1.1).
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _check_value(value: Any, hint: Any, key: str) -> Any:
    """``value`` converted to ``hint`` where YAML's scalar guess differs (``1e-4`` is a string to PyYAML,
    ``1`` an int where a float is declared), else a ConfigError naming ``key``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin is Literal:
        if value not in args:
            choices = ", ".join(str(a) for a in args)
            raise ConfigError(key, f"must be one of {choices}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check_value(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(key, f"expects {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expects a list, got {value!r}")
        item = args[0] if args else Any
        return [_check_value(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expects a mapping, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expects true or false, got {value!r}")
        return value
    if hint is int or hint is float:
        accepted, what = ((int,), "an integer") if hint is int else ((int, float), "a number")
        # A string is taken in plain decimal form only: PyYAML reads ``1e-4`` as one, but Python's int()
        # and float() would also take " 3_0 ", "inf" or "nan" and turn a typo into a setting.
        numeral = _INT_TEXT if hint is int else _FLOAT_TEXT
        if isinstance(value, str) and numeral.fullmatch(value):
            return hint(value)
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ConfigError(key, f"expects {what}, got {value!r}")
        return hint(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expects a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        raise ConfigError(key, f"expects a mapping of {hint.__name__} fields, got {value!r}")
    return value  # a type this loader does not check (a library object passed in code)


def parse_with_overrides(parser, argv: list[str] | None, config: type | None = None):
    """``parser.parse_args(argv)`` that also takes dotted overrides after options
    (``train --config x.yaml --no-plots train.epochs=3``): argparse ends a positional list at the first
    option, so the ``key=value`` items it leaves over are appended to ``args.overrides``; anything else
    left over is the usual "unrecognized arguments" error. (Intermixed parsing does not support
    sub-commands.) ``config``: the dataclass the overrides set (``RunConfig``), for the error of an
    unknown ``--eval-split dev`` to suggest the override ``eval.split=dev``."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            # the verb's own parser, when it set itself as ``_parser`` (its usage, its options) and the
            # unknown items follow the verb (one before it is the top-level parser's)
            verb = getattr(args, "_parser", parser)
            command = getattr(args, "command", None)
            argv_list = list(argv or [])
            if (
                command in argv_list
                and extra[0] in argv_list
                and argv_list.index(extra[0]) < argv_list.index(command)
            ):
                verb = parser
            keys = config if hasattr(args, "overrides") else None  # a verb without overrides: no key
            hint = _did_you_mean(verb, extra, keys, argv_list)
            verb.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        args.overrides = [*args.overrides, *extra]
    if hasattr(args, "_parser"):
        del args._parser
    return args


def _did_you_mean(parser, extra: list[str], config: type | None = None, argv: list[str] = ()) -> str:
    """``" (did you mean --suite?)"`` for the first unknown option close to one of ``parser``'s; before
    that, for an option spelling a key of ``config`` (``--split dev``, ``--eval-split=dev``: a key whose
    last part, or whose whole path, it names), ``" (did you mean the override eval.split=dev?)"``, its
    value the item after it in ``argv`` (argparse may have taken that one as an override)."""
    known = [option for action in parser._actions for option in action.option_strings]
    for arg in extra:
        if not arg.startswith("--"):
            continue
        name, value = (arg.split("=", 1) + [None])[:2]
        if config is not None:
            at = argv.index(arg) if arg in argv else len(argv)
            after = argv[at + 1] if at + 1 < len(argv) else None
            if value is None and after is not None and not after.startswith("-") and "=" not in after:
                value = after
            override = _override_of_option(config, name, value)
            if override:
                return f" (did you mean the override {override}?)"
        # an exact match is an option of this parser given where it is not read: no suggestion
        close = [c for c in difflib.get_close_matches(name, known, n=2, cutoff=0.7) if c != name]
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def _override_of_option(config: type, option: str, value: str | None) -> str:
    """``eval.split=dev`` for option ``--split`` (or ``--eval-split``, ``--eval.split``) and value ``dev``
    where it names one key of ``config`` (up to three, joined by "or"); ``=VALUE`` without a value
    (``=true`` for a boolean key); "" for no key."""
    name = option.lstrip("-").replace("-", "_")
    keys = [
        (key, hint)
        for key, hint in _config_keys(config)
        if name in (key, key.rsplit(".", 1)[-1], key.replace(".", "_"))
    ]
    exact = [(key, hint) for key, hint in keys if key == name or key.replace(".", "_") == name]
    keys = exact or keys
    if not keys or len(keys) > 3:
        return ""
    return " or ".join(
        f"{key}={value if value is not None else 'true' if hint is bool else 'VALUE'}" for key, hint in keys
    )


def _config_keys(cls: type, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """Every dotted key of the dataclass ``cls`` that holds a value, with its type hint (sections are
    walked into, a free-form mapping is one key)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        sub = _dataclass_type(hint)
        if sub is not None:
            yield from _config_keys(sub, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hint


def apply_overrides(cfg: T, overrides: list[str]) -> T:
    """Return a copy of ``cfg`` with ``section.field=value`` overrides applied; ``section={field: value}``
    sets those fields of the section (the others keep their values).

    An override naming a section's named configuration (``model.name=seps-tiny-paper``, see
    :func:`load_config`) applies first: the section becomes that configuration, and the section's other
    overrides apply on top of it, whatever their order.
    """
    data = config_to_dict(cfg)
    naming = [item for item in overrides if _names_a_base(type(cfg), item)]
    for item in naming:
        key, raw = item.split("=", 1)
        *path, _ = key.strip().split(".")
        sub = _section_class(type(cfg), path)
        node = data
        for part in path[:-1]:
            node = node[part]
        name = _unquote(raw)
        node[path[-1]] = {
            **_deep_merge(config_to_dict(sub()), sub.named_base(name), ".".join(path)),
            "name": name,
        }
    overrides = [item for item in overrides if item not in naming]
    for item in overrides:
        if "=" not in item:
            raise ConfigError("", f"override {item!r} must look like key.path=value")
        key, raw = item.split("=", 1)
        parts = _resolve_aliases(type(cfg), key.strip().split("."))
        key = ".".join(parts)
        node = data
        free = _free_form_depth(type(cfg), parts)
        for i, part in enumerate(parts):
            if part not in node:
                if free is not None and i > free:  # a free-form mapping (e.g. model.options): any key
                    node[part] = {} if i < len(parts) - 1 else None
                else:
                    raise unknown_key_error(part, node, ".".join(parts[:i]), f" in override {item!r}")
            if i < len(parts) - 1:
                if not isinstance(node[part], dict):
                    raise ConfigError(
                        ".".join(parts[: i + 1]), f"is a value, not a config section (in override {item!r})"
                    )
                node = node[part]
        value = _unquote(raw) if isinstance(node[parts[-1]], str) else _parse_scalar(raw)
        if isinstance(value, dict) and _section_class(type(cfg), parts) is not None:
            # a mapping for a section sets those keys of it, as a YAML file's section does: rebuilt from
            # the class defaults, the section lost the run's other values and earlier overrides
            value = _deep_merge(node[parts[-1]], value, key)
        # A string field takes the text as written (YAML would turn name=0613 into the integer 613).
        node[parts[-1]] = value
    return from_dict(type(cfg), data)


def override_keys(overrides: Iterable[str]) -> KeysView[str]:
    """The keys ``key=value`` overrides set, in their order, each once; set-like (``in``, ``&``, ``-``). An
    item without ``=`` is left to :func:`apply_overrides` to refuse."""
    return dict.fromkeys(item.split("=", 1)[0].strip() for item in overrides if "=" in item).keys()


def _section_class(cls: type, path: list[str]) -> type | None:
    """The dataclass at dotted ``path`` below ``cls`` (None if the path leaves the dataclasses)."""
    for part in path:
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if part not in hints or _dataclass_type(hints[part]) is None:
            return None
        cls = _dataclass_type(hints[part])
    return cls


def _names_a_base(cls: type, item: str) -> bool:
    """Whether override ``item`` sets the ``name`` of a section that offers named configurations."""
    if "=" not in item:
        return False
    parts = item.split("=", 1)[0].strip().split(".")
    if len(parts) < 2 or parts[-1] != "name":
        return False
    sub = _section_class(cls, parts[:-1])
    return sub is not None and hasattr(sub, "named_base")


def _free_form_depth(cls: type, parts: list[str]) -> int | None:
    """The position in ``parts`` of a field typed as a plain mapping (``dict[str, Any]``: keys not known
    to the config, such as a plug-in matcher's ``model.options``), or None."""
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        hint = hints[part]
        if hint is dict or typing.get_origin(hint) is dict:
            return i
        cls = hint
    return None


def _resolve_aliases(cls: type, parts: list[str]) -> list[str]:
    """``["model", "variant"]`` -> ``["model", "seps", "variant"]`` where a dataclass declares the alias."""
    out: list[str] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        if cls is None:
            out.extend(parts[i:])
            break
        fields = {f.name for f in dataclasses.fields(cls)}
        aliases = _aliases(cls)
        if part not in fields and part in aliases:
            new = aliases[part].split(".")
            _logger.warning(
                "config key %s is deprecated: use %s", ".".join([*out, part]), ".".join([*out, *new])
            )
            parts = [*parts[:i], *new, *parts[i + 1 :]]
            continue
        out.append(part)
        cls = _dataclass_type(typing.get_type_hints(cls).get(part)) if part in fields else None
        i += 1
    return out


def _unquote(raw: str) -> str:
    raw = raw.strip()
    return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"" else raw


def _parse_scalar(raw: str) -> Any:
    if not raw.strip():
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Defaults of ``cls``, then the YAML file at ``path`` (if any), then dotted ``overrides``."""
    cfg = cls()
    if path is not None:
        path = Path(path)
        from patchword.readers import read_yaml_mapping, require_file

        require_file(path, "config file")
        cfg = config_from_mapping(cls, read_yaml_mapping(path, "config file"), path)
    return apply_overrides(cfg, overrides or [])


def config_from_mapping(cls: type[T], data: dict[str, Any], path: str | Path) -> T:
    """Defaults of ``cls`` with ``data`` (a YAML file's mapping, already read from ``path``) on top: what
    :func:`load_config` does with the file, for a caller that has read it (errors name ``path``)."""
    try:
        data = _upgrade(cls, data, "")
        return from_dict(cls, _deep_merge(_named_bases(cls, config_to_dict(cls()), data, ""), data, ""))
    except ConfigError as err:
        raise ConfigError(err.key, f"{err.detail} (in {path})") from None


def _named_bases(cls: type, base: dict[str, Any], update: dict[str, Any], where: str) -> dict[str, Any]:
    """``base`` with every section that ``update`` names (``model: {name: seps-tiny-paper}``) replaced by
    that named configuration, so the rest of ``update``'s section applies on top of it. A dataclass
    offers names through a ``named_base(name) -> dict`` classmethod (``ModelConfig``: the model configs)."""
    hints = typing.get_type_hints(cls)
    out = dict(base)
    for f in dataclasses.fields(cls):
        sub, value = _dataclass_type(hints[f.name]), update.get(f.name)
        if sub is None or not isinstance(value, dict):
            continue
        section = base[f.name]
        name = value.get("name")
        if name and hasattr(sub, "named_base"):
            section = _deep_merge(section, sub.named_base(name), f"{where}{f.name}")
        out[f.name] = _named_bases(sub, section, value, f"{where}{f.name}.")
    return out


def _deep_merge(base: dict[str, Any], update: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(update, dict):
        raise ConfigError(where, "expected a mapping")
    out = dict(base)
    for key, value in update.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in base:
            raise unknown_key_error(str(key), base, where)
        # An empty default mapping is a free-form field: its keys are not known here.
        if isinstance(base[key], dict) and isinstance(value, dict) and base[key]:
            out[key] = _deep_merge(base[key], value, dotted)
        else:
            out[key] = value
    return out


def refuse_overrides(overrides: Iterable[str], allowed: Iterable[str], why: str, config: Any = None) -> None:
    """Refuse, naming it, the first ``key=value`` override whose key is not in ``allowed`` (a resume, an
    evaluation of a trained run: keys that would change what the run is); ``why`` ends the message. An item
    without ``=`` is left to :func:`apply_overrides`, which names it. With ``config`` (the config the
    overrides apply to), a key it does not have is refused as unknown first (:func:`apply_overrides` names
    it and the closest valid key): ``train.foo`` is no key that "cannot change"."""
    allowed = set(allowed)
    known = flat_config(config) if config is not None else None
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" in item and key not in allowed:
            if known is not None and key not in known:
                apply_overrides(config, [item])  # raises for an unknown key (an alias is a known one)
            raise ConfigError(key, why)


def refuse_edited_config(config_path: Path, saved: Any, stored: Any, resumable: Iterable[str]) -> None:
    """A run's ``config.yaml`` (``saved``) must say what its checkpoint (``stored``) was trained with, up to
    the keys a resume may change: a hand-edited file is refused, naming the keys."""
    allowed = set(resumable)
    edited = [k for k in config_diff(saved, stored) if k not in allowed]
    if edited:
        raise ConfigError(
            edited[0],
            f"{config_path} and last.pt disagree on {', '.join(edited)}: was {config_path.name} edited?",
        )


def config_diff(a: Any, b: Any) -> list[str]:
    """Dotted keys whose values differ between two configs of the same dataclass (sorted)."""
    fa, fb = flat_config(a), flat_config(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


def _dataclass_type(hint: Any) -> type | None:
    """The dataclass inside a type hint (``Foo`` or ``Foo | None``), else None."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


#: numpy's seed range (``np.random.seed`` refuses anything else): a seed outside it fails after the run
#: directory was written, so it is checked with the config
SEED_RANGE = (0, 2**32 - 1)


def check_common_values(cfg: Any, seeds: Iterable[str] = ("seed",), name_key: str | None = "name") -> None:
    """Checks every run config needs, before anything is written: no NaN in any value (a NaN compares false
    with every bound, so a range check alone lets it through to the first step), each key of ``seeds`` in
    :data:`SEED_RANGE`, and the run's name (``name_key``) a plain directory name.

    Raises:
        ConfigError: naming the key.
    """
    import math

    values = flat_config(cfg)
    for key, value in values.items():
        if isinstance(value, float) and math.isnan(value):
            raise ConfigError(key, "is NaN: give a number")
    low, high = SEED_RANGE
    for key in seeds:
        if not low <= values[key] <= high:
            raise ConfigError(key, f"must lie in [0, 2**32 - 1] (numpy's seed range), got {values[key]!r}")
    if name_key is not None:
        check_dir_name(values[name_key], name_key)


def check_dir_name(name: str, key: str, what: str = "the run's directory under output_dir") -> None:
    """``name`` (``what`` says whose directory it names) is one plain directory name: not ``.`` or ``..``, no
    path separator or NUL, and UTF-8 text (a name given as bytes that are not UTF-8 arrives
    holding surrogates, which ``config.yaml`` would store and every later reader of the run choke on).

    Raises:
        ConfigError: naming ``key``.
    """
    if name in (".", "..") or any(char in name for char in "/\\\0"):
        raise ConfigError(key, f"is {what}: a plain name, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            key, f"is {what}: a name in UTF-8 text, got {name!r} (bytes that are not UTF-8)"
        ) from None
