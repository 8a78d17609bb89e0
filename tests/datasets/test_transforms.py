"""Image transforms: shapes, normalisation, flip, crop sampling, determinism and PIL-exact resizing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from patchword.data import transforms as T

ZERO, ONE = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # identity normalisation: output = pixels / 255


def _random_image(width: int, height: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _to_uint8(x: torch.Tensor) -> np.ndarray:
    """(3, H, W) tensor in [0, 1] -> (H, W, 3) uint8, inverting the /255 exactly."""
    return torch.round(x * 255).to(torch.uint8).permute(1, 2, 0).numpy()


@pytest.mark.parametrize("make", [T.train_transform, T.test_transform])
def test_output_shape_and_dtype(make) -> None:
    out = make(32)(_random_image(50, 40))
    assert out.shape == (3, 32, 32)
    assert out.dtype == torch.float32
    assert out.is_contiguous()


def test_grayscale_input_becomes_three_channels() -> None:
    out = T.test_transform(8)(Image.new("L", (10, 10), 7))
    assert out.shape == (3, 8, 8)
    for c in range(3):  # each channel is the gray value, normalised with that channel's statistics
        expected = (7 / 255 - T.IMAGENET_MEAN[c]) / T.IMAGENET_STD[c]
        torch.testing.assert_close(out[c], torch.full((8, 8), expected), atol=1e-6, rtol=0)


def test_normalisation_of_a_constant_image() -> None:
    rgb = (255, 0, 128)
    out = T.test_transform(16)(Image.new("RGB", (23, 17), rgb))
    for c in range(3):
        expected = (rgb[c] / 255 - T.IMAGENET_MEAN[c]) / T.IMAGENET_STD[c]
        torch.testing.assert_close(out[c], torch.full((16, 16), expected), atol=1e-6, rtol=0)
    half = T.test_transform(16, T.HALF, T.HALF)(Image.new("RGB", (9, 9), (0, 255, 0)))
    assert torch.equal(half[:, 0, 0], torch.tensor([-1.0, 1.0, -1.0]))


def test_normalize_uint8_batch_numpy_and_tensor_agree() -> None:
    images = np.random.default_rng(1).integers(0, 256, (2, 5, 7, 3), dtype=np.uint8)
    images.flags.writeable = False  # like np.asarray(PIL image); must not warn or fail
    out = T.normalize_uint8_batch(images)
    assert out.shape == (2, 3, 5, 7) and out.dtype == torch.float32 and out.is_contiguous()
    assert torch.equal(out, T.normalize_uint8_batch(torch.from_numpy(images.copy())))
    mean = torch.tensor(T.IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(T.IMAGENET_STD).view(1, 3, 1, 1)
    expected = (torch.from_numpy(images.copy()).permute(0, 3, 1, 2).float() / 255 - mean) / std
    torch.testing.assert_close(out, expected)
    assert torch.equal(
        T.normalize_uint8_batch(np.full((1, 2, 2, 3), 255, np.uint8), ZERO, ONE), torch.ones(1, 3, 2, 2)
    )


@pytest.mark.parametrize(
    ("images", "match"),
    [
        (np.zeros((2, 4, 4, 3), np.float32), "uint8"),
        (np.zeros((4, 4, 3), np.uint8), "shape"),
        (torch.zeros(1, 3, 4, 4, dtype=torch.uint8), "shape"),
        ([[[[0, 0, 0]]]], "numpy array or a torch.Tensor"),
    ],
)
def test_normalize_uint8_batch_rejects_bad_input(images, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        T.normalize_uint8_batch(images)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="scale"):
        T.train_transform(8, scale=(0.9, 0.5))
    with pytest.raises(ValueError, match="scale"):
        T.train_transform(8, scale=(0.5, 1.5))
    with pytest.raises(ValueError, match="size"):
        T.test_transform(0)
    with pytest.raises(ValueError, match="std"):
        T.test_transform(8, std=(0.2, 0.0, 0.2))


def test_flip_mirrors_left_right_about_half_the_time() -> None:
    # A full-image crop (scale 1, ratio 1 on a square image) resized to its own size is the identity,
    # so the only change left is the flip.
    image = _random_image(12, 12)
    pixels = np.asarray(image)
    make = lambda hflip: T.train_transform(
        12,
        scale=(1.0, 1.0),
        ratio=(1.0, 1.0),
        hflip=hflip,
        mean=ZERO,
        std=ONE,
        generator=torch.Generator().manual_seed(0),
    )
    transform = make(True)
    flips = 0
    for _ in range(200):
        out = _to_uint8(transform(image))
        if np.array_equal(out, pixels[:, ::-1]):
            flips += 1
        else:
            assert np.array_equal(out, pixels)
    assert 70 < flips < 130
    transform = make(False)
    assert all(np.array_equal(_to_uint8(transform(image)), pixels) for _ in range(20))


@pytest.mark.parametrize("generator", [torch.Generator().manual_seed(0), np.random.default_rng(0)])
def test_crop_boxes_respect_scale_ratio_and_bounds(generator) -> None:
    width, height, scale, ratio = 200, 150, (0.6, 1.0), (3 / 4, 4 / 3)
    areas = []
    for _ in range(2000):
        top, left, h, w = T.sample_resized_crop(width, height, scale, ratio, generator)
        assert top >= 0 and left >= 0
        assert top + h <= height and left + w <= width
        # Rounding each side to whole pixels moves the area and ratio by at most about half a pixel per side.
        area = h * w / (width * height)
        assert scale[0] - 0.01 <= area <= scale[1]
        assert ratio[0] * (1 - 0.01) <= w / h <= ratio[1] * (1 + 0.01)
        areas.append(area)
    assert min(areas) < 0.62 and max(areas) > 0.97  # the whole range is used


def test_crop_falls_back_to_a_central_crop() -> None:
    # No box of >= 90% of a 1000 x 10 strip has an aspect ratio <= 4/3, so all 10 attempts fail.
    assert T.sample_resized_crop(1000, 10, (0.9, 1.0), generator=torch.Generator().manual_seed(0)) == (
        0,
        (1000 - 13) // 2,
        10,
        13,
    )
    assert T.sample_resized_crop(10, 1000, (0.9, 1.0)) == ((1000 - 13) // 2, 0, 13, 10)


def test_random_resized_crop_is_pil_crop_then_bicubic_resize() -> None:
    image = _random_image(41, 33)
    crop = T.RandomResizedCrop(16, (0.6, 1.0), generator=torch.Generator().manual_seed(5))
    top, left, h, w = T.sample_resized_crop(41, 33, (0.6, 1.0), generator=torch.Generator().manual_seed(5))
    expected = image.crop((left, top, left + w, top + h)).resize((16, 16), Image.Resampling.BICUBIC)
    assert np.array_equal(np.asarray(crop(image)), np.asarray(expected))


@pytest.mark.parametrize("seed_type", ["torch", "numpy"])
def test_seeded_generator_is_reproducible(seed_type: str) -> None:
    image = _random_image(64, 48)

    def run(seed: int) -> list[torch.Tensor]:
        rng = torch.Generator().manual_seed(seed) if seed_type == "torch" else np.random.default_rng(seed)
        transform = T.train_transform(24, generator=rng)
        return [transform(image) for _ in range(5)]

    first, again, other = run(0), run(0), run(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    assert not torch.equal(first[0], first[1])  # draws advance between calls


def test_global_rng_path_follows_torch_manual_seed() -> None:
    # Without a generator the transform uses torch's RNG, which DataLoader seeds per worker.
    image, transform = _random_image(64, 48), T.train_transform(24)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        first = transform(image)
        torch.manual_seed(3)
        assert torch.equal(first, transform(image))


def test_bicubic_resize_matches_pil() -> None:
    image = _random_image(37, 29, seed=2)
    out = T.test_transform(24, ZERO, ONE)(image)
    expected = np.asarray(image.resize((24, 24), Image.Resampling.BICUBIC))
    assert np.array_equal(_to_uint8(out), expected)
    assert math.isclose(float(out.max()), expected.max() / 255, rel_tol=1e-6)
