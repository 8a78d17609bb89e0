"""JSON objects that give one key twice, refused: Python's ``json`` keeps the last value without a word, so
an ``id_mapping.json`` listing one id twice would map it to the second file, a Karpathy json image
entry with two ``sentences`` lists would lose the first, and a dense-caption line with two ``text`` fields
would train on the second."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from patchword.errors import DataError

__all__ = ["unique_keys"]


def unique_keys(path: Path | str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """An ``object_pairs_hook`` for ``json.load`` of the file at ``path`` (or ``json.loads`` of one line of
    a JSONL file: ``path`` is then ``"FILE:LINE"``): each object as a dict, or a
    :class:`~patchword.errors.DataError` naming ``path`` and the first key the object gives twice."""

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        obj = dict(pairs)  # built in C: a repeat costs one length comparison per object to notice
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise DataError(
                        f"{path}: key {key!r} appears twice in one JSON object (a JSON reader keeps only "
                        "the last value): remove or rename one"
                    )
                seen.add(key)
        return obj

    return hook
