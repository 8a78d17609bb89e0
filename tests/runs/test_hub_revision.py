"""A run whose backbones are Hugging Face hub ids (``model.hf_vision``, ``model.hf_text``, and
``data.bert_vocab`` left to the text backbone's) in a local cache laid out as the hub writes it
(``models--org--name/refs/main`` naming ``snapshots/<commit>/``).

What the run reads of a hub id after it started: nothing. ``backbones.json`` holds each backbone's
architecture, the checkpoints every weight, ``bert_vocab/`` the vocabulary; so when a later download moves
``main`` to another snapshot (another config, another vocabulary), or the cache is emptied, the run resumes,
evaluates and exports exactly as before (guarded here). What it did not record: which snapshot it started
from. Old code: ``backbones.json`` named the id alone and the card said "from Hugging Face `org/vit`",
whichever revision that was; now each hub-id backbone records its snapshot's commit (``_commit_hash``) and
the card names it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import tiny_hf_laps_overrides
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

FIRST = {"org/bert": "1" * 40, "org/vit": "2" * 40}
SECOND = {"org/bert": "3" * 40, "org/vit": "4" * 40}


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


def _snapshot(cache: Path, repo: str, commit: str, source: Path) -> Path:
    """``source`` cached as snapshot ``commit`` of ``repo``, which ``main`` now names."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, folder / "snapshots" / commit)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return folder / "snapshots" / commit


def _second_snapshots(cache: Path, tmp_path: Path, words: list[str]) -> None:
    """Other tiny backbones (wider, deeper, another patch size) and the vocabulary reversed, cached as
    :data:`SECOND`: what a later download of the same ids leaves."""
    transformers = pytest.importorskip("transformers")
    bert, vit = tmp_path / "bert2", tmp_path / "vit2"
    small = {"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32, "hidden_size": 24}
    config = transformers.BertConfig(vocab_size=20, max_position_embeddings=16, **small)
    transformers.BertModel(config).save_pretrained(bert)
    (bert / "vocab.txt").write_text("\n".join(reversed(words)) + "\n")
    vit_config = transformers.ViTConfig(image_size=32, patch_size=16, **small)
    transformers.ViTModel(vit_config, add_pooling_layer=False).save_pretrained(vit)
    _snapshot(cache, "org/bert", SECOND["org/bert"], bert)
    _snapshot(cache, "org/vit", SECOND["org/vit"], vit)


def _train_from_hub(tiny_hf, laps_dataset, tmp_path: Path, cache: Path) -> tuple[Path, list[str]]:
    """The tiny BERT and ViT cached as :data:`FIRST`; a one-step LAPS run of them by hub id, its BERT
    vocabulary the text backbone's (data.bert_vocab unset)."""
    bert, vit = tiny_hf
    words = (tmp_path / "vocab20.txt").read_text().splitlines()
    (bert / "vocab.txt").write_text("\n".join(words) + "\n")
    _snapshot(cache, "org/bert", FIRST["org/bert"], bert)
    _snapshot(cache, "org/vit", FIRST["org/vit"], vit)
    local = ("data.bert_vocab=", "model.hf_text=", "model.hf_vision=")
    args = [a for a in tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path) if not a.startswith(local)]
    args += ["model.hf_text=org/bert", "model.hf_vision=org/vit", "data.dense=false", "train.max_steps=1"]
    args += ["train.eval_every=0", f"output_dir={tmp_path / 'runs'}", "name=run"]
    assert main(["train", *args]) == 0
    return tmp_path / "runs" / "run", words


def _metrics(path: Path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k.startswith(("i2t_", "t2i_", "rsum"))}


def test_a_run_records_the_snapshot_commit_of_each_hub_id_and_its_card_names_it(
    tiny_hf, laps_dataset, tmp_path, hub
):
    run, _ = _train_from_hub(tiny_hf, laps_dataset, tmp_path, hub)
    backbones = json.loads((run / "backbones.json").read_text())
    assert backbones["vision"]["_commit_hash"] == FIRST["org/vit"]
    assert backbones["text"]["_commit_hash"] == FIRST["org/bert"]
    assert backbones["vision"]["_name_or_path"] == "org/vit"  # the id, as config.yaml keeps it
    assert "org/vit" in (run / "config.yaml").read_text()
    _second_snapshots(hub, tmp_path, (tmp_path / "vocab20.txt").read_text().splitlines())
    assert main(["export", str(run), str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    for repo, key in (("org/vit", "model.hf_vision"), ("org/bert", "model.hf_text")):
        expected = f"from Hugging Face `{repo}` at revision `{FIRST[repo]}` ({key})"
        assert expected in card, card
    exported = json.loads((tmp_path / "export" / "backbones.json").read_text())
    assert exported["vision"]["_commit_hash"] == FIRST["org/vit"]


def test_a_local_directory_records_no_commit(tiny_hf, laps_dataset, tmp_path, hub):
    """Local backbone directories: ``backbones.json`` as before."""
    bert, vit = tiny_hf
    (bert / "vocab.txt").write_text((tmp_path / "vocab20.txt").read_text())
    args = [*tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), "data.dense=false", "train.max_steps=1"]
    args += ["train.eval_every=0", f"output_dir={tmp_path / 'runs'}", "name=local"]
    assert main(["train", *args]) == 0
    backbones = json.loads((tmp_path / "runs" / "local" / "backbones.json").read_text())
    assert backbones["vision"]["_name_or_path"] == str(vit)
    assert "_commit_hash" not in backbones["vision"] and "_commit_hash" not in backbones["text"]


def test_a_moved_or_emptied_cache_changes_nothing_a_run_loads(tiny_hf, laps_dataset, tmp_path, hub, capsys):
    """A guard (old code passes it too): resume, eval, export and the export's eval read no hub id."""
    run, words = _train_from_hub(tiny_hf, laps_dataset, tmp_path, hub)
    assert main(["eval", str(run), "--out", str(tmp_path / "before.json")]) == 0
    _second_snapshots(hub, tmp_path, words)
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(tmp_path / "moved.json")]) == 0, capsys.readouterr().err
    assert _metrics(tmp_path / "moved.json") == _metrics(tmp_path / "before.json")
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    assert main(["export", str(run), str(tmp_path / "export")]) == 0, capsys.readouterr().err
    assert (tmp_path / "export" / "bert_vocab" / "vocab.txt").read_text().splitlines() == words
    shutil.rmtree(hub)
    for source, out in ((run, "run.json"), (tmp_path / "export", "export.json")):
        assert main(["eval", str(source), "--out", str(tmp_path / out)]) == 0, capsys.readouterr().err
    assert _metrics(tmp_path / "run.json") == _metrics(tmp_path / "export.json")


def test_hub_revision_names_the_snapshot_main_points_at(tiny_hf, tmp_path, hub):
    pytest.importorskip("transformers")
    from patchword.hub import hub_revision

    bert, _ = tiny_hf
    assert hub_revision("org/bert") is None  # nothing cached
    _snapshot(hub, "org/bert", FIRST["org/bert"], bert)
    assert hub_revision("org/bert") == FIRST["org/bert"]
    _snapshot(hub, "org/bert", SECOND["org/bert"], bert)
    assert hub_revision("org/bert") == SECOND["org/bert"]
    assert hub_revision(str(bert)) is None  # a local directory
    assert hub_revision(None) is None
