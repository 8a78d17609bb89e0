"""What a densify run generates: the prompt and the decoding settings, and where it runs.

The settings that change the generated text (:class:`GenerationSettings`, the model and the precision) are
recorded next to the output, so a rerun that would mix two kinds of text into one file is refused.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from patchword.errors import ConfigError

__all__ = ["DEFAULT_PROMPT", "GenerationSettings", "resolve_device", "resolve_precision", "PRECISIONS"]

#: The SEPS prompt (paper, section on dense text generation): LLaVA was asked exactly this for every image.
DEFAULT_PROMPT = "Provide a comprehensive description of this image"

PRECISIONS: Mapping[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding of one description per image.

    Greedy decoding (the default) is deterministic: a rerun reproduces the same text. Sampling follows
    the SEPS paper's settings (temperature 0.2, top-p 0.9) and is made reproducible by seeding every
    batch from ``seed`` and the batch's position in the image list.

    Attributes:
        prompt: the instruction shown with each image.
        max_new_tokens: generated tokens per image at most (SEPS: 500).
        do_sample: sample instead of greedy decoding.
        temperature: sampling temperature (only with ``do_sample``).
        top_p: nucleus sampling mass (only with ``do_sample``).
        seed: base seed of the per-batch sampling seeds (only with ``do_sample``).
    """

    prompt: str = DEFAULT_PROMPT
    max_new_tokens: int = 500
    do_sample: bool = False
    temperature: float = 0.2
    top_p: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompt.strip():
            raise ConfigError("--prompt", "the prompt is empty")
        if self.max_new_tokens < 1:
            raise ConfigError("--max-new-tokens", f"must be at least 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):  # NaN passes a plain `<= 0`
            raise ConfigError("--temperature", f"must be a positive finite number, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError("--top-p", f"must be in (0, 1], got {self.top_p}")

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form; the sampling fields are left out of greedy settings (they change nothing)."""
        out = dataclasses.asdict(self)
        if not self.do_sample:
            for key in ("temperature", "top_p", "seed"):
                out.pop(key)
        return out


def resolve_device(device: str, environ: Mapping[str, str] | None = None) -> torch.device:
    """:func:`patchword.device.resolve_device` for ``--device``, and under torchrun the GPU of this rank
    (``LOCAL_RANK``) when ``auto`` or ``cuda`` names no index (each rank densifies its own shard).

    Raises:
        ConfigError: CUDA was asked for but is not available, or the name is not a device.
    """
    from patchword.device import resolve_device as resolve

    environ = os.environ if environ is None else environ
    resolved = resolve(device, key="--device")
    if resolved.type == "cuda" and resolved.index is None and "LOCAL_RANK" in environ:
        return torch.device("cuda", int(environ["LOCAL_RANK"]) % torch.cuda.device_count())
    return resolved


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` -> bf16 on a GPU that supports it, else fp32; fp16 needs a GPU.

    Returns:
        one of the keys of :data:`PRECISIONS`.
    """
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp32"
    if precision not in PRECISIONS:
        raise ConfigError("--precision", f"expected auto, fp32, bf16 or fp16, got {precision!r}")
    if precision == "fp16" and device.type == "cpu":
        raise ConfigError("--precision", "fp16 generation needs a GPU; use bf16 or fp32 on the CPU")
    return precision
