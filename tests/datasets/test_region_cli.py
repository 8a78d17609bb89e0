"""CLI smoke tests of the region-feature family: ``patchword train`` / ``patchword eval`` for SCAN, NAAF and
TGDT from their synthetic presets (shrunk to CI size), the SCAN-layout dataset, and ensembles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from patchword.data.precomp import write_precomp_split
from patchword.data.synthetic import SyntheticConfig, SyntheticScenes
from patchword.data.synthetic.regions import RegionFeatureConfig, synthetic_region_split
from project_paths import ROOT

CONFIGS = ROOT / "configs"

# The synthetic regions of TINY, which region features read from files (precomp) take none of.
TINY_SCENES = [
    "data.num_train=24",
    "data.num_dev=8",
    "data.num_test=8",
    "data.synthetic_image_size=16",
    "data.num_regions=14",
    "data.region_dim=16",
]
# Shrinks any synthetic region preset to a few seconds of CPU.
TINY = [
    *TINY_SCENES,
    "model.embed_dim=16",
    "model.precomp.region_dim=16",
    "model.precomp.num_regions=14",
    "model.gru.word_dim=8",
    "train.batch_size=12",
    "train.epochs=2",
    "train.log_every=1",
    "train.num_threads=1",
]
TINY_CONTEXT = [
    "model.precomp.context.heads=2",
    "model.precomp.context.ffn_dim=16",
    "model.text_context.heads=2",
    "model.text_context.ffn_dim=16",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _train(tmp_path, cache, preset, name, *extra):
    tiny = TINY if "synthetic" in preset else [a for a in TINY if a not in TINY_SCENES]
    args = [
        "train",
        "--config",
        str(CONFIGS / preset),
        *tiny,
        f"output_dir={tmp_path}",
        f"name={name}",
        f"data.cache_dir={cache}",
        *extra,
    ]
    assert main(args) == 0
    return tmp_path / name


@pytest.mark.parametrize("method", ["scan", "naaf", "tgdt"])
def test_train_then_eval_from_the_synthetic_preset(tmp_path, cache, method, monkeypatch, capsys):
    extra = TINY_CONTEXT if method == "tgdt" else []
    run = _train(tmp_path, cache, f"{method}_synthetic.yaml", method, *extra)
    for name in ("config.yaml", "vocab.json", "best.pt", "last.pt", "metrics.json", "summary.json"):
        assert (run / name).is_file(), name
    trained = json.loads((run / "metrics.json").read_text())
    assert 0 <= trained["rsum"] <= 600 and trained["oracle_rsum"] > 300
    assert main(["eval", str(run)]) == 0
    evaluated = json.loads((run / "eval_test.json").read_text())
    assert evaluated["rsum"] == pytest.approx(trained["rsum"])  # the checkpoint reproduces its metrics
    state = load_checkpoint(run / "best.pt")["model"]
    if method == "naaf":
        # the learned thresholds travel with the checkpoint
        assert state["matcher.threshold"].dtype == torch.float64 and "matcher.threshold_safe" in state
    if method == "tgdt":
        # hybrid two-stage evaluation: shortlist sizes and the share of ground truths it missed
        assert trained["shortlist_i2t"] == 40 and trained["shortlist_t2i"] == 8  # capped at the candidates
        assert 0 <= trained["shortlist_miss_i2t"] <= 100 and "matcher.threshold" not in state
        assert (
            main(
                [
                    "eval",
                    str(run),
                    "model.tgdt.inference=local",  # overrides go before the options
                    "--out",
                    str(tmp_path / "local.json"),
                ]
            )
            == 0
        )
        assert "shortlist_i2t" not in json.loads((tmp_path / "local.json").read_text())
        # COCO 1K protocol: every fold runs its own two-stage search. The 8-image test split is no COCO
        # 5K (refused before scoring), so the folds are shrunk to 4 x 2 images for the test.
        assert main(["eval", str(run), "eval.coco_1k=true", "--out", str(tmp_path / "folds.json")]) == 2
        assert "data.test_split=testall" in capsys.readouterr().err
        import patchword.eval.protocol as protocol

        monkeypatch.setattr(protocol, "COCO_FOLDS", 4)
        monkeypatch.setattr(protocol, "COCO_FOLD_IMAGES", 2)
        assert main(["eval", str(run), "eval.coco_1k=true", "--out", str(tmp_path / "folds.json")]) == 0
        folds = json.loads((tmp_path / "folds.json").read_text())
        assert 0 <= folds["coco1k_rsum"] <= 600 and "coco1k_shortlist_miss_t2i" in folds


def _scan_layout(root: Path, cache: Path) -> None:
    """The tiny synthetic region splits written in the SCAN layout."""
    syn = SyntheticConfig(num_train=24, num_dev=8, num_test=8, image_size=16)
    ds = SyntheticScenes.load_or_generate(syn, cache_dir=cache)
    rcfg = RegionFeatureConfig(num_regions=14, dim=16)
    for name in ("train", "dev", "test"):
        split = synthetic_region_split(ds.split(name), ds[name].scenes, rcfg, num_shapes=5, num_colours=8)
        write_precomp_split(root, name, split.images, split.captions)


def test_precomp_dataset_and_similarity_ensembles(tmp_path, cache, capsys, monkeypatch):
    root = tmp_path / "f30k_precomp"
    _scan_layout(root, cache)
    # the SCAN-layout preset (its synthetic twin sets the scenes' keys, which precomp reads none of) with
    # the tiny region model of the synthetic one
    common = [f"data.root={root}", "data.vocab_min_count=1", "model.name=scan-tiny-regions"]
    t2i = _train(tmp_path, cache, "scan_t2i_f30k.yaml", "t2i", *common)
    i2t = _train(
        tmp_path,
        cache,
        "scan_t2i_f30k.yaml",
        "i2t",
        *common,
        "model.scan.direction=i2t",
        "model.scan.lambda_softmax=4.0",
        "model.scan.agg=mean",
    )
    single = json.loads((t2i / "metrics.json").read_text())
    # the same weights twice are not an ensemble: refused (the same checkpoint, or a copy in other bytes)
    out = tmp_path / "self.json"
    assert main(["eval", str(t2i), "--ensemble", str(t2i / "best.pt"), "--out", str(out)]) == 2
    assert "--ensemble" in capsys.readouterr().err and not out.exists()
    again = Path(shutil.copytree(t2i, tmp_path / "again"))
    state = torch.load(again / "best.pt", weights_only=False)
    torch.save({**state, "copied": True}, again / "best.pt")
    assert main(["eval", str(t2i), "--ensemble", str(again / "best.pt"), "--out", str(out)]) == 2
    assert "the same model weights" in capsys.readouterr().err and not out.exists()
    # with that refusal lifted, the average of a model with itself is the model: the averaging is exact
    monkeypatch.setattr("patchword.runs.evaluate.refuse_repeated_members", lambda checkpoints: None)
    assert main(["eval", str(t2i), "--ensemble", str(again / "best.pt"), "--out", str(out)]) == 0
    same = json.loads(out.read_text())
    assert same["rsum"] == pytest.approx(single["rsum"]) and len(same["ensemble"]) == 2
    # t2i + i2t: the averaged similarity matrix (SCAN's best F30K result is such a pair)
    assert main(["eval", str(t2i), "--ensemble", str(i2t)]) == 0
    pair = json.loads((t2i / "eval_test_ensemble.json").read_text())
    assert [m["checkpoint"] for m in pair["ensemble"]] == [str(t2i / "best.pt"), str(i2t / "best.pt")]
    assert 0 <= pair["rsum"] <= 600 and "sims" not in pair


def test_mismatched_encoder_and_data_is_a_clear_error(tmp_path, cache, capsys):
    args = [
        "train",
        "--config",
        str(CONFIGS / "scan_synthetic.yaml"),
        *TINY,
        f"output_dir={tmp_path}",
        f"data.cache_dir={cache}",
        "model.image_encoder=tiny",
    ]
    assert main(args) == 2
    assert "model.image_encoder=precomp" in capsys.readouterr().err
    assert main([*args[:-1], "model.precomp.region_dim=32"]) == 2
    assert "model.precomp.region_dim=32" in capsys.readouterr().err


def test_presets_for_real_data_parse(tmp_path):
    from patchword.config import load_config
    from patchword.runs.config import RunConfig

    for name in ("scan_t2i_f30k", "scan_i2t_f30k", "naaf_f30k", "tgdt_f30k"):
        cfg = load_config(RunConfig, CONFIGS / f"{name}.yaml")
        assert cfg.data.dataset == "precomp" and cfg.model.image_encoder == "precomp"
        assert cfg.model.matcher in ("scan", "naaf", "tgdt")
    assert np.isclose(load_config(RunConfig, CONFIGS / "naaf_f30k.yaml").model.naaf.lambda_softmax, 20)


def test_data_check_says_region_features_read_no_dense_text(capsys):
    """With a matcher that reads dense captions, `data check` on region features printed dense 0/20 (as if
    every caption were missing), though training reads none for region datasets."""
    from conftest import TINY_REGIONS

    assert main(["data", "check", *TINY_REGIONS, "model.matcher=seps"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("role "))
    rows = [line.split() for line in lines[header + 1 : header + 4]]
    assert [row[0] for row in rows] == ["train", "dev", "test"]
    assert all(" ".join(row[5:7]) == "not read" for row in rows)
