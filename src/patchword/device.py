"""Turn a ``device`` config value into a ``torch.device``, with one clear error when it is unavailable."""

from __future__ import annotations

import re

import torch

from patchword.errors import ConfigError

__all__ = ["resolve_device"]

_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def resolve_device(spec: str | torch.device, key: str = "device") -> torch.device:
    """``auto`` -> CUDA when available (else CPU); ``cpu`` / ``cuda`` / ``cuda:N`` / ``mps`` checked.

    Raises:
        ConfigError: a malformed value, or a device this machine does not have (names ``key``).
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    if not _PATTERN.match(spec):
        raise ConfigError(key, f"must be auto, cpu, cuda, cuda:N or mps, got {spec!r}")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this PyTorch build has no CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ConfigError(
                key, f"{spec} requested but CUDA is not available ({why}); use device=auto or cpu"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(key, f"{spec} requested but this machine has {count} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(key, "mps requested but the Apple MPS backend is not available; use device=auto")
    return device
