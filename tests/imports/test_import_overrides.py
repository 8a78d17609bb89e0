"""Overrides given to ``patchword import``: a key the checkpoint decides is refused naming it (nothing
written), the others are applied, logged and recorded in ``import.json``."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.imports import IMPORT_FILE, ImportOptions, import_checkpoint
from patchword.imports.base import family
from patchword.runs import load_run
from patchword.testing.official_seps import official_checkpoint, write_tiny_backbones

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def seps_files(tmp_path_factory):
    """An official SEPS ViT checkpoint (opt.max_word 90, img_res 32), tiny ``vit`` / ``bert`` directories."""
    root = tmp_path_factory.mktemp("seps")
    write_tiny_backbones(root)
    torch.save(official_checkpoint("vit", embed=24), root / "model_best.pth")
    return root


def _options(root, overrides) -> ImportOptions:
    return ImportOptions(hf_vision=str(root / "vit"), hf_text=str(root / "bert"), overrides=overrides)


@pytest.mark.parametrize(
    "override",
    [
        "data.max_caption_len=5",  # the checkpoint's opt.max_word (capped by BERT's positions): 64
        "data.max_dense_len=5",
        "data.dense=false",  # a SEPS checkpoint reads dense text
        "data.tokenizer=word",  # f715cbc imported "successfully"; load_run then failed: vocab.json is missing
        "data.bert_vocab=bert-base-uncased",
        "data.image_size=64",  # opt.img_res is 32
        "data.size_augment=false",  # opt.size_augment is 1
    ],
)
def test_import_refuses_data_overrides_that_contradict_the_checkpoint(seps_files, tmp_path, override):
    """f715cbc wrote these runs without a word (model.* overrides alone were refused): a model fed other
    tokens, text lengths, images or no dense text than its checkpoint's computes something else."""
    key = override.split("=", 1)[0]
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(
            seps_files / "model_best.pth", out, family_name="seps", options=_options(seps_files, [override])
        )
    assert caught.value.key == key and "contradicts the seps checkpoint" in str(caught.value)
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_import_cli_names_the_refused_data_key_in_one_line(seps_files, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["import", str(seps_files / "model_best.pth"), "--out", str(out), "--family", "seps"]
    argv += [
        "--hf-vision",
        str(seps_files / "vit"),
        "--hf-text",
        str(seps_files / "bert"),
        "data.tokenizer=word",
    ]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        "error: data.tokenizer: 'word' contradicts the seps checkpoint, which implies 'bert'"
    )
    assert not out.exists()


def test_import_records_and_logs_the_overrides_it_applies(seps_files, tmp_path, caplog):
    """f715cbc's import.json had no trace of the overrides that shaped the run's config."""
    overrides = [
        "data.root=elsewhere",
        "eval.coco_1k=true",
        "data.tokenizer=bert",
    ]  # the last changes nothing
    with caplog.at_level(logging.INFO, logger="patchword.imports"):
        import_checkpoint(
            seps_files / "model_best.pth",
            tmp_path / "run",
            family_name="seps",
            options=_options(seps_files, overrides),
        )
    record = json.loads((tmp_path / "run" / IMPORT_FILE).read_text())
    assert record["overrides"] == overrides
    assert any(
        "overrides applied on import" in r.getMessage() and "data.root=elsewhere" in r.getMessage()
        for r in caplog.records
    )
    cfg = load_run(tmp_path / "run").config
    # recorded absolute, as a trained run records its paths: the run evaluates from any directory
    assert (cfg.data.root, cfg.eval.coco_1k, cfg.data.tokenizer) == (
        os.path.abspath("elsewhere"),
        True,
        "bert",
    )
    # without overrides the field says so
    import_checkpoint(
        seps_files / "model_best.pth",
        tmp_path / "plain",
        family_name="seps",
        options=_options(seps_files, []),
    )
    assert json.loads((tmp_path / "plain" / IMPORT_FILE).read_text())["overrides"] == []


@pytest.mark.parametrize("name", ["seps", "laps", "scan", "naaf", "tgdt"])
def test_every_retrieval_family_declares_its_tokenizer_and_text_length_decided_by_the_checkpoint(name):
    """Each importer builds the tokenizer (BERT files or the --vocab words) and caps the text the way the
    official code reads it: those keys are the checkpoint's, whatever the family."""
    assert {"data.tokenizer", "data.max_caption_len", "data.dense"} <= set(family(name).determines)
