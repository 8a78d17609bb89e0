"""``train_hashing`` / ``resume_hashing`` leave the caller's global random generators as they found them.

Bug: training seeded Python's ``random``, numpy's global generator and torch's with ``train.seed``
(``seed_everything``) and left them so: a caller's ``seed; train_hashing(cfg); draw`` drew what the run's
seed gives, not what its own seed gives, while docs/hashing.md promises that the library functions never
change process-wide settings. The run itself is seeded as before: its results do not depend on the caller's
generators.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY_HASH
from patchword.config import apply_overrides
from patchword.hashing import HashRunConfig, resume_hashing, train_hashing

pytestmark = pytest.mark.usefixtures("one_thread")


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002
    torch.manual_seed(seed)


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()  # noqa: NPY002


def _eval(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "eval.json").read_text())


def test_training_and_resuming_leave_the_callers_generators_as_they_were(tmp_path):
    _seed(11)
    want = _draws()
    cfg = apply_overrides(
        HashRunConfig(), [*TINY_HASH, "model.bits=16", "train.epochs=1", f"output_dir={tmp_path}", "name=r"]
    )
    _seed(11)
    summary = train_hashing(cfg)
    assert _draws() == want  # was the draws of train.seed's generators, advanced by the run
    _seed(11)
    resume_hashing(summary["run_dir"], ["train.epochs=2"])
    assert _draws() == want
    # the run does not depend on the caller's generators: another caller's seed, the same run
    _seed(12345)
    again = train_hashing(apply_overrides(cfg, ["name=again"]))
    assert _eval(summary["run_dir"])["checkpoint"]["epoch"] == 2
    metrics = ("i2t_map@50", "t2i_map@50", "i2t_p@5", "t2i_p@5")
    assert [again[k] for k in metrics] == [summary[k] for k in metrics]
