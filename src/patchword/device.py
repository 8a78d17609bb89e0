"""Turn a ``device`` config value into a ``torch.device``, with one clear error when it is unavailable; say
what a device and the machine around it are (what a measured time needs beside it)."""

from __future__ import annotations

import itertools
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from patchword.errors import ConfigError

__all__ = [
    "check_device_spec",
    "checked_device",
    "cpu_model",
    "describe_device",
    "module_device",
    "peak_host_rss_mb",
    "read_together",
    "reset_peak_host_rss",
    "resolve_device",
]

_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device_spec(spec: str, key: str = "device") -> None:
    """Refuse a ``device`` value that is not ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; whether this
    machine has that device is not checked (:func:`resolve_device` does).

    Raises:
        ConfigError: naming ``key``.
    """
    if not _PATTERN.fullmatch(spec):
        raise ConfigError(key, f"must be auto, cpu, cuda, cuda:N or mps, got {spec!r}")


def resolve_device(spec: str | torch.device, key: str = "device") -> torch.device:
    """``auto`` -> CUDA when available (else CPU); ``cpu`` / ``cuda`` / ``cuda:N`` / ``mps`` checked.

    Raises:
        ConfigError: a malformed value, or a device this machine does not have (names ``key``).
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    check_device_spec(spec, key)
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


def checked_device(device: object) -> torch.device:
    """``device`` as a ``torch.device`` (``"auto"``: :func:`resolve_device`'s choice); a name torch does not
    know, or a CUDA / MPS device this machine lacks, raises a ``ValueError`` naming ``device`` (instead of
    torch's bare AssertionError on first use)."""
    if device == "auto":
        return resolve_device("auto")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: not a torch device: {device!r} ({err})") from err
    if resolved.type in ("cuda", "mps"):
        resolve_device(resolved, key="device")  # a ConfigError (a ValueError) naming device when missing
    return resolved


def module_device(module: torch.nn.Module, fallback: torch.device | None = None) -> torch.device:
    """Where ``module`` lives: its first parameter's (or, with none, its first buffer's) device; for a
    module without either, ``fallback``, else the CPU."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    if first is not None:
        return first.device
    return fallback if fallback is not None else torch.device("cpu")


def read_together(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` on the host, each with its shape and dtype, in one copy (one wait for the device instead
    of one per tensor): flattened into one float64 buffer (float32 when one is on mps, which has no
    float64) on the device of the first that is not on the host. Float32 values come back bit-identical,
    and so do bool masks and integers below 2**53 (2**24 on mps)."""
    if not tensors:
        return []
    device = next((t.device for t in tensors if t.device.type != "cpu"), torch.device("cpu"))
    dtype = torch.float32 if device.type == "mps" else torch.float64
    flat = torch.cat([t.detach().reshape(-1).to(device, dtype) for t in tensors]).cpu()
    out, start = [], 0
    for t in tensors:
        out.append(flat[start : start + t.numel()].reshape(t.shape).to(t.dtype))
        start += t.numel()
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    if sys.platform == "darwin":  # platform.processor() says only "arm" or "i386"
        try:
            name = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
            if name:
                return name
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        fields = dict(
            (key.strip(), value.strip())
            for key, _, value in (
                line.partition(":") for line in Path("/proc/cpuinfo").read_text().splitlines()
            )
        )
        if fields.get("model name"):
            return fields["model name"]
        if fields.get("CPU part"):  # Arm Linux names no model: implementer and part tell the core apart
            implementer = fields.get("CPU implementer", "?")
            return f"{platform.machine()} (implementer {implementer}, part {fields['CPU part']})"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe_device(device: torch.device | str) -> dict[str, Any]:
    """Where a computation ran: ``device`` (``cuda:0``), ``device_name`` (the GPU's name, or the CPU model
    on the CPU), ``cpu`` (the host's model) and ``threads`` (torch's intra-op threads)."""
    device = torch.device(device)
    cpu = cpu_model()
    name = cpu
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type != "cpu":  # mps and others: the chip is the host's (Apple silicon)
        name = f"{device.type} ({cpu})"
    return {"device": str(device), "device_name": name, "cpu": cpu, "threads": torch.get_num_threads()}


def peak_host_rss_mb() -> float | None:
    """The process's peak resident memory in MiB since :func:`reset_peak_host_rss` last succeeded (Linux:
    ``VmHWM``), else since the process started (``ru_maxrss``: KiB on Linux, bytes on macOS); None where
    the system says neither (Windows)."""
    try:
        found = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        if found:
            return int(found.group(1)) / 1024
    except OSError:
        pass
    try:
        import resource  # Unix only: Windows has neither /proc nor this
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def reset_peak_host_rss() -> bool:
    """Start a new peak of :func:`peak_host_rss_mb` from the current resident memory (Linux: ``5`` to
    ``/proc/self/clear_refs``); False where the system cannot, and the peak stays the process's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
