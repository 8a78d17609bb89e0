"""Region-feature data (SCAN layout reader, synthetic generator) and the region-family encoders
(precomp projection, BiGRU with optional GloVe)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from patchword.config import apply_overrides
from patchword.data.precomp import RegionFeatures, load_precomp_split, write_precomp_split
from patchword.data.prepare import prepare_data
from patchword.data.synthetic import SyntheticConfig, generate_split
from patchword.data.synthetic.regions import RegionFeatureConfig, synthetic_region_features
from patchword.data.tokenizers import WordVocab
from patchword.encoders import (
    BiGRUTextEncoder,
    GRUTextConfig,
    PrecompConfig,
    PrecompRegionEncoder,
    load_glove,
)
from patchword.errors import ConfigError
from patchword.model import build_model
from patchword.runs.config import RunConfig
from patchword.train.validate import check_config, check_model_data

# ------------------------------------------------------------------ SCAN layout


def _caps(n_img, per=5):
    return [f"caption {j} of image {i}" for i in range(n_img) for j in range(per)]


def test_scan_layout_round_trip_is_memory_mapped(tmp_path):
    feats = np.random.default_rng(0).random((4, 6, 8), dtype=np.float32)
    write_precomp_split(tmp_path, "test", feats, _caps(4), image_ids=["a", "b", "c", "d"])
    split = load_precomp_split(tmp_path, "test")
    assert isinstance(split.images, np.memmap) and not split.images.flags.writeable
    np.testing.assert_array_equal(split.images, feats)
    assert split.captions[7] == "caption 2 of image 1"
    np.testing.assert_array_equal(split.txt2img, np.arange(20) // 5)  # im_div = 5
    assert split.image_ids == ["a", "b", "c", "d"]
    loaded = load_precomp_split(tmp_path, "test", mmap=False)
    assert not isinstance(loaded.images, np.memmap)
    # one caption per feature row (im_div = 1) and ids listed once per caption
    write_precomp_split(tmp_path, "dev", feats, _caps(4, per=1))
    (tmp_path / "dev_ids.txt").write_text("".join(f"{i}\n" for i in range(4)))
    assert load_precomp_split(tmp_path, "dev", captions_per_image=1).txt2img.tolist() == [0, 1, 2, 3]
    (tmp_path / "test_ids.txt").write_text("".join(f"id{i // 5}\n" for i in range(20)))
    assert load_precomp_split(tmp_path, "test").image_ids == ["id0", "id1", "id2", "id3"]


def test_scan_layout_errors_name_the_problem(tmp_path):
    feats = np.zeros((4, 6, 8), np.float32)
    with pytest.raises(FileNotFoundError, match="test_ims.npy"):
        load_precomp_split(tmp_path, "test")
    write_precomp_split(tmp_path, "test", feats, _caps(4))
    (tmp_path / "test_caps.txt").write_text("".join(c + "\n" for c in _caps(4)[:-1]))
    with pytest.raises(ValueError, match="19 captions for 4 images"):
        load_precomp_split(tmp_path, "test")
    (tmp_path / "test_caps.txt").write_text("a\n\nb\nc\n")
    with pytest.raises(ValueError, match="test_caps.txt:2: empty caption"):
        load_precomp_split(tmp_path, "test")
    np.save(tmp_path / "flat_ims.npy", np.zeros((4, 8), np.float32))
    (tmp_path / "flat_caps.txt").write_text("x\n" * 4)
    with pytest.raises(ValueError, match=r"\(N_img, R, D\)"):
        load_precomp_split(tmp_path, "flat")
    np.save(tmp_path / "int_ims.npy", np.zeros((4, 2, 8), np.int32))
    (tmp_path / "int_caps.txt").write_text("x\n" * 4)
    with pytest.raises(ValueError, match="float features"):
        load_precomp_split(tmp_path, "int")
    write_precomp_split(tmp_path, "ids", feats, _caps(4))
    (tmp_path / "ids_ids.txt").write_text("1\n2\n")
    with pytest.raises(ValueError, match="2 ids for 4 images"):
        load_precomp_split(tmp_path, "ids")


@pytest.mark.parametrize("mmap", [True, False])
def test_a_text_or_truncated_features_file_is_named_with_its_problem(tmp_path, mmap):
    """A text file named .npy was reported as "pickled data", a truncated one as "mmap length is greater
    than file size"."""
    from patchword.errors import DataError

    write_precomp_split(tmp_path, "test", np.ones((4, 6, 8), np.float32), _caps(4))
    ims = tmp_path / "test_ims.npy"
    good = ims.read_bytes()
    ims.write_text("0.25 0.5 0.75\n0.1 0.2 0.3\n")
    with pytest.raises(DataError) as err:
        load_precomp_split(tmp_path, "test", mmap=mmap)
    assert str(err.value).startswith(f"{ims}: not a .npy array file: it holds text ('0.25 0.5 0.75'...)")
    assert "pickle" not in str(err.value)
    ims.write_bytes(good[:-40])
    with pytest.raises(DataError) as err:
        load_precomp_split(tmp_path, "test", mmap=mmap)
    needed = len(good)
    assert str(err.value).startswith(
        f"{ims}: truncated: {needed - 40} bytes, its header ((4, 6, 8) float32) needs {needed}"
    )
    ims.write_bytes(good)
    assert load_precomp_split(tmp_path, "test", mmap=mmap).images.shape == (4, 6, 8)


def test_region_features_batches():
    feats = np.arange(4 * 3 * 2, dtype=np.float64).reshape(4, 3, 2)
    source = RegionFeatures(feats)
    assert len(source) == 4 and source.num_regions == 3 and source.dim == 2
    batch = source.batch(torch.tensor([3, 0, 3]), train=True)
    assert batch.dtype == torch.float32 and batch.shape == (3, 3, 2)
    # Each row is the requested image's features, in the order asked (a repeated index repeats the image).
    expected = torch.tensor(feats[[3, 0, 3]], dtype=torch.float32)
    assert torch.equal(batch, expected)
    assert torch.equal(batch[1], torch.tensor(feats[0], dtype=torch.float32))
    boxes = np.arange(4 * 3 * 4, dtype=np.float32).reshape(4, 3, 4) / 100
    with_boxes = RegionFeatures(feats, boxes).batch(torch.tensor([2, 1]), train=False)
    assert with_boxes.shape == (2, 3, 6)
    assert torch.equal(with_boxes[..., :2], torch.tensor(feats[[2, 1]], dtype=torch.float32))
    assert torch.equal(with_boxes[..., 2:], torch.from_numpy(boxes[[2, 1]]))
    with pytest.raises(ValueError, match=r"\(N_img, R, D\)"):
        RegionFeatures(np.zeros((4, 3)))


# ------------------------------------------------------------------ synthetic region features


@pytest.fixture(scope="module")
def scenes():
    return generate_split(SyntheticConfig(num_train=1, num_dev=1, num_test=60, image_size=16), "test")


def test_synthetic_features_are_deterministic_and_detector_like(scenes):
    cfg = RegionFeatureConfig(num_regions=20, dim=64, seed=3)
    a = synthetic_region_features(scenes.scenes, "test", cfg, num_shapes=5, num_colours=8)
    b = synthetic_region_features(scenes.scenes, "test", cfg, num_shapes=5, num_colours=8)
    assert a.shape == (60, 20, 64) and a.dtype == np.float32 and (a >= 0).all()
    np.testing.assert_array_equal(a, b)  # seeded
    head = synthetic_region_features(
        scenes.scenes.take(np.arange(10)), "test", cfg, num_shapes=5, num_colours=8
    )
    np.testing.assert_array_equal(head, a[:10])  # an image's features do not depend on the images after it
    other = synthetic_region_features(scenes.scenes, "dev", cfg, num_shapes=5, num_colours=8)
    reseeded = synthetic_region_features(
        scenes.scenes,
        "test",
        RegionFeatureConfig(num_regions=20, dim=64, seed=4),
        num_shapes=5,
        num_colours=8,
    )
    assert not np.allclose(a, other) and not np.allclose(a, reseeded)


def test_synthetic_features_carry_the_objects(scenes):
    # a nearest-prototype probe finds each image's colours among its regions more often than absent ones
    cfg = RegionFeatureConfig(num_regions=20, dim=128, noise=0.2, seed=0)
    feats = synthetic_region_features(scenes.scenes, "test", cfg, num_shapes=5, num_colours=8)
    from patchword.data.synthetic.regions import _attribute_tables

    colours = _attribute_tables(cfg, 5, 8, 2, 9)["colour"]  # (8, D)
    response = (feats @ colours.T).max(axis=1)  # (N, 8): best region per colour
    wins = total = 0
    for i in range(len(scenes.scenes)):
        present = {c for _, _, c, _ in scenes.scenes.objects(i)}
        absent = set(range(8)) - present
        for c in present:
            wins += sum(response[i, c] > response[i, a] for a in absent)
            total += len(absent)
    assert wins / total > 0.9


def test_synthetic_features_reject_too_few_regions(scenes):
    with pytest.raises(ValueError, match="cannot hold"):
        synthetic_region_features(
            scenes.scenes, "test", RegionFeatureConfig(num_regions=5), num_shapes=5, num_colours=8
        )


# ------------------------------------------------------------------ encoders


def test_precomp_encoder_official_init_and_shapes():
    enc = PrecompRegionEncoder(PrecompConfig(region_dim=20, num_regions=4, embed_dim=12))
    bound = math.sqrt(6 / (20 + 12))
    assert enc.proj.weight.abs().max() <= bound and enc.proj.bias.abs().sum() == 0
    assert enc(torch.rand(3, 4, 20)).shape == (3, 4, 12) and not enc.has_cls and enc.num_patches == 4
    mlp = PrecompRegionEncoder(PrecompConfig(region_dim=20, num_regions=4, embed_dim=12, mlp=True))
    assert mlp.mlp is not None and mlp(torch.rand(2, 4, 20)).shape == (2, 4, 12)
    with pytest.raises(ValueError, match="model.precomp"):
        enc(torch.rand(3, 4, 16))


def test_bigru_equals_each_caption_run_alone():
    torch.manual_seed(0)
    enc = BiGRUTextEncoder(GRUTextConfig(vocab_size=30, word_dim=6, embed_dim=5))
    ids = torch.randint(4, 30, (3, 7))
    lens = torch.tensor([4, 7, 2])
    for row, n in enumerate(lens.tolist()):
        ids[row, n:] = 0
    out = enc(ids, lens)
    assert out.shape == (3, 7, 5)
    for row, n in enumerate(lens.tolist()):
        alone, _ = enc.rnn(enc.embed(ids[row : row + 1, :n]))
        want = (alone[..., :5] + alone[..., 5:]) / 2  # both directions averaged, as SCAN --bi_gru
        torch.testing.assert_close(out[row : row + 1, :n], want, atol=1e-6, rtol=1e-6)
        assert out[row, n:].abs().sum() == 0
    uni = BiGRUTextEncoder(GRUTextConfig(vocab_size=30, word_dim=6, embed_dim=5, bidirectional=False))
    packed = pack_padded_sequence(uni.embed(ids), lens, batch_first=True, enforce_sorted=False)
    assert uni(ids, lens).shape == (3, 7, 5) and packed is not None
    with pytest.raises(ValueError, match="lens"):
        enc(ids, torch.tensor([4, 9, 2]))


def test_glove_text_file_and_tensor_file(tmp_path):
    words = ["<pad>", "<start>", "<end>", "<unk>", "red", "circle", ". . ."]
    text = tmp_path / "glove.txt"
    text.write_text("red 1 2 3\nblue 0 0 0\n. . . 7 8 9\n")
    torch.manual_seed(0)
    weight = load_glove(text, words, len(words), 3)
    assert weight[4].tolist() == [1, 2, 3] and weight[6].tolist() == [7, 8, 9]
    assert weight[5].abs().max() <= 0.1  # not in the file: SCAN's U(-0.1, 0.1)
    tensor_file = tmp_path / "glove.pt"
    torch.save(torch.arange(21.0).view(7, 3), tensor_file)
    assert load_glove(tensor_file, None, 7, 3)[2].tolist() == [6, 7, 8]
    with pytest.raises(ValueError, match=r"\(8, 3\) tensor"):
        load_glove(tensor_file, None, 8, 3)
    (tmp_path / "bad.txt").write_text("red 1 2\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        load_glove(tmp_path / "bad.txt", words, len(words), 3)
    with pytest.raises(ValueError, match="vocabulary words"):
        load_glove(text, None, len(words), 3)
    with pytest.raises(FileNotFoundError):
        load_glove(tmp_path / "missing.txt", words, len(words), 3)


def test_frozen_glove_really_stays_fixed(tmp_path):
    words = ["<pad>", "<start>", "<end>", "<unk>", "red", "circle"]
    (tmp_path / "g.txt").write_text("red 1 2 3 4\ncircle 4 3 2 1\n")
    ids, lens = torch.tensor([[1, 4, 5, 2]]), torch.tensor([4])
    for freeze in (True, False):
        cfg = GRUTextConfig(
            vocab_size=6,
            word_dim=4,
            embed_dim=3,
            glove_path=str(tmp_path / "g.txt"),
            freeze_embeddings=freeze,
        )
        enc = BiGRUTextEncoder(cfg, words=words)
        before = enc.embed.weight.detach().clone()
        assert before[4].tolist() == [1, 2, 3, 4]
        opt = torch.optim.AdamW(enc.parameters(), lr=0.1, weight_decay=0.1)  # the trainer's optimiser
        enc(ids, lens).sum().backward()
        opt.step()
        assert torch.equal(enc.embed.weight, before) == freeze
        assert enc.embed.weight.requires_grad != freeze


# ------------------------------------------------------------------ run integration


def test_prepare_data_reads_a_scan_layout_directory(tmp_path):
    root = tmp_path / "precomp"
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("dev", 3), ("test", 3)):
        write_precomp_split(root, split, rng.random((n, 5, 7), dtype=np.float32), _caps(n))
    vocab = WordVocab.build(_caps(6))
    vocab.save(tmp_path / "vocab.json")  # SCAN json format
    cfg = apply_overrides(
        RunConfig(),
        [
            "data.dataset=precomp",
            f"data.root={root}",
            f"data.vocab_path={tmp_path / 'vocab.json'}",
            "model.image_encoder=precomp",
            "model.precomp.region_dim=7",
            "model.precomp.num_regions=5",
        ],
    )
    data = prepare_data(cfg.data)
    assert data.splits["test"].images.batch(torch.tensor([0]), False).shape == (1, 5, 7)
    assert data.splits["train"].dense_ids is None and data.vocab_size == len(vocab)
    check_model_data(cfg, build_model(cfg.model, vocab_size=data.vocab_size), data)
    wrong = apply_overrides(cfg, ["model.precomp.region_dim=9"])
    with pytest.raises(ConfigError, match="model.precomp.region_dim=9"):
        check_model_data(wrong, build_model(wrong.model, vocab_size=data.vocab_size), data)
    with pytest.raises(ConfigError, match="model.image_encoder=precomp"):
        check_config(apply_overrides(cfg, ["model.image_encoder=tiny"]))
    with pytest.raises(ConfigError, match="data.root"):
        prepare_data(apply_overrides(cfg, ["data.root="]).data)
