"""An exported model directory records the sha256 of its ``model.safetensors`` (``metrics.json``
``weights_sha256``, and its card), and loading it checks that digest: safetensors keeps no checksum, so
flipped bytes inside a tensor loaded as other weights and ``eval`` exited 0."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.errors import DataError
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("export_integrity")
    args = [*TINY_RUN_32, "train.max_steps=2", f"output_dir={tmp / 'runs'}", "name=tiny"]
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(["train", *args]) == 0
        assert main(["export", str(tmp / "runs" / "tiny"), str(tmp / "export")]) == 0
    return tmp / "export"


@pytest.fixture
def export_copy(exported, tmp_path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / "export"))


def _flip_a_weight_byte(path: Path) -> None:
    """One byte inside the tensor data (after the JSON header): the file still parses."""
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header + (len(data) - header) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_export_records_the_digest_of_its_weights_file(exported):
    record = json.loads((exported / "metrics.json").read_text())
    digest = hashlib.sha256((exported / "model.safetensors").read_bytes()).hexdigest()
    assert record["weights_sha256"] == digest
    assert f"weights sha256 `{digest[:16]}`" in (exported / "README.md").read_text()


def test_flipped_bytes_in_the_exported_weights_are_refused_naming_the_file(export_copy, tmp_path, capsys):
    """Bug: eval of the damaged export exited 0 with the numbers of other weights."""
    weights = export_copy / "model.safetensors"
    _flip_a_weight_byte(weights)
    out = tmp_path / "e.json"
    assert main(["eval", str(export_copy), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {weights}: ") and "sha256" in line and "metrics.json" in line, line
    assert not out.exists()
    from patchword import create_model
    from patchword.runs import load_run

    for load in (load_run, create_model):
        with pytest.raises(DataError, match="sha256"):
            load(export_copy)


def _assert_holds_the_exported_weights(model, export: Path) -> None:
    """Every tensor of ``model`` is the export's, bit for bit (and it has no other)."""
    from safetensors.torch import load_file

    weights = load_file(export / "model.safetensors")
    state = model.state_dict()
    assert sorted(state) == sorted(weights)
    for key, value in weights.items():
        assert torch.equal(state[key], value), key


def test_an_intact_export_and_one_without_a_recorded_digest_load(export_copy):
    from patchword.runs import load_run

    _assert_holds_the_exported_weights(load_run(export_copy).model, export_copy)
    record_file = export_copy / "metrics.json"
    record = json.loads(record_file.read_text())
    del record["weights_sha256"]  # an export written before the digest was recorded
    record_file.write_text(json.dumps(record))
    _assert_holds_the_exported_weights(load_run(export_copy).model, export_copy)


def test_a_recall_recorded_as_text_is_one_error_line_before_anything_is_written(exported, tmp_path, capsys):
    """A summary.json whose rsum is a string (hand-edited, another tool's file) made the card's
    formatting raise ValueError with a traceback."""
    run = Path(shutil.copytree(exported.parent / "runs" / "tiny", tmp_path / "tiny"))
    summary = json.loads((run / "summary.json").read_text())
    summary["rsum"] = "high"
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f'error: {run / "summary.json"}: rsum is "high", not a number'
    assert not (tmp_path / "out").exists()
