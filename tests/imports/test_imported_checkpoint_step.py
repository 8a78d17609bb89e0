"""An imported official checkpoint was trained elsewhere: its ``best.pt`` records no training step (an
import wrote step 0, which every evaluation then recorded as ``checkpoint_step`` 0 and ``patchword report``
showed as "checkpoint step 0": saved before any training), and ``import.json`` keeps the official
iteration count where the checkpoint had one."""

from __future__ import annotations

import json

import pytest
import torch
from test_import_published_comparison import T_I_AVG, import_scan

from patchword.runs.recorded import checkpoint_facts, checkpoint_identity

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_imported_checkpoint_records_no_training_step(tmp_path):
    run = import_scan(tmp_path, "scan", **T_I_AVG)
    for name in ("best.pt", "last.pt"):
        assert "step" not in torch.load(run / name, weights_only=True)
    assert "step" not in checkpoint_facts(run / "best.pt")
    assert checkpoint_identity(run / "best.pt")["checkpoint_step"] is None  # what `patchword eval` records
    assert "metadata" in json.loads((run / "import.json").read_text())
