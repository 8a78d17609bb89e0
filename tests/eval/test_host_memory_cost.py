"""The host memory an evaluation records: its own peak (``peak_host_growth_mb``, over the resident set at its
start, ``host_rss_start_mb``), the same whatever the process held before it; ``peak_host_rss_mb`` stays
the process's mark (a training process holds far more than a fresh ``patchword eval``: the same checkpoint
showed 347.5 MiB in summary.json and 262.3 MiB in eval_test.json, in one "peak host MiB" column)."""

from __future__ import annotations

import sys

import pytest

from patchword.data.prepare import eval_role, prepare_data
from patchword.device import reset_peak_host_rss
from patchword.eval.config import EvalConfig
from patchword.eval.protocol import evaluate, evaluation_cost
from patchword.runs import load_run

pytestmark = pytest.mark.usefixtures("one_thread")

HELD_MB = 300  # resident before the evaluation and all through it (a training process's state)


def _cost(run, split) -> dict:
    return evaluate(run.model, split, run.config.eval)["cost"]


@pytest.mark.skipif(sys.platform != "linux", reason="the resident peak is reset on Linux only")
def test_the_evaluations_own_peak_leaves_out_what_the_process_already_held(trained_tiny_run):
    if not reset_peak_host_rss():
        pytest.skip("this system refuses /proc/self/clear_refs")
    run = load_run(trained_tiny_run)
    cfg = run.config
    role = eval_role(cfg.data, cfg.eval.split)
    use_dense = cfg.data.dense and run.model.matcher.consumes_dense
    split = prepare_data(cfg.data, run.tokenizer, roles=[role], use_dense=use_dense).splits[role]
    _cost(run, split)  # the first evaluation of a process also pages in code: not what is compared here
    light = _cost(run, split)
    held = bytearray(HELD_MB << 20)
    held[:: 1 << 12] = b"x" * len(range(0, len(held), 1 << 12))  # every page resident
    heavy = _cost(run, split)
    del held
    assert heavy["peak_host_scope"] == light["peak_host_scope"] == "evaluation"
    # the process's mark moved with what it held...
    assert heavy["host_rss_start_mb"] - light["host_rss_start_mb"] > HELD_MB - 30
    assert heavy["peak_host_rss_mb"] - light["peak_host_rss_mb"] > HELD_MB - 30
    # ...the evaluation's own peak did not (the old records had only the mark)
    for cost in (light, heavy):
        recorded = cost["peak_host_rss_mb"] - cost["host_rss_start_mb"]  # each rounded to 0.1 MiB
        assert cost["peak_host_growth_mb"] == pytest.approx(recorded, abs=0.11)
        assert cost["peak_host_growth_mb"] >= 0
    assert abs(heavy["peak_host_growth_mb"] - light["peak_host_growth_mb"]) < 30


def test_no_growth_is_claimed_where_the_peak_is_the_processs():
    timings = {"encode_seconds": 1.0, "scoring_seconds": 1.0, "pairs": 10}
    since_start = evaluation_cost(timings, "cpu", EvalConfig(), 1, gallery_pairs=10, host_scope="process")
    unknown = evaluation_cost(timings, "cpu", EvalConfig(), 1, gallery_pairs=10, host_scope="evaluation")
    for cost in (since_start, unknown):
        assert cost["peak_host_growth_mb"] is None and cost["host_rss_start_mb"] is None
    given = evaluation_cost(
        timings, "cpu", EvalConfig(), 1, gallery_pairs=10, host_scope="process", host_start_mb=1.0
    )
    assert given["peak_host_growth_mb"] is None  # a mark since the process started: no start to subtract
