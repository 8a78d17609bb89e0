"""16-bit greyscale handed to the public preprocessing (``ToNormalizedTensor``,
``LoadedRun.preprocess_images``) is read by its high byte, as ``load_image`` reads a 16-bit file, not
clipped to white by ``convert("RGB")``; a folder densify describes is turned upright by its EXIF tag, as
``index build`` indexes it."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from patchword.data.transforms import ToNormalizedTensor
from patchword.densify.sources import images_from_folder


def _grey16() -> Image.Image:
    values = np.linspace(0, 65535, 64, dtype=np.uint16).reshape(8, 8)
    image = Image.fromarray(values)
    assert image.mode.startswith("I;16")
    return image


def test_to_normalized_tensor_reads_16_bit_grey_by_its_high_byte():
    image = _grey16()
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    got = ToNormalizedTensor(mean, std)(image)
    expected = torch.from_numpy((np.asarray(image, dtype=np.uint16) >> 8).astype(np.float32) / 255.0)
    assert got.shape == (3, 8, 8)
    for channel in got:
        torch.testing.assert_close(channel, expected, rtol=0, atol=1e-6)


def test_a_folder_densify_describes_is_turned_upright_by_its_exif_tag(tmp_path):
    image = Image.fromarray(np.zeros((10, 30, 3), np.uint8))  # 30 wide, 10 high as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: shown 10 wide, 30 high
    image.save(tmp_path / "phone.jpg", exif=exif)
    assert images_from_folder(tmp_path).load(0).size == (10, 30)
