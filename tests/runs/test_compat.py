"""Old run directories and exports still load and score the same: a tiny run and its export written by
f715cbc (``tests/data/compat_f715cbc``, made by ``benchmarks/compat_fixture.py``), loaded by today's code."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from patchword.cli import main
from project_paths import BENCHMARKS, TEST_DATA

FIXTURE = TEST_DATA / "compat_f715cbc"
sys.path.insert(0, str(BENCHMARKS))
from compat_fixture import score  # noqa: E402  (the same inputs the old version scored)

KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "i2t_medr", "t2i_medr")


@pytest.mark.parametrize("kind", ["run", "export"])
def test_a_run_and_an_export_from_f715cbc_score_as_they_did(kind):
    recorded = torch.load(FIXTURE / "scores.pt", weights_only=True)[kind]
    assert recorded.shape == (4, 6)
    # the same kernels in another order (the engine and the encoders changed since): float32 rounding only
    assert torch.allclose(score(FIXTURE / kind), recorded, rtol=0, atol=1e-6)


def test_a_run_from_f715cbc_evaluates_to_its_recorded_recalls(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run)
    out = tmp_path / "eval.json"
    assert main(["eval", str(run), "--out", str(out), f"data.cache_dir={tmp_path / 'cache'}"]) == 0
    recorded = json.loads((FIXTURE / "eval.json").read_text())
    evaluated = json.loads(out.read_text())
    assert {k: evaluated[k] for k in KEYS} == {k: recorded[k] for k in KEYS}
