"""The fields ``patchword report`` reads from the files it is given, checked once where each file is read:
a field of the wrong type (a number written as a string, a list where a name belongs, null where a time
belongs) is one :class:`~patchword.errors.DataError` naming the file and the field, never a ``TypeError``
from a format string or a division deep in a table.

A file is checked against a table of its fields (``{"cost.pairs": NUMBER, ...}``; a dotted key reaches
into an object): absent fields, and null ones unless the table says otherwise, are left to the reader
(figures written before a field existed, a CPU's null device memory).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from patchword.errors import DataError

__all__ = ["AMOUNT", "FINITE", "FLAG", "LIST", "MAPPING", "NUMBER", "TEXT", "Kind", "check_fields"]


@dataclass(frozen=True)
class Kind:
    """What a field must hold: ``name`` for the message (``a number``), ``accepts`` the test."""

    name: str
    accepts: Callable[[Any], bool]


NUMBER = Kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
#: A count, a recall, a time, a size: NaN (which ``json`` reads from a damaged file), an infinity or a
#: negative value is no such figure (shown, ``nan`` would even win a comparison's star, ``-5`` steps read
#: as ``2 / -5``).
AMOUNT = Kind("a finite number >= 0", lambda v: NUMBER.accepts(v) and math.isfinite(v) and v >= 0)
FINITE = Kind("a finite number", lambda v: NUMBER.accepts(v) and math.isfinite(v))  # a weight: any sign
TEXT = Kind("a string", lambda v: isinstance(v, str))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
MAPPING = Kind("an object", lambda v: isinstance(v, dict))
LIST = Kind("a list", lambda v: isinstance(v, list))

_ABSENT = object()


def _reach(record: Mapping[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def check_fields(
    record: Mapping[str, Any],
    fields: Mapping[str, Kind],
    where: str,
    *,
    required: Collection[str] = (),
    not_null: Collection[str] = (),
) -> None:
    """Check ``record``'s ``fields`` (dotted keys reach into objects; an object is checked before what is
    in it). ``required``: fields that must be present (all missing ones named at once); ``not_null``:
    fields that must not be null (any other null field counts as absent).

    Raises:
        DataError: ``"{where} lacks a, b"`` or ``"{where}: {field} is {value}, not {kind}"``.
    """
    missing = [key for key in required if _reach(record, key) is _ABSENT]
    if missing:
        raise DataError(f"{where} lacks {', '.join(missing)}")
    for key in sorted(fields, key=lambda k: k.count(".")):
        value = _reach(record, key)
        if value is _ABSENT or (value is None and key not in not_null):
            continue
        if not fields[key].accepts(value):
            raise DataError(f"{where}: {key} is {_shown(value)}, not {fields[key].name}")
