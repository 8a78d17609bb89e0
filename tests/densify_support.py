"""What the densify tests share (tests/densify and the fault-injection suite): a folder of small random
images, and the arguments of a cheap ``patchword densify`` run with the in-process ``tiny-random`` model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

TOKENS = 6  # new tokens per description: enough to differ between images, cheap on a CPU
RUN = ["--model", "tiny-random", "--max-new-tokens", str(TOKENS), "--batch-size", "8", "--no-progress"]


def write_images(root: Path, names: list[str], seed: int = 0) -> None:
    """Random RGB PNGs of 10-29 pixels a side at ``root/name`` for each name (folders created)."""
    rng = np.random.default_rng(seed)
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        h, w = rng.integers(10, 30, size=2)
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)


def laps_split_args(data: Path, images: Path, out: Path, split: str = "test") -> list[str]:
    """``patchword densify`` flags for a LAPS-layout split (``data``) whose images are in ``images``."""
    return ["--data-root", str(data), "--split", split, "--image-root", str(images), "--out", str(out)]
