"""What the densify tests share (tests/densify and the fault-injection suite): a folder of small random
images, the arguments of a cheap ``patchword densify`` run with the in-process ``tiny-random`` model, and
the fixtures of the modules that run on twelve images."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stall_support import HANG_GUARD_S

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


# Fixtures shared by the densify test modules that import them (``from densify_support import
# twelve_images, tiny_vlm, reference_file``; pytest registers them as image_dir, vlm and reference): twelve
# images, two batches of RUN's 8 (one shard per rank of two), the tiny random VLM, and the file one
# uninterrupted run writes for them. A module needing other images defines its own image_dir.
TWELVE = [f"img{i:02d}.png" for i in range(12)]


@pytest.fixture(scope="module", name="image_dir")
def twelve_images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    write_images(root, TWELVE)
    return root


@pytest.fixture(scope="module", name="vlm")
def tiny_vlm():
    from patchword.densify import load_vlm

    return load_vlm("tiny-random", device=torch.device("cpu"), precision="fp32")


@pytest.fixture(scope="module", name="reference")
def reference_file(image_dir, vlm, tmp_path_factory) -> bytes:
    """The file of one uninterrupted single-process run over ``image_dir`` (batch size 8, as ``RUN``)."""
    from patchword.densify import GenerationSettings, densify, images_from_folder

    out = tmp_path_factory.mktemp("ref") / "dense.jsonl"
    settings = GenerationSettings(max_new_tokens=TOKENS)
    densify(images_from_folder(image_dir), vlm, out, settings, model_name="tiny-random", batch_size=8)
    return out.read_bytes()


def wait_for_stall(child: subprocess.Popen, log: Path) -> None:
    """Until the densify ``child`` (its stderr to ``log``) says it stalled (``PATCHWORD_DENSIFY_TEST_STALL``);
    fails the test if it ends first (it never got there) or after :data:`HANG_GUARD_S` (a hang), as
    ``stall_support.wait_for_marker`` does."""
    deadline = time.monotonic() + HANG_GUARD_S
    while "densify: stalled for test" not in log.read_text(errors="replace"):
        if child.poll() is not None:
            pytest.fail(
                f"densify ended (exit {child.returncode}) before its stall point: {log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"hang guard: densify did not reach its stall point in {HANG_GUARD_S:g} s")
        time.sleep(0.01)
