"""argparse ``type=`` functions for numeric flags: a value out of range is argparse's own one-line error
naming the flag (``argument --threads: must be >= 0, got -1``, exit code 2) before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_at_least"]


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
