"""Importing official TGDT and UCMFH checkpoints: the imported runs score as the official forwards do.

Checkpoints are written here in the official layouts (``torch.save`` of what ``train.py`` /
``utils.save_checkpoints`` store) with random weights off their initialisation; the official forwards are
the literal references in :mod:`patchword.testing.official_tgdt` / :mod:`~patchword.testing.official_ucmfh`,
which read the official tensor names and never a patchword module.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers  # a dev dependency: a missing one fails collection, never skips

from patchword.errors import ConfigError, DataError
from patchword.imports import ImportOptions, import_checkpoint
from patchword.testing.official_tgdt import official_tgdt_scores, official_tgdt_state_dict
from patchword.testing.official_ucmfh import (
    official_ucmfh_checkpoint,
    official_ucmfh_eval,
    official_ucmfh_train_features,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-4  # float32, official vs imported
BERT = dict(
    vocab_size=20, hidden_size=16, num_attention_heads=2, intermediate_size=32, max_position_embeddings=16
)
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(15))]


def official_config(**changes):
    """A tiny official TGDT config (configs/f30k_all.yaml's keys): 12-d regions, BERT 16-d with 1 layer,
    8-d joint space, 1 + 1 transformer layers per modality. ``changes``: ``{"section.key": value}``."""
    config = {
        "dataset": {"name": "f30k", "data": "data", "restval": True, "pre-extracted-features": False},
        "text-model": {
            "name": "bert",
            "pretrain": "bert-base-uncased",
            "word-dim": 16,
            "extraction-hidden-layer": 1,
            "fine-tune": True,
            "pre-extracted": False,
            "layers": 0,
            "dropout": 0.1,
        },
        "image-model": {
            "name": "bottomup",
            "pre-extracted-features-root": "data/f30k/features_36",
            "transformer-layers": 0,
            "dropout": 0.1,
            "pos-encoding": None,
            "crop-size": 224,
            "fine-tune": False,
            "feat-dim": 12,
            "norm": True,
        },
        "model": {
            "name": "baseline",
            "embed-size": 8,
            "text-aggregation": "first",
            "image-aggregation": "first",
            "layers": 1,
            "exclude-stopwords": False,
            "shared-transformer": False,
            "dropout": 0.1,
        },
        "training": {
            "lr": 1e-05,
            "grad-clip": 2.0,
            "max-violation": True,
            "loss-type": "alignment+matching",
            "matching-weight": 1,
            "alignment-weight": 1,
            "alignment-mode": "MrSw",
            "measure": "dot",
            "margin": 0.2,
            "bs": 30,
            "scheduler": "steplr",
            "gamma": 0.1,
            "step-size": 20,
            "warmup": "linear",
            "warmup-period": 1000,
        },
    }
    for key, value in changes.items():
        section, name = key.split(".", 1)
        config[section][name] = value
    return config


# configs/{f30k,coco}_all.yaml of the released runs: TERAN's post-processing before img_proj (4 layers there)
RELEASED = {"image-model.transformer-layers": 2, "image-model.pos-encoding": "concat-and-process"}


def bert_config(layers=1, **changes):
    return transformers.BertConfig(**{**BERT, "num_hidden_layers": layers, **changes})


@pytest.fixture
def hf_text(tmp_path):
    """A --hf-text directory: the BERT architecture (3 layers: the import truncates to the checkpoint's 1)
    and its vocab.txt; no weights (they come from the checkpoint)."""
    path = tmp_path / "bert"
    bert_config(layers=3).save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    return path


def write_tgdt(path, config, *, seed=0):
    """A TGDT checkpoint as the official train.py saves it; returns its model state dict."""
    state = official_tgdt_state_dict(
        config, bert_config(config["text-model"]["extraction-hidden-layer"]), seed=seed, ffn_dim=32
    )
    opt = argparse.Namespace(
        num_epochs=60, lr_update=15, workers=10, logger_name="runs/f30k_m0.3", config="configs/f30k_all.yaml"
    )
    ckpt = {
        "epoch": 12,
        "model": state,
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4)}},
            "param_groups": [{"lr": 1e-5, "params": [0]}],
        },
        "scheduler": {"step_size": 20, "gamma": 0.1, "last_epoch": 12},
        "opt": opt,
        "config": config,
        "Eiters": 4321,
    }
    torch.save(ckpt, path)
    return state


def write_ucmfh(tmp_path, *, bits=16, real=False):
    """A hash checkpoint as utils.save_checkpoints writes it (task 1), or a real-valued one (task 0)."""
    ckpt = official_ucmfh_checkpoint(16, bits, layers=2, ffn_dim=64, hidden=64, seed=1)
    kind = "real" if real else "hash"
    path = (
        tmp_path / "checkpoints" / kind / ("mirflickr_fusion.pth" if real else f"mirflickr_hash_{bits}.pth")
    )
    path.parent.mkdir(parents=True)
    torch.save({"FusionTransformer": ckpt["FusionTransformer"]} if real else ckpt, path)
    return path, ckpt


def captions(seed=0, lengths=(5, 7, 9, 6, 4)):
    """BERT id sequences [CLS] w.. [SEP] of the given lengths, and the same 0-padded with their lengths."""
    gen = torch.Generator().manual_seed(seed)
    caps = [
        torch.cat([torch.tensor([2]), torch.randint(5, 20, (n - 2,), generator=gen), torch.tensor([3])])
        for n in lengths
    ]
    ids = torch.zeros(len(caps), max(lengths), dtype=torch.long)
    for i, cap in enumerate(caps):
        ids[i, : len(cap)] = cap
    return caps, ids, torch.tensor(lengths)


def nothing_written(tmp_path, out):
    return not out.exists() and not [p for p in tmp_path.iterdir() if ".import-" in p.name]


# --------------------------------------------------------------------------------------------- TGDT
@pytest.mark.parametrize(
    "changes",
    [
        {},
        RELEASED,
        {**RELEASED, "image-model.pos-encoding": "project-and-sum", "image-model.transformer-layers": 1},
        {
            "model.text-aggregation": "sum",
            "model.shared-transformer": True,
            "training.loss-type": "alignment",
        },
    ],
    ids=["no-post-processing", "released-configs", "project-and-sum", "sum-shared"],
)
def test_tgdt_import_scores_as_official(tmp_path, hf_text, changes):
    from patchword.runs import load_run

    config = official_config(**changes)
    state = write_tgdt(tmp_path / "model_best_rsum.pth.tar", config)
    out = tmp_path / "run"
    record = import_checkpoint(
        tmp_path / "model_best_rsum.pth.tar", out, options=ImportOptions(hf_text=str(hf_text))
    )
    assert record["family"] == "tgdt"
    unused = ("bert_model.pooler.", "txt_enc.word_embeddings.", "txt_enc.map.", "img_enc.fc.", "agg_emb.")
    expected = {k for k in state if any(u in k for u in unused) or k.startswith(("img_first", "cap_first"))}
    assert {k for k in record["ignored"] if k in state} == expected
    assert {"optimizer", "scheduler"} <= set(record["ignored"])
    # the rest is loaded: img_proj.bias also as the global token (without the post-processing; with it the
    # zero slot runs through it), a shared transformer's 12 tensors per layer in both modalities
    post = changes.get("image-model.pos-encoding") is not None
    twice = (0 if post else 1) + (12 if changes.get("model.shared-transformer") else 0)
    assert record["loaded"] == len(state) - len(expected) + twice
    run = load_run(out)
    tg = run.config.model.tgdt
    assert (tg.skip_text_head, tg.skip_text_tail, tg.local_scale) == (1, 2, 10.0)
    assert tg.inference == ("local" if "training.loss-type" in changes else "hybrid")
    assert run.config.data.tokenizer == "bert" and run.tokenizer.vocab["w0"] == 5
    assert run.config.data.region_boxes == post
    assert run.config.model.precomp.post.layers == changes.get("image-model.transformer-layers", 0)

    gen = torch.Generator().manual_seed(5)
    regions = torch.randn(3, 36, 12, generator=gen)
    corner = torch.rand(3, 36, 2, generator=gen) * 0.6
    boxes = torch.cat([corner, corner + 0.05 + torch.rand(3, 36, 2, generator=gen) * 0.35], dim=2)
    caps, ids, lens = captions()
    model = run.model.eval()
    with torch.no_grad():
        pixels = torch.cat([regions, boxes], dim=2) if post else regions  # what the precomp loader gives
        img, cap = model.encode_images(pixels), model.encode_texts(ids, lens)
        ours = {
            mode: model.matcher.with_inference(mode).eval()(img, cap, lens).sims
            for mode in ("global", "local", "hybrid")
        }
    # evaluation: the official test-time forward (switch_test(): local tokens from stage 1)
    official = official_tgdt_scores(
        state, config, bert_config(1), regions, caps, boxes=boxes if post else None, istest=True
    )
    for mode, sims in ours.items():
        diff = (sims - official[mode]).abs().max().item()
        print(f"TGDT {changes or 'no post-processing'} {mode}: max |imported - official| = {diff:.2e}")
        assert diff < TOL, mode
    assert official["local"].abs().max() > 1.0  # the local score is not trivially small
    # training: the official training forward's local similarity reads the final (stage-2) tokens
    at_train = official_tgdt_scores(
        state, config, bert_config(1), regions, caps, boxes=boxes if post else None
    )
    with torch.no_grad():
        trained = model.matcher.train()(img, cap, lens).sims
    model.matcher.eval()
    assert (trained - at_train["local"]).abs().max() < TOL
    assert (at_train["local"] - official["local"]).abs().max() > 0.1  # the two token sets differ


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("image-model.transformer-layers", -1),
        ("image-model.pos-encoding", "learned"),
        ("text-model.layers", 1),
        ("model.exclude-stopwords", True),
        ("model.text-aggregation", "gated"),
        ("training.measure", "order"),
    ],
)
def test_tgdt_unsupported_config_is_one_error(tmp_path, hf_text, key, value):
    ckpt = tmp_path / "model_best_rsum.pth.tar"
    write_tgdt(ckpt, official_config(**{key: value}))
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        import_checkpoint(ckpt, out, options=ImportOptions(hf_text=str(hf_text)))
    assert err.value.key == f"config.{key}"
    assert str(ckpt) in str(err.value)
    assert nothing_written(tmp_path, out)


def test_tgdt_mismatched_hf_text_names_the_tensor(tmp_path):
    ckpt = tmp_path / "model_best_rsum.pth.tar"
    write_tgdt(ckpt, official_config())
    wide = tmp_path / "bert32"
    bert_config(hidden_size=32).save_pretrained(wide)
    (wide / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"embeddings\.word_embeddings\.weight has shape \(20, 16\)") as err:
        import_checkpoint(ckpt, out, options=ImportOptions(hf_text=str(wide)))
    assert "hidden_size 32" in str(err.value)
    assert nothing_written(tmp_path, out)
    with pytest.raises(ConfigError, match="--hf-text"):
        import_checkpoint(ckpt, out, options=ImportOptions())
    assert nothing_written(tmp_path, out)


def test_other_family_is_refused(tmp_path, hf_text):
    tgdt = tmp_path / "model_best_rsum.pth.tar"
    write_tgdt(tgdt, official_config())
    ucmfh, _ = write_ucmfh(tmp_path)
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"is not a ucmfh checkpoint \(it looks like tgdt\)") as err:
        import_checkpoint(tgdt, out, family_name="ucmfh")
    assert str(tgdt) in str(err.value)
    with pytest.raises(DataError, match=r"is not a tgdt checkpoint \(it looks like ucmfh\)") as err:
        import_checkpoint(ucmfh, out, family_name="tgdt", options=ImportOptions(hf_text=str(hf_text)))
    assert str(ucmfh) in str(err.value)
    assert nothing_written(tmp_path, out)


def test_tgdt_cli_smoke(tmp_path, hf_text, capsys):
    from patchword.cli import main

    ckpt = tmp_path / "model_best_rsum.pth.tar"
    write_tgdt(ckpt, official_config())
    out = tmp_path / "run"
    assert main(["import", str(ckpt), "--out", str(out), "--hf-text", str(hf_text)]) == 0
    record = json.loads((out / "import.json").read_text())
    assert record["family"] == "tgdt" and record["metadata"]["epoch"] == 12
    assert record["opt"]["config.model.embed-size"] == 8 and record["opt"]["num_epochs"] == 60
    assert (out / "bert_vocab.txt").read_text().split() == WORDS
    assert main(["import", str(ckpt), "--out", str(out), "--hf-text", str(hf_text)]) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err


def test_tgdt_vocabulary_that_does_not_fit_the_word_embedding(tmp_path, hf_text, capsys, caplog):
    """Old code: TGDT's --hf-text vocab.txt was checked only to exist (SEPS's was sized): ten words past the
    checkpoint's embedding imported (rc 0) and its first caption with one was an IndexError; a shorter
    vocabulary tokenised the captions to other ids, silently."""
    from patchword.cli import main

    ckpt = tmp_path / "model_best_rsum.pth.tar"
    write_tgdt(ckpt, official_config())
    big = tmp_path / "big"
    shutil.copytree(hf_text, big)
    (big / "vocab.txt").write_text("\n".join([*WORDS, *(f"extra{i}" for i in range(10))]) + "\n")
    out = tmp_path / "run"
    assert main(["import", str(ckpt), "--out", str(out), "--hf-text", str(big)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --hf-text: {big / 'vocab.txt'} has {len(WORDS) + 10} tokens but the BERT architecture "
        f"embeds {len(WORDS)}"
    )
    assert not out.exists()
    small = tmp_path / "small"
    shutil.copytree(hf_text, small)
    (small / "vocab.txt").write_text("\n".join(WORDS[:-5]) + "\n")
    assert main(["import", str(ckpt), "--out", str(out), "--hf-text", str(small)]) == 0
    assert (
        f"{small / 'vocab.txt'} has {len(WORDS) - 5} tokens but the BERT architecture embeds" in caplog.text
    )


# --------------------------------------------------------------------------------------------- UCMFH
def test_ucmfh_import_codes_as_official(tmp_path):
    from patchword.hashing import UCMFH, load_hashing_run
    from patchword.hashing.evaluate import encode_hashing_split

    path, ckpt = write_ucmfh(tmp_path)
    out = tmp_path / "hashrun"
    record = import_checkpoint(path, out)
    assert record["family"] == "ucmfh" and record["loaded"] == 2 * 12 + 8
    assert record["metadata"]["dataset"] == "mirflickr" and record["metadata"]["bits_in_name"] == 16
    assert {"config.yaml", "last.pt", "model.safetensors", "config.json", "import.json"} <= {
        p.name for p in out.iterdir()
    }
    # the synthetic stand-in on purpose (data.format given): the codes, not the data, are compared here
    stand_in = [
        "data.format=synthetic",
        "data.num_train=8",
        "data.num_query=4",
        "data.synthetic_num_retrieval=8",
    ]
    cfg, model, _ = load_hashing_run(out, stand_in)
    assert (cfg.model.fusion, cfg.model.bits, cfg.model.nhead, cfg.model.eval_batch_size) == (
        "official_fused",
        16,
        4,
        128,
    )

    gen = torch.Generator().manual_seed(3)
    image, text = torch.randn(200, 16, generator=gen), torch.randn(200, 16, generator=gen)  # 128 + 72
    official = official_ucmfh_eval(ckpt, image, text)
    h_img, h_txt = model.encode_pairs(image, text)
    with torch.no_grad():
        train_path = model(image, text)
    feats = official_ucmfh_train_features(ckpt, image, text)
    diffs = {
        "img_hash": (F.normalize(h_img, dim=1) - official["img_hash"]).abs().max().item(),
        "txt_hash": (F.normalize(h_txt, dim=1) - official["txt_hash"]).abs().max().item(),
        "img_feat": (train_path.img_feat - feats[0]).abs().max().item(),
        "txt_feat": (train_path.txt_feat - feats[1]).abs().max().item(),
    }
    print("UCMFH max |imported - official|:", {k: f"{v:.2e}" for k, v in diffs.items()})
    assert max(diffs.values()) < TOL, diffs
    # codes: equal wherever the official output is farther than TOL from 0 (a bit closer to 0 may round
    # either way on another CPU; this seed has 3 such of 6400)
    codes = encode_hashing_split(model, image.numpy(), text.numpy())
    for ours, name in ((codes[0], "img"), (codes[1], "txt")):
        sure = official[f"{name}_hash"].abs() > TOL
        assert sure.float().mean() > 0.99
        assert torch.equal(torch.from_numpy(ours).float()[sure], official[f"{name}_code"][sure])
    sure = official["img_hash"].abs() > TOL
    assert torch.equal(UCMFH.codes(h_img)[sure], official["img_code"][sure])
    # the evaluation blocks attend to each other (the official 2-D call): not the per-pair training path
    assert (F.normalize(h_img, dim=1) - model.image_head(train_path.img_feat).detach()).abs().max() > 1e-3


def test_ucmfh_bad_inputs(tmp_path):
    real, _ = write_ucmfh(tmp_path, real=True)
    out = tmp_path / "hashrun"
    with pytest.raises(DataError, match="no ImageMlp / TextMlp: a real-valued UCMFH checkpoint") as err:
        import_checkpoint(real, out)
    assert str(real) in str(err.value)
    path, ckpt = write_ucmfh(tmp_path)
    broken = copy.deepcopy(ckpt)
    broken["TextMlp"]["tohash.weight"] = broken["TextMlp"]["tohash.weight"][:8]
    torch.save(broken, path)
    with pytest.raises(DataError, match=r"TextMlp\.tohash\.weight is 8 x 64"):
        import_checkpoint(path, out)
    torch.save(ckpt, path)
    with pytest.raises(ConfigError, match="--hf-text"):
        import_checkpoint(path, out, options=ImportOptions(hf_text="bert-base-uncased"))
    # an override of what the checkpoint fixes is refused naming the key (issue 35: never silently)
    with pytest.raises(ConfigError, match=r"model\.dim_feedforward: 32 contradicts the ucmfh checkpoint"):
        import_checkpoint(path, out, options=ImportOptions(overrides=["model.dim_feedforward=32"]))
    assert nothing_written(tmp_path, out)


def test_ucmfh_cli_smoke(tmp_path):
    from patchword.cli import main

    path, _ = write_ucmfh(tmp_path)
    out = tmp_path / "hashrun"
    assert main(["import", str(path), "--out", str(out), "--family", "ucmfh"]) == 0
    record = json.loads((out / "import.json").read_text())
    assert record["family"] == "ucmfh" and len(record["source_sha256"]) == 64
    # the hashing CLI evaluates the imported run (on the synthetic stand-in data at the checkpoint's widths,
    # asked for explicitly: an imported run without data of its own is refused otherwise)
    small = ["data.num_train=8", "data.num_query=8", "data.synthetic_num_retrieval=16", "eval.ks=[1,5]"]
    small.append("data.format=synthetic")
    assert main(["hash", "eval", str(out), "--out", str(tmp_path / "eval.json"), *small]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["fusion"] == "official_fused"


def test_tgdt_released_layout_evaluates_with_boxes_from_the_cli(tmp_path, hf_text, capsys):
    """A checkpoint of the released configs (post-processing + box encoding) imports, and `patchword eval`
    scores it on a precomp directory with {split}_boxes.npy; without the boxes, one line naming the file."""
    from patchword.cli import main
    from patchword.data.precomp import write_precomp_split

    ckpt = tmp_path / "model_best_rsum.pth.tar"
    config = official_config(**RELEASED)
    state = write_tgdt(ckpt, config)
    out = tmp_path / "run"
    assert main(["import", str(ckpt), "--out", str(out), "--hf-text", str(hf_text)]) == 0
    rng = np.random.default_rng(0)
    corner = rng.uniform(0, 0.6, (4, 36, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(0.05, 0.4, (4, 36, 2))], axis=2)
    caps = [" ".join(rng.choice(WORDS[5:], 5)) for _ in range(20)]
    data, regions = tmp_path / "precomp", rng.standard_normal((4, 36, 12)).astype(np.float32)
    write_precomp_split(data, "test", regions, caps, boxes=boxes)
    args = ["eval", str(out), f"data.root={data}", "eval.split=test", "--out", str(tmp_path / "eval.json")]
    assert main(args) == 0
    metrics = json.loads((tmp_path / "eval.json").read_text())
    # the same recalls as the official hybrid score (shortlists 50 / 100 hold every item here)
    from patchword.eval.metrics import retrieval_metrics
    from patchword.runs import load_run

    tokenizer = load_run(out).tokenizer
    ids = [torch.tensor(tokenizer.encode(c)) for c in caps]
    boxes_t = torch.from_numpy(boxes).float()
    official = official_tgdt_scores(
        state, config, bert_config(1), torch.from_numpy(regions), ids, boxes=boxes_t, istest=True
    )
    want = retrieval_metrics(official["hybrid"], np.arange(20) // 5)
    assert metrics["images"] == 4 and metrics["rsum"] > 0
    for key in ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5", "rsum"):
        assert metrics[key] == pytest.approx(want[key]), key
    (data / "test_boxes.npy").rename(data / "moved.npy")
    assert main([*args[:-2], "--out", str(tmp_path / "eval2.json")]) == 2
    err = capsys.readouterr().err
    assert "test_boxes.npy" in err and "Traceback" not in err
    assert main([*args[:-2], "data.region_boxes=false", "--out", str(tmp_path / "eval3.json")]) == 2
    assert "data.region_boxes" in capsys.readouterr().err


def test_region_boxes_are_checked_and_appended(tmp_path):
    from patchword.data.precomp import RegionFeatures, load_region_boxes, write_precomp_split
    from patchword.errors import DataError

    feats = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    boxes = np.tile(np.array([0.1, 0.2, 0.5, 0.9], np.float32), (2, 3, 1))
    write_precomp_split(tmp_path, "dev", feats, ["a b"] * 2, boxes=boxes)
    loaded = load_region_boxes(tmp_path, "dev", feats.shape)
    batch = RegionFeatures(feats, loaded).batch(torch.tensor([1]), train=False)
    assert batch.shape == (1, 3, 6)
    assert batch[0, 2].tolist() == pytest.approx([10.0, 11.0, 0.1, 0.2, 0.5, 0.9])
    np.save(tmp_path / "dev_boxes.npy", boxes * 640)  # pixels, not normalised
    with pytest.raises(DataError, match=r"dev_boxes.npy: box coordinates range over \[64, 576\]"):
        load_region_boxes(tmp_path, "dev", feats.shape)
    np.save(tmp_path / "dev_boxes.npy", boxes[:, :2])
    with pytest.raises(DataError, match=r"expected float boxes of shape \(2, 3, 4\)"):
        load_region_boxes(tmp_path, "dev", feats.shape)
