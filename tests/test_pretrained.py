"""Contrastive pretraining pieces: the InfoNCE loss, the clip matcher's learned temperature, and pretrained
tiny encoders (save, load through ``model.tiny_pretrained``, and the errors a user meets)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from patchword.config import apply_overrides
from patchword.errors import ConfigError, MissingFileError
from patchword.losses import ContrastiveLoss
from patchword.matching import build_matcher
from patchword.model import build_model
from patchword.pretrained import load_pretrained_encoders, save_pretrained_encoders, shipped_pretrained
from patchword.run_config import RunConfig

SMALL = ["model.name=vse-tiny-16", "model.matcher=seps", "model.max_text_len=32"]


def test_contrastive_loss_is_clips_symmetric_cross_entropy():
    torch.manual_seed(0)
    sims = torch.randn(5, 5)
    want = (F.cross_entropy(3.0 * sims, torch.arange(5)) + F.cross_entropy(3.0 * sims.T, torch.arange(5))) / 2
    assert torch.allclose(ContrastiveLoss()(sims, 3.0), want)


def test_contrastive_loss_removes_non_negatives_from_the_denominators():
    torch.manual_seed(1)
    sims = torch.randn(4, 4)
    ids = torch.tensor([0, 1, 1, 2])  # samples 1 and 2 show the same image
    got = ContrastiveLoss()(sims, 1.0, ids)
    # by hand: row 1 drops column 2 (and row 2 column 1), likewise for the caption queries
    terms = []
    for q in range(4):
        keep = [j for j in range(4) if j == q or ids[j] != ids[q]]
        terms.append(-(sims[q, q] - torch.logsumexp(sims[q, keep], 0)))  # image query q
        terms.append(-(sims[q, q] - torch.logsumexp(sims[keep, q], 0)))  # caption query q
    assert torch.allclose(got, torch.stack(terms).sum() / 8)


def test_contrastive_loss_shares_sum_to_the_whole():
    torch.manual_seed(2)
    sims, ids = torch.randn(6, 6), torch.tensor([0, 1, 2, 3, 4, 4])
    loss = ContrastiveLoss()
    whole = loss(sims, 5.0, ids)
    assert torch.allclose(
        loss(sims, 5.0, ids, queries=slice(0, 2)) + loss(sims, 5.0, ids, queries=slice(2, 6)), whole
    )


def test_clip_matcher_learns_a_temperature_but_scores_cosines():
    clip = build_matcher("clip", embed_dim=8, num_patches=4, has_cls=True)
    vse = build_matcher("vse", embed_dim=8, num_patches=4, has_cls=True)
    assert math.isclose(clip.temperature_scale().item(), 1 / 0.07, rel_tol=1e-6)
    assert vse.temperature_scale() is None and "logit_scale" in dict(clip.named_parameters())
    img, cap, lens = torch.randn(2, 5, 8), torch.randn(3, 4, 8), torch.tensor([4, 2, 3])
    out = clip(img, cap, lens)
    assert torch.allclose(out.sims, vse(img, cap, lens).sims) and out.extras["logit_scale"].requires_grad
    with torch.no_grad():
        clip.logit_scale.fill_(10.0)  # exp(10) is clamped at CLIP's 100
    assert clip(img, cap, lens).extras["logit_scale"].item() == 100.0


def _tiny(cfg, vocab_size=12):
    torch.manual_seed(3)
    return build_model(cfg.model, vocab_size=vocab_size)


def test_pretrained_encoders_round_trip_and_are_marked_pretrained(tmp_path):
    cfg = apply_overrides(RunConfig(), [*SMALL, "model.matcher=clip"])
    source = _tiny(cfg)
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"word2idx": {}, "idx2word": {}, "idx": 0}))
    out = tmp_path / "enc"
    save_pretrained_encoders(source, cfg.model, vocab, out, {"seed": 0})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "vocab.json"]
    fine = apply_overrides(cfg, ["model.matcher=seps"])
    torch.manual_seed(99)
    target = build_model(fine.model, vocab_size=12)
    load_pretrained_encoders(target, fine.model, str(out))
    for key, value in source.state_dict().items():
        if key.startswith(("image_encoder.", "text_encoder.")):
            # stored as float16 (half the file), loaded back into float32
            assert torch.equal(target.state_dict()[key], value.half().float()), key
    assert target.image_encoder.pretrained and target.text_encoder.pretrained
    # through the config field: the same weights, and the backbone learning-rate group appears
    via_config = build_model(apply_overrides(fine, [f"model.tiny_pretrained={out}"]).model, vocab_size=12)
    assert torch.equal(via_config.image_encoder.cls_token, target.image_encoder.cls_token)
    assert [g["name"] for g in via_config.parameter_groups(1e-3, 0.1)] == ["head", "backbone"]


def test_pretrained_encoder_errors_name_the_key(tmp_path):
    cfg = apply_overrides(RunConfig(), SMALL)
    with pytest.raises(MissingFileError, match="model.tiny_pretrained=nowhere: no such directory"):
        build_model(apply_overrides(cfg, ["model.tiny_pretrained=nowhere"]).model, vocab_size=12)
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    save_pretrained_encoders(_tiny(cfg), cfg.model, vocab, tmp_path / "enc", {})
    wider = apply_overrides(cfg, [f"model.tiny_pretrained={tmp_path / 'enc'}", "model.tiny_text_width=32"])
    with pytest.raises(ConfigError, match="model.tiny_text_width: is 32 but the pretrained encoders"):
        build_model(wider.model, vocab_size=12)
    other_vocab = apply_overrides(cfg, [f"model.tiny_pretrained={tmp_path / 'enc'}"])
    with pytest.raises(ConfigError, match="does not fit the text_encoder"):
        build_model(other_vocab.model, vocab_size=13)  # a different vocabulary size
    from patchword.train.validate import check_config

    no_vocab = apply_overrides(
        other_vocab, ["data.synthetic_image_size=32", "data.max_caption_len=20", "data.max_dense_len=32"]
    )
    with pytest.raises(ConfigError, match="data.vocab_path: must be the pretrained encoders' vocabulary"):
        check_config(no_vocab)
    check_config(apply_overrides(no_vocab, [f"data.vocab_path={tmp_path / 'enc'}"]))  # accepted


@pytest.mark.parametrize("name", shipped_pretrained())
def test_shipped_encoders_load_and_reproduce_their_recorded_recall(tmp_path, name):
    """The committed encoders: what `patchword pretrain` recorded is what a user gets, on the scenes their
    recipe trained on."""
    from patchword.data.prepare import prepare_data
    from patchword.pretrain import global_recall, pretrained_recipe
    from patchword.pretrained import resolve_pretrained_dir

    meta = json.loads((resolve_pretrained_dir(name) / "config.json").read_text())
    recipe = pretrained_recipe(name)
    cfg = apply_overrides(
        RunConfig(),
        [
            "model.embed_dim=128",
            f"model.tiny_pretrained={name}",
            f"data.vocab_path={name}",
            f"data.synthetic_scenes={recipe.data.synthetic_scenes}",
            f"data.cache_dir={tmp_path}",
        ],
    )
    got = global_recall(cfg, prepare_data(cfg.data, roles=["test"]))
    want = meta["test_global"]
    # the same weights and data; only float rounding of another CPU's kernels may move a tied rank
    assert got["rsum"] == pytest.approx(want["rsum"], abs=0.5)
    assert set(got) == set(want) and meta["architecture"]["embed_dim"] == 128 and meta["seed"] == 0
