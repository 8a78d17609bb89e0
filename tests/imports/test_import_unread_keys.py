"""``patchword import`` refuses an override no evaluation of the imported run reads, as ``patchword eval``
refuses it (the same :data:`~patchword.runs.config.NOT_EVALUATION_KEYS`), and an imported SCAN / NAAF
run's config says the word split its saved vocabulary tokenises with."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_import_scan_naaf import (
    GLOVE_SPECIALS,
    SCAN_SPECIALS,
    naaf_opt,
    nothing_written,
    official_checkpoint,
    scan_opt,
    vocab_words,
    write_json_vocab,
)

from conftest import one_error_line
from patchword.cli import main
from patchword.config import flat_config
from patchword.errors import ConfigError
from patchword.imports import ImportOptions, import_checkpoint
from patchword.runs import VOCAB_FILE, RunConfig, load_run, read_run_config
from patchword.runs.config import NOT_EVALUATION_KEYS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def scan_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan")
    torch.save(official_checkpoint(scan_opt()), root / "model_best.pth.tar")
    return root / "model_best.pth.tar", write_json_vocab(root / "vocab.json", vocab_words(SCAN_SPECIALS))


def _leaf_override(refused: str) -> str:
    """``KEY=VALUE`` setting the first run-config key at or under ``refused`` to its default value:
    refused by its name, whatever the value (as ``patchword eval`` refuses it)."""
    key, value = next(
        (k, v) for k, v in flat_config(RunConfig()).items() if k == refused or k.startswith(refused + ".")
    )
    return f"{key}={json.dumps(value)}"


@pytest.mark.parametrize("refused", sorted(NOT_EVALUATION_KEYS))
def test_every_key_eval_refuses_is_refused_on_import(scan_files, tmp_path, refused):
    """Old code imported them all (exit 0), stored them in config.yaml and listed them as applied."""
    ckpt, vocab = scan_files
    override = _leaf_override(refused)
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(ckpt, out, options=ImportOptions(vocab=str(vocab), overrides=[override]))
    assert caught.value.key == override.split("=", 1)[0]
    assert f"(`patchword eval` refuses it too: {NOT_EVALUATION_KEYS[refused]})" in str(caught.value)
    nothing_written(out)


@pytest.mark.parametrize("precision", ["amp_bf16", "amp_fp16", "bf16"])
def test_a_precision_eval_refuses_is_refused_on_import(scan_files, tmp_path, precision):
    """Old code stored precision=amp_bf16 in the imported run's config.yaml (eval refused it only as its own
    override), so every evaluation of the run listed a precision it never ran."""
    ckpt, vocab = scan_files
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(
            ckpt, out, options=ImportOptions(vocab=str(vocab), overrides=[f"precision={precision}"])
        )
    assert caught.value.key == "precision"
    assert f"(`patchword eval` refuses it too: precision={precision}: evaluation runs no autocast" in str(
        caught.value
    )
    nothing_written(out)


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.word_split=unicode", "data.word_split"),
        ("data.vocab_min_count=1", "data.vocab_min_count"),
        ("data.vocab_path=/nonexistent", "data.vocab_path"),
        ("seed=7", "seed"),
        ("name=other", "name"),
        ("output_dir=/nonexistent", "output_dir"),
        ("train.lr=5", "train.lr"),
        ("data={word_split: unicode}", "data.word_split"),  # a key set inside a section's mapping
    ],
)
def test_the_cli_refuses_an_unread_key_in_one_line_writing_nothing(
    scan_files, tmp_path, capsys, override, key
):
    """The reviewer's command: exit 0 and every key listed as an applied override; the run's config.yaml
    said word_split unicode while its vocab.json (the one that tokenises) said treebank."""
    ckpt, vocab = scan_files
    out = tmp_path / "runs" / "x4"
    argv = ["import", str(ckpt), "--out", str(out), "--vocab", str(vocab), "data.root=elsewhere", override]
    assert main(argv) == 2
    printed = capsys.readouterr()
    assert one_error_line(printed.err).startswith(f"error: {key}: an imported run never reads it")
    assert printed.out == ""
    nothing_written(out)


def test_where_the_data_lies_and_eval_keys_are_still_applied(scan_files, tmp_path):
    ckpt, vocab = scan_files
    overrides = ["data.root=elsewhere", "eval.split=dev"]
    import_checkpoint(ckpt, tmp_path / "run", options=ImportOptions(vocab=str(vocab), overrides=overrides))
    cfg = read_run_config(tmp_path / "run")
    assert (cfg.data.root, cfg.eval.split) == (os.path.abspath("elsewhere"), "dev")  # recorded absolute


@pytest.mark.parametrize("name", ["scan", "naaf"])
def test_an_imported_word_run_config_says_the_split_its_vocabulary_tokenises_with(tmp_path, name):
    """Old code: config.yaml said data.word_split alnum (the default) beside a vocab.json saying treebank,
    the rule that tokenises (reports and gallery identities read the config's)."""
    if name == "scan":
        ckpt, words, scan_style = official_checkpoint(scan_opt()), vocab_words(SCAN_SPECIALS), True
    else:
        ckpt, words, scan_style = official_checkpoint(naaf_opt()), vocab_words(GLOVE_SPECIALS), False
    torch.save(ckpt, tmp_path / "ckpt.pth.tar")
    vocab = write_json_vocab(tmp_path / "vocab.json", words, scan_style=scan_style)
    out = tmp_path / "run"
    import_checkpoint(tmp_path / "ckpt.pth.tar", out, options=ImportOptions(vocab=str(vocab)))
    saved_split = json.loads((out / VOCAB_FILE).read_text())["split"]
    loaded = load_run(out)
    assert saved_split == loaded.tokenizer.split == "treebank"
    assert read_run_config(out).data.word_split == "treebank"
    assert read_run_config(out).data.vocab_path == ""  # the run's own vocab.json is what loads
