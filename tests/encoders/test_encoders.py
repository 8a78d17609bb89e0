"""Encoders: token shapes, padding invariance, gradients, Hugging Face adapters and BERT tokenisation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers  # a dev dependency: a missing one fails collection, never skips

from conftest import TINY_WORDPIECE
from patchword.data.tokenizers import BertCaptionTokenizer, size_augment
from patchword.encoders import (
    HFTextConfig,
    HFTextEncoder,
    HFVisionConfig,
    HFVisionEncoder,
    TinyTextConfig,
    TinyTextTransformer,
    TinyViT,
    TinyViTConfig,
    build_image_encoder,
    build_text_encoder,
)
from patchword.errors import ModelNotFoundError

VIT_CFG = TinyViTConfig(image_size=32, patch_size=8, width=32, depth=2, heads=2, embed_dim=48)
TEXT_CFG = TinyTextConfig(vocab_size=50, max_len=16, width=32, depth=2, heads=2, embed_dim=48)


def tiny_vit_config(**kw):
    kw = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "image_size": 32,
        "patch_size": 8,
        **kw,
    }
    return transformers.ViTConfig(**kw)


def tiny_swin_config(image_size=32):
    return transformers.SwinConfig(
        image_size=image_size, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4
    )


def tiny_bert_config():
    return transformers.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )


def random_text(batch=3, length=9, lens=(9, 4, 1), vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    ids[torch.arange(length) >= lens[:, None]] = 0
    return ids, lens


def assert_all_params_get_grad(module, out):
    # A random weighting: a plain sum after LayerNorm has zero gradient.
    (out * torch.randn_like(out)).sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


# ----------------------------------------------------------------------------------------------
# Tiny encoders
# ----------------------------------------------------------------------------------------------


def test_tiny_vit_shapes_and_attributes():
    torch.manual_seed(0)
    enc = TinyViT(VIT_CFG)
    out = enc(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 1 + 16, 48)
    assert (enc.num_patches, enc.has_cls, enc.embed_dim) == (16, True, 48)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r"\(B, 3, 32, 32\)"):
        enc(torch.randn(2, 3, 64, 64))


def test_tiny_vit_conv_stem_keeps_the_token_grid_and_sees_locally():
    from dataclasses import replace

    torch.manual_seed(0)
    enc = TinyViT(replace(VIT_CFG, stem="conv")).eval()
    stem = enc.patch_embed
    assert [m.stride for m in stem if isinstance(m, torch.nn.Conv2d)] == [(2, 2), (2, 2), (2, 2), (1, 1)]
    x = torch.randn(2, 3, 32, 32)
    assert enc(x).shape == (2, 1 + 16, 48)
    # the stem's output grid is the patch grid: changing one pixel changes only nearby cells
    y = x.clone()
    y[:, :, 0, 0] += 5.0
    changed = (stem(y) - stem(x)).abs().amax(dim=(0, 1)) > 1e-6  # (4, 4) cells
    assert changed[0, 0] and not changed[2:, :].any() and not changed[:, 2:].any()
    with pytest.raises(ValueError, match="power-of-two"):
        TinyViT(TinyViTConfig(image_size=24, patch_size=6, width=32, depth=1, heads=2, stem="conv"))
    with pytest.raises(ValueError, match="stem must be"):
        TinyViT(replace(VIT_CFG, stem="resnet"))


def test_projection_is_identity_when_widths_match():
    enc = TinyViT(TinyViTConfig(image_size=16, patch_size=8, width=32, depth=1, heads=2, embed_dim=32))
    assert isinstance(enc.proj, torch.nn.Identity)
    assert list(enc.head_parameters()) == []
    assert len(list(enc.backbone_parameters())) == len(list(enc.parameters()))


def test_parameter_groups_partition_the_model():
    enc = TinyTextTransformer(TEXT_CFG)
    head = list(enc.head_parameters())
    backbone = list(enc.backbone_parameters())
    assert {id(p) for p in head} == {id(p) for p in enc.proj.parameters()} and len(head) == 2
    assert len(head) + len(backbone) == len(list(enc.parameters()))
    assert not enc.pretrained


@pytest.mark.parametrize("mode", ["train", "eval", "eval_no_grad"])
def test_tiny_text_padding_invariance(mode):
    torch.manual_seed(0)
    enc = TinyTextTransformer(TEXT_CFG).train(mode == "train")
    ids, lens = random_text()
    padded = torch.cat([ids, torch.randint(1, 50, (3, 5))], dim=1)  # garbage ids beyond lens
    with torch.set_grad_enabled(mode != "eval_no_grad"):
        short, long = enc(ids, lens), enc(padded, lens)
    assert short.shape == (3, 9, 48) and long.shape == (3, 14, 48)
    assert torch.isfinite(short).all() and torch.isfinite(long).all()
    for row, n in enumerate(lens.tolist()):
        torch.testing.assert_close(long[row, :n], short[row, :n], atol=1e-5, rtol=1e-5)


def test_tiny_text_train_and_eval_paths_agree():
    # Without dropout the fused inference path must match the training path.
    torch.manual_seed(0)
    enc = TinyTextTransformer(TEXT_CFG)
    ids, lens = random_text()
    train_out = enc.train()(ids, lens)
    with torch.no_grad():
        eval_out = enc.eval()(ids, lens)
    for row, n in enumerate(lens.tolist()):
        torch.testing.assert_close(eval_out[row, :n], train_out[row, :n].detach(), atol=1e-5, rtol=1e-5)


def test_tiny_text_rejects_bad_lengths():
    enc = TinyTextTransformer(TEXT_CFG)
    ids, _ = random_text()
    with pytest.raises(ValueError, match="lens"):
        enc(ids, torch.tensor([9, 0, 1]))
    with pytest.raises(ValueError, match="lens"):
        enc(ids, torch.tensor([10, 4, 1]))
    with pytest.raises(ValueError, match="L <= 16"):
        enc(torch.ones(1, 17, dtype=torch.long), torch.tensor([17]))


def test_tiny_encoders_gradients_reach_all_parameters():
    torch.manual_seed(0)
    vit = TinyViT(VIT_CFG)
    assert_all_params_get_grad(vit, vit(torch.randn(2, 3, 32, 32)))
    text = TinyTextTransformer(TEXT_CFG)
    ids, lens = random_text()
    assert_all_params_get_grad(text, text(ids, lens))


def test_tiny_encoders_are_deterministic_under_a_seed():
    images = torch.randn(2, 3, 32, 32)
    ids, lens = random_text()
    outs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        vit, text = TinyViT(VIT_CFG), TinyTextTransformer(TEXT_CFG)
        outs.append((vit(images), text(ids, lens)))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=0)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=0, atol=0)
    assert not torch.allclose(outs[0][0], outs[2][0])


def test_factories_dispatch_on_config_type():
    assert isinstance(build_image_encoder(VIT_CFG), TinyViT)
    text = build_text_encoder(TEXT_CFG, vocab_size=77)
    assert isinstance(text, TinyTextTransformer) and text.token_embed.num_embeddings == 77
    with pytest.raises(TypeError, match="dict"):
        build_image_encoder({})
    vision = build_image_encoder(HFVisionConfig(tiny_swin_config(), embed_dim=24))
    assert isinstance(vision, HFVisionEncoder) and vision.kind == "swin"
    bert = build_text_encoder(HFTextConfig(tiny_bert_config(), embed_dim=24), vocab_size=50)
    assert isinstance(bert, HFTextEncoder)
    with pytest.raises(ValueError, match="exceeds"):
        build_text_encoder(HFTextConfig(tiny_bert_config()), vocab_size=51)


# ----------------------------------------------------------------------------------------------
# Hugging Face adapters
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "num_patches", "has_cls"),
    [
        (tiny_vit_config(), 16, True),  # 32 / 8 = 4x4 patches + CLS
        (tiny_swin_config(), 16, False),  # 32 / 4 = 8x8, one merge -> 4x4, no CLS
        (tiny_swin_config(image_size=36), 25, False),  # 9x9 -> padded merge -> 5x5
    ],
    ids=["vit", "swin", "swin_odd"],
)
def test_hf_vision_shapes(config, num_patches, has_cls):
    torch.manual_seed(0)
    enc = HFVisionEncoder(config, embed_dim=24)
    size = config.image_size
    out = enc(torch.randn(2, 3, size, size))
    assert (enc.num_patches, enc.has_cls, enc.pretrained) == (num_patches, has_cls, False)
    assert out.shape == (2, int(has_cls) + num_patches, 24)
    assert_all_params_get_grad(enc, out)


def test_hf_vision_kind_mismatch():
    with pytest.raises(ValueError, match="model_type 'vit'"):
        HFVisionEncoder(tiny_vit_config(), kind="swin")


def test_hf_vision_loads_a_local_directory(tmp_path):
    torch.manual_seed(0)
    saved = transformers.ViTModel(tiny_vit_config())  # with pooler: loading must drop it
    saved.save_pretrained(tmp_path)
    enc = HFVisionEncoder(tmp_path, embed_dim=32)
    assert enc.pretrained and enc.has_cls and isinstance(enc.proj, torch.nn.Identity)
    assert enc.backbone.pooler is None
    images = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(enc(images), saved(pixel_values=images).last_hidden_state)


def test_hf_checkpoint_weights_are_loaded_as_float32(tmp_path):
    # transformers 5 would keep a float16 checkpoint in float16, clashing with the float32 projection.
    transformers.BertModel(tiny_bert_config()).half().save_pretrained(tmp_path)
    enc = HFTextEncoder(tmp_path, embed_dim=24)
    assert {p.dtype for p in enc.parameters()} == {torch.float32}
    ids, lens = random_text()
    assert enc(ids, lens).dtype == torch.float32


def test_hf_text_uses_the_attention_mask():
    torch.manual_seed(0)
    enc = HFTextEncoder(tiny_bert_config(), embed_dim=24).eval()
    ids, lens = random_text()
    out = enc(ids, lens)
    assert out.shape == (3, 9, 24) and enc.embed_dim == 24
    garbage = ids.clone()
    garbage[ids == 0] = 7  # padding positions hold non-pad ids: only lens says they are padding
    longer = torch.cat([ids, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    for other in (enc(garbage, lens), enc(longer, lens)):
        assert torch.isfinite(other).all()
        for row, n in enumerate(lens.tolist()):
            torch.testing.assert_close(other[row, :n], out[row, :n], atol=1e-5, rtol=1e-5)
    # ... and the mask does matter: attending to the garbage changes the valid outputs.
    unmasked = enc.proj(enc.backbone(input_ids=garbage).last_hidden_state)
    assert not torch.allclose(unmasked[1, :4], out[1, :4], atol=1e-4)


@pytest.mark.parametrize("lens", [(9, 4, 1), (9, 9, 9)], ids=["padded", "no-padding"])
def test_hf_text_mask_equals_the_one_transformers_builds(lens):
    """The encoder hands BERT a ready (B, 1, L, L) mask (no host check for padding); the outputs are
    those of transformers' own (B, L) mask, with padding and without (where transformers drops it)."""
    torch.manual_seed(0)
    enc = HFTextEncoder(tiny_bert_config(), embed_dim=24).eval()
    ids, lens = random_text(lens=lens)
    valid = torch.arange(ids.shape[1]) < lens[:, None]
    want = enc.proj(enc.backbone(input_ids=ids, attention_mask=valid).last_hidden_state)
    got = enc(ids, lens)
    for row, n in enumerate(lens.tolist()):
        torch.testing.assert_close(got[row, :n], want[row, :n], atol=1e-6, rtol=1e-6)


def test_hf_text_training_encode_does_not_wait_for_the_device():
    """On an accelerator a training step's text encoding makes the host wait for nothing: f07ac7d
    waited once per call in transformers' padding check (``mask.all()``)."""
    from patchword.testing.simulated_device import SimulatedDevice

    torch.manual_seed(0)
    enc = HFTextEncoder(tiny_bert_config(), embed_dim=24).train()
    ids, lens = random_text()
    sim = SimulatedDevice()
    with sim:
        sim.to_device(enc)
        ids, lens = sim.to_device(ids), sim.to_device(lens)
        sim.reset()
        enc(ids, lens).sum().backward()
    assert sim.counts.syncs == 0, sim.counts.sync_sites


def test_hf_text_gradients_and_length_check():
    enc = HFTextEncoder(tiny_bert_config(), embed_dim=24)
    ids, lens = random_text()
    assert_all_params_get_grad(enc, enc(ids, lens))
    with pytest.raises(ValueError, match="L <= 32"):
        enc(torch.ones(1, 33, dtype=torch.long), torch.tensor([33]))


def test_missing_local_directory_errors_name_the_path(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the hint depends on it (tested below)
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model.*does not exist"):
        HFVisionEncoder(missing)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*no config.json"):
        HFTextEncoder(tmp_path)
    # A hub-id-shaped name that is not cached: local_files_only forbids the download.
    with pytest.raises(ModelNotFoundError, match="not-a-user/not-a-model.*hf_local_files_only=true"):
        HFTextEncoder("not-a-user/not-a-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE is set"):
        HFTextEncoder("not-a-user/not-a-model", local_files_only=False)
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        BertCaptionTokenizer.from_pretrained(missing)
    with pytest.raises(FileNotFoundError, match="neither vocab.txt nor tokenizer.json"):
        BertCaptionTokenizer.from_pretrained(tmp_path)


def test_import_works_without_transformers_and_adapters_say_how_to_install(monkeypatch):
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import patchword.encoders as e\n"
        "e.TinyViT(e.TinyViTConfig(image_size=16, depth=1))\n"
        "try:\n    e.HFTextEncoder('bert-base-uncased')\n"
        "except ImportError as err:\n    print(err)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'patchword[hf]'" in result.stdout


# ----------------------------------------------------------------------------------------------
# BERT caption tokenizer
# ----------------------------------------------------------------------------------------------

VOCAB = TINY_WORDPIECE
ID = {t: i for i, t in enumerate(VOCAB)}


@pytest.fixture
def tokenizer(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return BertCaptionTokenizer.from_pretrained(tmp_path)


def test_wordpiece_split_and_special_tokens(tokenizer, tmp_path):
    text = "A Man riding HORSES, the dog is  running zebra."
    pieces = [
        "a",
        "man",
        "rid",
        "##ing",
        "horse",
        "##s",
        ",",
        "the",
        "dog",
        "is",
        "run",
        "##ning",
        "[UNK]",
        ".",
    ]
    assert tokenizer.tokenize(text) == pieces
    assert tokenizer.encode(text) == [ID["[CLS]"], *(ID[p] for p in pieces), ID["[SEP]"]]
    assert tokenizer.vocab_size == len(VOCAB) and tokenizer.pad_id == 0
    # The vocab file itself loads the same tokenizer.
    assert BertCaptionTokenizer.from_pretrained(tmp_path / "vocab.txt").encode(text) == tokenizer.encode(text)


def test_tokenizer_loads_a_transformers5_save(tokenizer, tmp_path):
    fast = transformers.BertTokenizer.from_pretrained(tmp_path)
    fast.save_pretrained(tmp_path / "saved")  # transformers 5 writes tokenizer.json, no vocab.txt
    loaded = BertCaptionTokenizer.from_pretrained(tmp_path / "saved")
    assert loaded.encode("a man riding") == tokenizer.encode("a man riding")


def test_batch_encode_pads_and_truncates_keeping_sep(tokenizer):
    ids, lens = tokenizer.batch_encode(["a man riding a horse.", "the dog"])
    assert lens.tolist() == [9, 4] and ids.dtype == torch.long and ids.shape == (2, 9)
    assert ids[1].tolist() == [ID["[CLS]"], ID["the"], ID["dog"], ID["[SEP]"], 0, 0, 0, 0, 0]
    ids, lens = tokenizer.batch_encode(["a man riding a horse.", "the dog"], max_len=5)
    assert lens.tolist() == [5, 4]
    assert ids[0].tolist() == [ID["[CLS]"], ID["a"], ID["man"], ID["rid"], ID["[SEP]"]]
    with pytest.raises(ValueError, match="at least 2"):
        tokenizer.batch_encode(["a"], max_len=1)


def test_empty_caption_error_names_its_index(tokenizer):
    with pytest.raises(ValueError, match="caption 2 is empty"):
        tokenizer.batch_encode(["a man", "the dog", "   "])


def test_vocabulary_must_put_pad_at_zero():
    with pytest.raises(ValueError, match=r"\[PAD\] must have id 0"):
        BertCaptionTokenizer({"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4})


# ----------------------------------------------------------------------------------------------
# Size augmentation
# ----------------------------------------------------------------------------------------------

MASK_ID, WORD_ID = 4, 1  # the word id is outside the replacement pool, so replacements are visible
POOL = np.arange(5, 40)


def test_size_augment_rates_match_the_official_recipe():
    n = 40_000
    out = np.array(
        size_augment([(WORD_ID,)] * n, mask_id=MASK_ID, random_ids=POOL, generator=np.random.default_rng(0))
    )
    rates = {
        "mask": (out == MASK_ID).sum() / n,
        "random": np.isin(out, POOL).sum() / n,
        "delete": (n - len(out)) / n,
    }
    assert rates == pytest.approx({"mask": 0.10, "random": 0.02, "delete": 0.08}, abs=0.006)


def test_size_augment_treats_all_sub_tokens_of_a_word_alike():
    out = size_augment(
        [(WORD_ID,) * 3] * 3000, mask_id=MASK_ID, random_ids=POOL, generator=torch.Generator().manual_seed(0)
    )
    assert len(out) % 3 == 0
    kinds = [("mask" if t == MASK_ID else "keep" if t == WORD_ID else "random") for t in out]
    triples = [kinds[i : i + 3] for i in range(0, len(kinds), 3)]
    assert all(len(set(t)) == 1 for t in triples)
    assert {t[0] for t in triples} == {"mask", "keep", "random"}


@pytest.mark.parametrize(
    "make_generator", [np.random.default_rng, lambda s: torch.Generator().manual_seed(s)]
)
def test_size_augment_is_deterministic_given_the_seed(tokenizer, make_generator):
    texts = ["a man riding a horse, the dog is running."] * 20
    first = tokenizer.batch_encode(texts, augment=True, generator=make_generator(0))
    again = tokenizer.batch_encode(texts, augment=True, generator=make_generator(0))
    other = tokenizer.batch_encode(texts, augment=True, generator=make_generator(1))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0]) or not torch.equal(first[1], other[1])
    ids, lens = first
    assert (ids[:, 0] == ID["[CLS]"]).all()
    assert (ids[torch.arange(len(lens)), lens - 1] == ID["[SEP]"]).all()
    # Replacements never draw special tokens ([PAD] would read as padding).
    body = ids[:, 1:][torch.arange(ids.shape[1] - 1) < (lens[:, None] - 2)]
    assert not torch.isin(body, torch.tensor([0, 1, 2, 3])).any()
