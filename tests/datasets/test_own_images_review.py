"""A user's own dataset, third review: pixels, keys and files read otherwise than the user meant.

* a 16-bit greyscale PNG became solid white (Pillow's ``convert("RGB")`` clips);
* ``data.*`` keys the chosen dataset never reads were accepted and recorded (``data.num_train`` on LAPS);
* a key repeated in ``id_mapping.json`` or a Karpathy json silently kept its last value;
* EXIF orientation: phone photos reached the model sideways; ``index build`` must read what a browser shows;
* the image-size and vocabulary errors named ``model.hf_vision`` / ``model.hf_text`` for the tiny encoders;
* float64 region features beyond float32's range passed the finiteness check and became inf in the model;
* an image over Pillow's pixel limit printed a raw ``DecompressionBombWarning`` naming no file.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import write_laps_dataset
from patchword.data import config as data_config
from patchword.data.config import DataConfig
from patchword.data.images import image_problem, load_image
from patchword.data.karpathy import load_karpathy_json
from patchword.data.laps import load_id_mapping
from patchword.data.pipeline import FileImages
from patchword.data.precomp import load_precomp_split
from patchword.data.prepare import load_raw_data
from patchword.errors import ConfigError, DataError
from patchword.runs.checks import check_model_data
from patchword.runs.config import RunConfig, load_run_config

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


# ---------------------------------------------------------------------------------- 1. 16-bit images


def test_a_16_bit_greyscale_png_keeps_its_grey_levels(tmp_path):
    """Old code: every value above 255 became 255 (a 16-bit photo read as a white square)."""
    values = np.array([[0, 255, 256, 4000], [32768, 40000, 65280, 65535]], dtype=np.uint16)
    path = tmp_path / "grey16.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    pixels = np.asarray(load_image(path))
    assert pixels.shape == (2, 4, 3) and pixels.dtype == np.uint8
    expected = (values >> 8).astype(np.uint8)  # 0 0 1 15 / 128 156 255 255
    for channel in range(3):
        np.testing.assert_array_equal(pixels[..., channel], expected)


def test_a_16_bit_pgm_opened_as_mode_i_is_scaled_the_same(tmp_path):
    values = np.array([[0, 1000], [30000, 65535]], dtype=np.uint16)
    path = tmp_path / "grey16.pgm"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I"
    np.testing.assert_array_equal(np.asarray(load_image(path))[..., 0], [[0, 3], [117, 255]])


def test_a_floating_point_image_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "float.tif"
    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)).save(path)
    with pytest.raises(DataError, match="float.tif: a 32-bit floating-point image"):
        load_image(path)
    # data check (and train's check) lists it with the other unusable files, before training
    assert image_problem(path).startswith("a 32-bit floating-point image (Pillow mode F)")


def test_a_mode_i_image_outside_16_bits_is_refused(tmp_path):
    path = tmp_path / "wide.tif"
    Image.fromarray(np.array([[0, 70000]], dtype=np.int32)).save(path)
    with pytest.raises(DataError, match=r"wide.tif: .*values 0..70000, outside the 16-bit range"):
        load_image(path)


# ------------------------------------------------------------------------ 2. keys the dataset never reads


def test_every_data_key_is_classified_once():
    """A new data.* key must say which datasets read it (READ_BY) or that every dataset does."""
    fields = [f.name for f in dataclasses.fields(DataConfig)]
    read_by, every = data_config.READ_BY, data_config.EVERY_DATASET_KEYS
    assert not set(read_by) & set(every)
    assert sorted(fields) == sorted([*read_by, *every])


@pytest.mark.parametrize(
    ("dataset", "key", "value", "readers"),
    [
        ("laps", "num_train", 5, "synthetic or synthetic_regions"),
        ("karpathy", "synthetic_seed", 3, "synthetic or synthetic_regions"),
        ("laps", "mmap", False, "precomp"),
        ("karpathy", "dense_omit_prob", 0.5, "synthetic or synthetic_regions"),
        ("laps", "num_regions", 10, "synthetic_regions"),
        ("precomp", "image_size", 32, "laps or karpathy"),
        ("precomp", "check_images", False, "laps or karpathy"),
        ("precomp", "synthetic_image_size", 32, "synthetic or synthetic_regions"),
        ("precomp", "max_dense_len", 64, "synthetic or laps or karpathy"),
        ("synthetic", "image_size", 32, "laps or karpathy"),
        ("synthetic", "exif_orientation", True, "laps or karpathy"),
        ("synthetic_regions", "mmap", False, "precomp"),
    ],
)
def test_a_key_the_dataset_never_reads_is_refused_naming_its_readers(dataset, key, value, readers):
    """Old code: accepted, recorded in config.yaml, no effect (data.num_train=5 on LAPS loaded 12 images)."""
    dc = DataConfig(dataset=dataset, **{key: value})
    assert dc.unread_settings() == [key]
    with pytest.raises(ConfigError) as err:
        dc.refuse_unread_settings()
    assert err.value.key == f"data.{key}"
    assert f"is read by data.dataset={readers}, not {dataset}" in str(err.value)


def test_keys_at_their_default_or_read_by_the_dataset_pass():
    # a config that writes every key out (a run's config.yaml) sets none of them
    for dataset in ("synthetic", "laps", "karpathy", "precomp", "synthetic_regions"):
        assert DataConfig(dataset=dataset).unread_settings() == []
    assert (
        DataConfig(dataset="synthetic_regions", synthetic_image_size=32, num_regions=4).unread_settings()
        == []
    )
    assert DataConfig(dataset="laps", image_size=32, num_workers=0, cache_dir="/c").unread_settings() == []
    assert DataConfig(dataset="synthetic", max_dense_len=64, num_train=5).unread_settings() == []


def test_only_the_keys_named_are_checked():
    """An evaluation checks the keys its overrides set, not what an older run's config.yaml holds."""
    dc = DataConfig(dataset="laps", num_train=5, mmap=False)
    dc.refuse_unread_settings(["data.image_size", "data.root"])  # the saved num_train is not the user's now
    with pytest.raises(ConfigError, match="data.mmap: is read by data.dataset=precomp"):
        dc.refuse_unread_settings(["data.mmap"])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_the_shipped_configs_set_no_unread_key(config):
    assert load_run_config(str(config)).data.unread_settings() == []


def test_a_saved_config_with_an_unread_key_still_loads_its_data(tmp_path):
    """Runs saved by older versions may hold such a key: reading their data (eval, resume) still works."""
    paths = write_laps_dataset(tmp_path / "laps")
    dc = DataConfig(
        dataset="laps",
        root=str(paths["root"]),
        image_root=str(paths["image_root"]),
        dense=False,
        num_train=5,  # recorded by an older version, read by nothing
    )
    raw = load_raw_data(dc, ["test"])
    assert raw.splits["test"].num_images == 4


# ---------------------------------------------------------------------------------- 4. repeated keys


def test_an_id_mapping_giving_an_id_twice_is_refused(tmp_path):
    """Old code: ``{"a": "1.png", "a": "2.png"}`` silently mapped a to 2.png."""
    path = tmp_path / "id_mapping.json"
    path.write_text('{"a": "1.png", "b": "3.png", "a": "2.png"}')
    with pytest.raises(DataError, match=r"id_mapping.json: key 'a' appears twice in one JSON object"):
        load_id_mapping(path)


def test_a_karpathy_entry_giving_a_key_twice_is_refused(tmp_path):
    sentences = json.dumps([{"raw": "a dog"}])
    entry = f'{{"split": "test", "filename": "0.png", "sentences": {sentences}, "split": "train"}}'
    path = tmp_path / "dataset_k.json"
    path.write_text(f'{{"images": [{entry}]}}')
    with pytest.raises(DataError, match=r"dataset_k.json: key 'split' appears twice"):
        load_karpathy_json(path, "test", tmp_path)


# ------------------------------------------------------------------------------- 5. EXIF orientation


def _sideways_jpeg(path: Path) -> np.ndarray:
    """A 16x8 JPEG (wide as stored) whose EXIF orientation 6 says: turn it 90 degrees clockwise to show it.
    Its left half is black, its right half white. Returns the stored pixels."""
    pixels = np.zeros((8, 16, 3), np.uint8)
    pixels[:, 8:] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(path, exif=exif, quality=95)
    return pixels


def test_exif_orientation_is_applied_only_when_asked(tmp_path):
    path = tmp_path / "phone.jpg"
    _sideways_jpeg(path)
    stored = load_image(path)
    assert stored.size == (16, 8)  # benchmark datasets: as the official loaders read them
    upright = load_image(path, exif_orientation=True)
    assert upright.size == (8, 16)  # width 8, height 16
    top, bottom = np.asarray(upright)[:4].mean(), np.asarray(upright)[-4:].mean()
    assert top < 30 and bottom > 225  # turned clockwise: the stored left (black) half is on top


def test_data_exif_orientation_reaches_the_image_files(tmp_path):
    paths = write_laps_dataset(tmp_path / "laps")
    assert DataConfig().exif_orientation is False
    dc = DataConfig(
        dataset="laps",
        root=str(paths["root"]),
        image_root=str(paths["image_root"]),
        dense=False,
        image_size=8,
        exif_orientation=True,
    )
    images = load_raw_data(dc, ["test"]).images["test"]
    assert images.exif_orientation is True
    path = tmp_path / "phone.jpg"
    _sideways_jpeg(path)
    batch = FileImages([str(path)], 8, exif_orientation=True).batch(torch.tensor([0]), train=False)
    stored = FileImages([str(path)], 8).batch(torch.tensor([0]), train=False)
    # normalised pixels: upright, the top rows are dark and the bottom rows bright; stored, left and right
    assert batch[0, :, :2].mean() < batch[0, :, -2:].mean()
    assert abs(float(stored[0, :, :2].mean() - stored[0, :, -2:].mean())) < 0.1


def test_index_build_reads_images_upright(tmp_path):
    from patchword.search.encode import ShardEncoder
    from patchword.search.scan import ImageFile

    _sideways_jpeg(tmp_path / "phone.jpg")
    run = SimpleNamespace(image_transform=lambda: lambda image: torch.tensor(image.size))
    with ThreadPoolExecutor(1) as pool:
        encoder = ShardEncoder(run, tmp_path, 1, pool, None)
        assert encoder._load(ImageFile("phone.jpg", 1, 1, "JPEG")).tolist() == [8, 16]


def _served(tmp_path: Path, name: str, fmt: str) -> tuple[bytes, str]:
    from patchword.serve.images import image_bytes

    path = tmp_path / name
    stat = path.stat()
    entry = SimpleNamespace(path=name, format=fmt, size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    searcher = SimpleNamespace(index=SimpleNamespace(entries=[entry], images_root=tmp_path))
    data, media_type, _ = image_bytes(searcher, 0)
    return data, media_type


def test_serve_sends_what_index_build_read(tmp_path):
    """A JPEG goes as stored (browsers apply its tag); a tagged PNG and a converted TIFF go upright."""
    pixels = _sideways_jpeg(tmp_path / "phone.jpg")
    data, media_type = _served(tmp_path, "phone.jpg", "JPEG")
    assert media_type == "image/jpeg" and data == (tmp_path / "phone.jpg").read_bytes()
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(pixels).save(tmp_path / "phone.png", exif=exif)
    Image.fromarray(pixels).save(tmp_path / "phone.tif", exif=exif)
    Image.fromarray(pixels).save(tmp_path / "plain.png")
    for name, fmt in (("phone.png", "PNG"), ("phone.tif", "TIFF")):
        data, media_type = _served(tmp_path, name, fmt)
        assert media_type == "image/png"
        assert Image.open(io.BytesIO(data)).size == (8, 16), name
    data, media_type = _served(tmp_path, "plain.png", "PNG")
    assert data == (tmp_path / "plain.png").read_bytes()


# ------------------------------------------------------------------------ 6. the encoder in the errors


def _model(image_size=None, vocab_size=None):
    return SimpleNamespace(
        image_encoder=SimpleNamespace(image_size=image_size),
        text_encoder=SimpleNamespace(max_len=None, vocab_size=vocab_size),
    )


def _data(vocab_size=None):
    return SimpleNamespace(splits={}, vocab_size=vocab_size, tokenizer=None)


def test_the_image_size_error_names_the_tiny_vit_not_a_hub_backbone():
    """Old code: ``data.image_size: is 64 but the image encoder (google/vit-base-patch16-224) takes 32``."""
    cfg = RunConfig()
    cfg.data = DataConfig(dataset="laps", image_size=64)
    with pytest.raises(ConfigError) as err:
        check_model_data(cfg, _model(image_size=32), _data())
    assert str(err.value) == "data.image_size: is 64 but model.tiny_vit.image_size is 32"
    cfg.model.image_encoder, cfg.model.hf_vision = "hf", "/models/vit"
    with pytest.raises(ConfigError, match=r"the image encoder \(model.hf_vision=/models/vit\) takes 32 pix"):
        check_model_data(cfg, _model(image_size=32), _data())


def test_the_vocabulary_error_names_the_text_encoder_in_use():
    cfg = RunConfig()
    with pytest.raises(ConfigError) as err:
        check_model_data(cfg, _model(vocab_size=10), _data(vocab_size=20))
    assert str(err.value) == (
        "data.vocab_path: the tokenizer has 20 ids but the text encoder (model.text_encoder=tiny) embeds 10"
    )
    assert cfg.model.hf_text not in str(err.value)


# ---------------------------------------------------------------------- 7. float64 region features


def test_float64_features_beyond_float32_are_refused_at_load_naming_the_row(tmp_path):
    """Old code: 1e300 is finite in float64, so the check passed and the batches held inf."""
    features = np.zeros((3, 2, 4))
    features[1, 0, 2] = 1e300
    np.save(tmp_path / "test_ims.npy", features)
    (tmp_path / "test_caps.txt").write_text("".join(f"caption {i}\n" for i in range(3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of the cast either
        with pytest.raises(DataError, match=r"test_ims.npy: row 1 \(image index\) holds NaN or infinite"):
            load_precomp_split(tmp_path, "test", captions_per_image=1)
    features[1, 0, 2] = 3e38  # within float32's range: read as before
    np.save(tmp_path / "test_ims.npy", features)
    assert load_precomp_split(tmp_path, "test", captions_per_image=1).num_images == 3


# ----------------------------------------------------------------------------- 8. large images


def test_an_image_over_pillows_limit_is_logged_by_name_and_decoded(tmp_path, monkeypatch, caplog):
    """Old code: Pillow's DecompressionBombWarning naming no file (an error where warnings are errors)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # 20x20 = 400 pixels: over it, under twice it
    path = tmp_path / "large.png"
    Image.fromarray(np.full((20, 20, 3), 7, np.uint8)).save(path)
    filters = list(warnings.filters)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING, logger="patchword.data.images"):
            assert np.asarray(load_image(path)).max() == 7
            assert image_problem(path) is None
            load_image(path)  # once per file
            # a training crop of the image warns again in Pillow: quiet too
            images = FileImages([str(path)], 8)
            assert images.batch(torch.tensor([0]), train=True, seeds=[1]).shape == (1, 3, 8, 8)
            assert images.batch(torch.tensor([0]), train=True).shape == (1, 3, 8, 8)
    lines = [r.getMessage() for r in caplog.records if "large.png" in r.getMessage()]
    assert len(lines) == 1 and "400 pixels (20x20), over Pillow's decompression-bomb limit of 300" in lines[0]
    assert warnings.filters == filters  # the filter that kept Pillow quiet is gone again
    with pytest.warns(Image.DecompressionBombWarning):  # outside our decoding, Pillow warns as ever
        Image.open(path).close()
