"""Image preprocessing of the official LAPS / SEPS pipeline, in Pillow + numpy + torch.

* train: random resized crop (scale (0.6, 1), ratio (3/4, 4/3), bicubic) -> horizontal flip -> tensor ->
  normalise;
* test: bicubic resize to (size, size) -> tensor -> normalise.

The official code normalises with ImageNet statistics even for the in21k ViT, which was trained with
mean = std = 0.5 (:data:`HALF`); both are available so the choice is explicit.

Randomness comes from an explicit ``torch.Generator`` or ``numpy.random.Generator`` when one is given
(reproducible, independent of global state); without one torch's global RNG is used, which DataLoader
seeds differently in every worker. The crop sampler draws in the same order as torchvision's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "HALF",
    "RandomSource",
    "sample_resized_crop",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "Resize",
    "ToNormalizedTensor",
    "Compose",
    "train_transform",
    "test_transform",
    "normalize_uint8_batch",
    "require_pil_image",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)  # mean and std of the in21k ViTs: maps [0, 1] to [-1, 1]

RandomSource = torch.Generator | np.random.Generator | None

_BICUBIC = Image.Resampling.BICUBIC


def require_pil_image(image: object) -> Image.Image:
    """``image`` when it is a PIL image, which every transform here reads.

    Raises:
        TypeError: anything else, saying what it got (a path: open the file first), instead of an
            AttributeError from deep inside the first step.
    """
    if isinstance(image, Image.Image):
        return image
    import os

    if isinstance(image, (str, bytes, os.PathLike)):
        raise TypeError(
            f"expects a PIL image, got the path {image!r}: open the file with PIL.Image.open(path) first"
        )
    raise TypeError(
        f"expects a PIL image, got a {type(image).__module__}.{type(image).__qualname__}: open image files "
        "with PIL.Image.open(path)"
    )


# --------------------------------------------------------------------------------------------------------
# Random draws from either generator type
# --------------------------------------------------------------------------------------------------------


def _uniform(low: float, high: float, generator: RandomSource) -> float:
    """One float drawn uniformly from [low, high)."""
    if isinstance(generator, np.random.Generator):
        return float(generator.uniform(low, high))
    return float(torch.empty(1).uniform_(low, high, generator=generator).item())


def _randint(low: int, high: int, generator: RandomSource) -> int:
    """One int drawn uniformly from [low, high)."""
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(low, high))
    return int(torch.randint(low, high, (1,), generator=generator).item())


# --------------------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------------------


def _check_range(values: Sequence[float], name: str, upper: float | None = None) -> tuple[float, float]:
    low, high = (float(v) for v in values)
    if not 0 < low <= high or (upper is not None and high > upper):
        bound = "" if upper is None else f" <= {upper}"
        raise ValueError(f"{name} must satisfy 0 < low <= high{bound}, got {tuple(values)}")
    return low, high


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"size must be a positive int (square output side), got {size!r}")
    return size


def _check_stats(mean: Sequence[float], std: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std need 3 (RGB) values, got {len(mean)} and {len(std)}")
    if min(std) <= 0:
        raise ValueError(f"std must be positive, got {std}")
    return mean, std


def sample_resized_crop(
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: RandomSource = None,
    attempts: int = 10,
) -> tuple[int, int, int, int]:
    """Sample the crop box of a random resized crop (torchvision's algorithm).

    Each attempt draws an area fraction uniformly from ``scale`` and an aspect ratio log-uniformly from
    ``ratio``; the first box that fits inside the image is placed uniformly at random. If none of the
    ``attempts`` fits (very elongated images), the largest central crop whose aspect ratio is clamped to
    ``ratio`` is returned instead.

    Args:
        width, height: image size in pixels.
        scale: range of the crop area as a fraction of the image area.
        ratio: range of the crop aspect ratio (width / height).
        generator: source of randomness (see the module docstring).
        attempts: tries before the central fallback.

    Returns:
        ``(top, left, crop_height, crop_width)`` in pixels.
    """
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(attempts):
        target_area = area * _uniform(scale[0], scale[1], generator)
        aspect = math.exp(_uniform(log_low, log_high, generator))
        crop_w = round(math.sqrt(target_area * aspect))
        crop_h = round(math.sqrt(target_area / aspect))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            top = _randint(0, height - crop_h + 1, generator)
            left = _randint(0, width - crop_w + 1, generator)
            return top, left, crop_h, crop_w
    # Fallback: the whole image, trimmed along its long side until the aspect ratio is within range.
    crop_w, crop_h = width, height
    if width / height < ratio[0]:
        crop_h = round(width / ratio[0])
    elif width / height > ratio[1]:
        crop_w = round(height * ratio[1])
    return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w


class RandomResizedCrop:
    """Crop a random box (see :func:`sample_resized_crop`) and resize it to (size, size), bicubic."""

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        generator: RandomSource = None,
    ) -> None:
        self.size = _check_size(size)
        self.scale = _check_range(scale, "scale", upper=1.0)
        self.ratio = _check_range(ratio, "ratio")
        self.generator = generator

    def __call__(self, image: Image.Image) -> Image.Image:
        image = require_pil_image(image)
        top, left, h, w = sample_resized_crop(
            image.width, image.height, self.scale, self.ratio, self.generator
        )
        # Crop first, then resize (as torchvision): resize(box=...) would let the bicubic kernel read
        # pixels outside the box and give slightly different borders.
        box = image.crop((left, top, left + w, top + h))
        return box.resize((self.size, self.size), _BICUBIC)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomHorizontalFlip:
    """Mirror the image left-right with probability ``p``."""

    def __init__(self, p: float = 0.5, generator: RandomSource = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"flip probability must be in [0, 1], got {p}")
        self.p = p
        self.generator = generator

    def __call__(self, image: Image.Image) -> Image.Image:
        image = require_pil_image(image)
        if _uniform(0.0, 1.0, self.generator) < self.p:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Resize:
    """Resize to (size, size), ignoring the aspect ratio, bicubic (the official test transform)."""

    def __init__(self, size: int) -> None:
        self.size = _check_size(size)

    def __call__(self, image: Image.Image) -> Image.Image:
        return require_pil_image(image).resize((self.size, self.size), _BICUBIC)

    def __repr__(self) -> str:
        return f"Resize(size={self.size})"


class ToNormalizedTensor:
    """PIL image -> (3, H, W) float32 tensor, scaled to [0, 1] and normalised per channel."""

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        self.mean, self.std = _check_stats(mean, std)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        from patchword.data.images import rgb_image  # 16-bit greyscale by its high byte, not clipped

        # np.array copies into a writable array (np.asarray of a PIL image is read-only).
        pixels = np.array(rgb_image(image), dtype=np.uint8)
        return normalize_uint8_batch(pixels[None], self.mean, self.std)[0]

    def __repr__(self) -> str:
        return f"ToNormalizedTensor(mean={self.mean}, std={self.std})"


class Compose:
    """Apply steps in order."""

    def __init__(self, steps: Sequence[Callable]) -> None:
        self.steps = list(steps)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        for step in self.steps:
            image = step(image)
        return image

    def __repr__(self) -> str:
        inner = ", ".join(repr(step) for step in self.steps)
        return f"Compose([{inner}])"


# --------------------------------------------------------------------------------------------------------
# Pipelines
# --------------------------------------------------------------------------------------------------------


def train_transform(
    size: int,
    scale: tuple[float, float] = (0.6, 1.0),
    hflip: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    *,
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: RandomSource = None,
) -> Compose:
    """The official training transform: PIL image -> (3, size, size) float32 tensor.

    Args:
        size: output side in pixels (``img_res``: 224 or 384).
        scale: crop area range as a fraction of the image (official: (0.6, 1.0)).
        hflip: add a random horizontal flip with probability 0.5.
        mean, std: per-channel normalisation (:data:`IMAGENET_MEAN`/:data:`IMAGENET_STD` or :data:`HALF`).
        ratio: crop aspect-ratio range.
        generator: shared by the crop and the flip; ``None`` uses torch's global RNG.
    """
    steps: list[Callable] = [RandomResizedCrop(size, scale, ratio, generator)]
    if hflip:
        steps.append(RandomHorizontalFlip(0.5, generator))
    steps.append(ToNormalizedTensor(mean, std))
    return Compose(steps)


def test_transform(
    size: int, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> Compose:
    """The official evaluation transform: PIL image -> (3, size, size) float32 tensor."""
    return Compose([Resize(size), ToNormalizedTensor(mean, std)])


# The official name starts with "test_"; keep pytest from collecting it in modules that import it.
test_transform.__test__ = False


def normalize_uint8_batch(
    images: np.ndarray | torch.Tensor,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> torch.Tensor:
    """Scale a batch of uint8 RGB images to [0, 1] and normalise per channel.

    Uses the same operations as torchvision's ``ToTensor`` + ``Normalize`` (divide by 255, subtract the
    mean, divide by the std, in float32), so the values agree bit for bit.

    Args:
        images: (N, H, W, 3) uint8 numpy array or tensor, e.g. the in-memory synthetic scenes.
        mean, std: 3 per-channel values.

    Returns:
        (N, 3, H, W) contiguous float32 tensor (a new tensor; the input is not modified).
    """
    mean, std = _check_stats(mean, std)
    if not isinstance(images, np.ndarray | torch.Tensor):
        raise ValueError(f"images must be a numpy array or a torch.Tensor, got {type(images).__name__}")
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must have shape (N, H, W, 3), got {tuple(images.shape)}")
    if images.dtype not in (np.uint8, torch.uint8):
        raise ValueError(f"images must be uint8, got dtype {images.dtype}")
    if isinstance(images, np.ndarray):
        # One copy that converts and transposes at once; it also avoids torch's warning on read-only arrays.
        x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32))
    else:
        x = images.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return x.div_(255).sub_(mean_t).div_(std_t)
