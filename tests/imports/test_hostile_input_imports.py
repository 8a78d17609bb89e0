"""Hostile inputs to ``patchword import``: values every later evaluation refuses, keys no evaluation of an
imported hashing run reads, and checkpoints whose weights are not finite are refused before anything is
written, naming the key or the tensor (old code imported each of them and exited 0)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_import_scan_naaf import SCAN_SPECIALS, official_checkpoint, scan_opt, vocab_words, write_json_vocab

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError, DataError
from patchword.imports import ImportOptions, import_checkpoint
from patchword.runs import read_run_config
from patchword.testing.official_ucmfh import official_ucmfh_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def scan_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan")
    torch.save(official_checkpoint(scan_opt()), root / "model_best.pth.tar")
    return root / "model_best.pth.tar", write_json_vocab(root / "vocab.json", vocab_words(SCAN_SPECIALS))


def _ucmfh(tmp_path, change=None):
    ckpt = official_ucmfh_checkpoint(16, 16, layers=2, ffn_dim=64, hidden=64, seed=1)
    if change is not None:
        ckpt = copy.deepcopy(ckpt)
        change(ckpt)
    path = tmp_path / "mirflickr_hash_16.pth"
    torch.save(ckpt, path)
    return path


def _nothing_written(parent):
    assert not parent.exists() or list(parent.iterdir()) == []


@pytest.mark.parametrize(
    "override, key, said",
    [
        ("eval.max_memory_mb=-1", "eval.max_memory_mb", "must be >= 0, got -1"),
        ("eval.batch_size=0", "eval.batch_size", "must be >= 1, got 0"),
        ("eval.split=val", "eval.split", "must be test or dev"),
        ("eval.precision=tf32", "eval.precision", "the scan scoring engine computes in fp32 only"),
        ("device=gpu", "device", "must be auto, cpu, cuda, cuda:N or mps"),
    ],
)
def test_a_value_every_evaluation_refuses_is_refused_on_import(
    scan_files, tmp_path, capsys, override, key, said
):
    """Old code stored it in config.yaml (exit 0) and every `patchword eval` of the run failed."""
    ckpt, vocab = scan_files
    out = tmp_path / "runs" / "s1"
    assert main(["import", str(ckpt), "--out", str(out), "--vocab", str(vocab), override]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {key}: ") and said in line, line
    _nothing_written(tmp_path / "runs")


def test_evaluation_values_in_range_are_imported_and_the_device_is_the_evaluating_machines(
    scan_files, tmp_path
):
    """A device this machine lacks (cuda on a CPU-only one) is the machine evaluating the run's to have."""
    ckpt, vocab = scan_files
    out = tmp_path / "s1"
    overrides = ["eval.batch_size=7", "eval.max_memory_mb=0", "device=cuda"]
    import_checkpoint(ckpt, out, options=ImportOptions(vocab=str(vocab), overrides=overrides))
    cfg = read_run_config(out)
    assert (cfg.eval.batch_size, cfg.eval.max_memory_mb, cfg.device) == (7, 0, "cuda")


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.epochs=3", "train.epochs"),
        ("train.seed=4", "train.seed"),
        ("train={epochs: 3}", "train"),
        ("name=other", "name"),
        ("output_dir=elsewhere", "output_dir"),
    ],
)
def test_a_hashing_import_refuses_keys_no_evaluation_reads(tmp_path, override, key):
    """Old code stored train.* (the seed included) in the imported run's config.yaml and listed them as
    applied (name and output_dir were silently replaced by --out's)."""
    path = _ucmfh(tmp_path)
    out = tmp_path / "runs" / "u"
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(path, out, options=ImportOptions(overrides=[override]))
    assert caught.value.key == key and "an imported hashing run never reads it" in str(caught.value)
    _nothing_written(tmp_path / "runs")


def test_a_hashing_import_takes_data_eval_and_device_overrides(tmp_path):
    from patchword.config import load_config
    from patchword.hashing.config import HashRunConfig

    out = tmp_path / "u"
    overrides = ["data.num_query=5", "eval.topk=7", "device=cpu"]
    record = import_checkpoint(_ucmfh(tmp_path), out, options=ImportOptions(overrides=overrides))
    assert record["overrides"] == overrides
    cfg = load_config(HashRunConfig, out / "config.yaml")
    assert (cfg.data.num_query, cfg.eval.topk) == (5, 7)


def _nan_fc1(ckpt):
    ckpt["ImageMlp"]["fc1.weight"][3, 2] = float("nan")


def test_a_hashing_checkpoint_with_nan_weights_is_refused_naming_the_tensor(tmp_path, capsys):
    """Old code imported it (exit 0) and `hash eval` evaluated codes of NaN features without a word."""
    path = _ucmfh(tmp_path, _nan_fc1)
    out = tmp_path / "runs" / "u"
    assert main(["import", str(path), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {path}: image_head.fc1.weight holds 1 NaN or infinite value(s) of 1024: a diverged or "
        "damaged checkpoint; import one whose weights are finite"
    )
    _nothing_written(tmp_path / "runs")


def test_a_retrieval_checkpoint_with_an_infinite_weight_is_refused_naming_the_tensor(tmp_path):
    ckpt = official_checkpoint(scan_opt())
    ckpt["model"][0]["fc.bias"][5] = float("inf")
    path = tmp_path / "model_best.pth.tar"
    torch.save(ckpt, path)
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    out = tmp_path / "runs" / "s"
    with pytest.raises(
        DataError, match=r"image_encoder\.proj\.bias holds 1 NaN or infinite value\(s\) of 16"
    ):
        import_checkpoint(path, out, options=ImportOptions(vocab=str(vocab)))
    _nothing_written(tmp_path / "runs")
