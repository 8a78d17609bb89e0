"""A UCMFH checkpoint whose file name states other bits than its hash heads: the tensors decide, and the
import says so (old code: silent, import.json recording ``bits_in_name: 64`` beside ``model.bits: 16``)."""

from __future__ import annotations

import logging

import pytest
import torch

from patchword.imports import import_checkpoint
from patchword.testing.official_ucmfh import official_ucmfh_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def write_hash(tmp_path, name, bits=16):
    path = tmp_path / name
    torch.save(official_ucmfh_checkpoint(16, bits, layers=1, ffn_dim=32, hidden=32, seed=1), path)
    return path


def test_bits_in_the_name_that_the_heads_contradict_are_a_warning(tmp_path, caplog):
    path = write_hash(tmp_path, "mirflickr_hash_64.pth")
    with caplog.at_level(logging.WARNING, logger="patchword.imports.ucmfh"):
        record = import_checkpoint(path, tmp_path / "run")
    assert record["metadata"]["bits_in_name"] == 64
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "mirflickr_hash_64.pth" in warned[0] and "64 bits" in warned[0] and "model.bits=16" in warned[0]
    assert "bits: 16" in (tmp_path / "run" / "config.yaml").read_text()


@pytest.mark.parametrize("name", ["mirflickr_hash_16.pth", "checkpoint.pth"])
def test_a_matching_or_silent_name_warns_of_nothing(tmp_path, caplog, name):
    with caplog.at_level(logging.WARNING, logger="patchword.imports.ucmfh"):
        import_checkpoint(write_hash(tmp_path, name), tmp_path / "run")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
