"""Simulated kills for tests of multi-step file writes: :class:`Killed` stands for a SIGKILL, ``stopping``
wraps a file-system call so that its N-th call (counted over every wrapped call) is the kill, and ``kept``
replaces a cleanup (``shutil.rmtree``) that a killed process never runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Killed(BaseException):
    """Stands for a SIGKILL: no ``except Exception`` catches it (the file state it leaves is a kill's)."""


def stopping(real: Callable[..., Any], calls: dict[str, int]) -> Callable[..., Any]:
    """``real``, its calls counted in ``calls["n"]`` with the others': call ``calls["stop_at"]`` is killed."""

    def call(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == calls["stop_at"]:
            raise Killed
        return real(*args, **kwargs)

    return call


def kept(*args, **kwargs) -> None:
    """``shutil.rmtree`` after a kill: nothing is cleaned up."""
