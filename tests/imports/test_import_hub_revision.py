"""An imported run whose ``--hf-vision`` / ``--hf-text`` are Hugging Face hub ids (in a local cache laid out
as the hub writes it: ``models--org--name/refs/main`` naming ``snapshots/<commit>/``) records in its
``backbones.json`` the commit of the snapshot each architecture was read from (``_commit_hash``), as a
trained run's does. Old code: the import wrote the architectures without it, so the run named the id alone,
whichever revision ``main`` pointed at then."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers  # a dev dependency: a missing one fails collection, never skips

from patchword.imports import ImportOptions, import_checkpoint
from patchword.runs import load_run
from patchword.testing.official_seps import BERT, VIT, VOCAB, official_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

COMMITS = {"org/vit": "a" * 40, "org/bert": "b" * 40}


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache of this test, offline, read by transformers and huggingface_hub."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def hf_dirs(tmp_path) -> dict[str, Path]:
    """The tiny ViT and BERT (with its ``vocab.txt``) of the official SEPS checkpoints, as directories."""
    torch.manual_seed(0)
    vit, bert = tmp_path / "vit", tmp_path / "bert"
    transformers.ViTModel(transformers.ViTConfig(**VIT), add_pooling_layer=False).save_pretrained(vit)
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(bert)
    (bert / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return {"org/vit": vit, "org/bert": bert}


def _cache(cache: Path, repo: str, commit: str, source: Path) -> None:
    """``source`` cached as snapshot ``commit`` of ``repo``, which ``main`` names."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)


def _import(tmp_path: Path, vision: str, text: str, name: str) -> Path:
    path = tmp_path / "model_best.pth"
    torch.save(official_checkpoint("vit", embed=24), path)
    options = ImportOptions(hf_vision=vision, hf_text=text, dense_pairing="image")
    import_checkpoint(path, tmp_path / name, family_name="seps", options=options)
    return tmp_path / name


def test_an_import_from_hub_ids_records_the_snapshot_commit_of_each(tmp_path, hub, hf_dirs):
    for repo, commit in COMMITS.items():
        _cache(hub, repo, commit, hf_dirs[repo])
    run = _import(tmp_path, "org/vit", "org/bert", "run")
    backbones = json.loads((run / "backbones.json").read_text())
    assert backbones["vision"]["_commit_hash"] == COMMITS["org/vit"]
    assert backbones["text"]["_commit_hash"] == COMMITS["org/bert"]
    assert backbones["vision"]["_name_or_path"] == "org/vit"
    loaded = load_run(run)  # the recorded commit is no argument of the architecture rebuilt from it
    assert loaded.model.image_encoder.backbone.config.hidden_size == VIT["hidden_size"]


def test_an_import_from_local_directories_records_no_commit(tmp_path, hub, hf_dirs):
    run = _import(tmp_path, str(hf_dirs["org/vit"]), str(hf_dirs["org/bert"]), "local")
    backbones = json.loads((run / "backbones.json").read_text())
    assert "_commit_hash" not in backbones["vision"] and "_commit_hash" not in backbones["text"]
