"""argparse helpers for flags: ``type=`` functions for numeric flags (a value out of range is argparse's own
one-line error naming the flag, ``argument --images: must be >= 1, got 0``, exit code 2, before anything
runs), and :class:`Spelled`, which remembers which spelling of a flag with a hidden alias was given, so that
an error names the flag the user typed (``serve --torch-threads -1`` is refused as ``--torch-threads``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["Spelled", "int_at_least", "spelling"]


def int_at_least(low: int, meaning: str = "") -> Callable[[str], int]:
    """An ``int`` of at least ``low``; ``meaning`` (e.g. ``"0: torch's default"``) is added to the error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            note = f" ({meaning})" if meaning else ""
            raise argparse.ArgumentTypeError(f"must be >= {low}{note}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in some messages
    return parse


class Spelled(argparse.Action):
    """``store``, also remembering the option string that gave the value (read with :func:`spelling`): the
    action of a flag and of its hidden alias, which share one ``dest``."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        # a plain attribute of the namespace (argparse copies none of it): {dest: option string}
        namespace.__dict__.setdefault("_spelled", {})[self.dest] = option_string


def spelling(args: argparse.Namespace, dest: str, flag: str) -> str:
    """The option string the command line gave ``dest`` with (a :class:`Spelled` action), else ``flag``."""
    return getattr(args, "_spelled", {}).get(dest) or flag
