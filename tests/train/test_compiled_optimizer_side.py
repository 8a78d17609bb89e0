"""The GPU experiment ``ddp_bench.py gpu-step --compile-optimizer`` (``benchmarks/ddp_bench.py``,
``CompiledOptimizerSide``: clipping, AdamW and the refreshed bfloat16 copy as one compiled function that
reads the copy's bfloat16 gradients) steps the weights as the trainer's optimizer side does, so that its
time on a GPU compares like with like. Dynamo's ``aot_eager`` backend stands in for Inductor here (the same
traced arithmetic, no C++ compiler needed); ``compiled-optimizer-check`` runs it with Inductor."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

from project_paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import ddp_bench  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_compiled_optimizer_side_steps_like_the_eager_one(monkeypatch):
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: original(fn, **{**kw, "backend": "aot_eager"}))
    args = argparse.Namespace(device="cpu", quick=True, model="seps-tiny-paper", batch=4, unfused=False)
    row = ddp_bench.compiled_optimizer_check(args)
    assert row["bf16_copies"] > 50 and row["weights"] > 10**6  # every weight of the tiny SEPS model
    # float32 rounding only: a missed clipping or a wrong learning rate would move weights by ~lr (2e-4)
    assert row["max_weight_diff"] <= 1e-6
    assert row["max_moment_diff"] <= 1e-8
