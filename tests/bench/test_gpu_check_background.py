"""``make gpu-check``: the attention probe (which times nothing) runs in the background beside
train_compile's compilation when that is the next step, and is always finished, and recorded, before
anything else runs or is timed. A stand-in probe writes its rows as the real one does."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from project_paths import BENCHMARKS
from stall_support import HANG_GUARD_S

sys.path.insert(0, str(BENCHMARKS))
import gpu_check  # noqa: E402
import gpu_check_extra  # noqa: E402

# The stand-in probe: writes a setting row and a step row to its --json file, then exits ("ok") or
# never exits ("hang").
PROBE = """
import json, sys, time
out, how = sys.argv[1], sys.argv[2]
rows = [{"case": "setting", "torch": "x"}]
rows.append({"case": "step, dynamo", "mask": "expanded", "compiled": {"math@128": 12}})
open(out, "w").write(json.dumps(rows))
while how == "hang":
    time.sleep(0.05)
"""


@pytest.fixture
def stand_in_probe(monkeypatch):
    """Route the probe's command (Popen and run) to the stand-in; ``how[0]`` says how it behaves."""
    how = ["ok"]

    def swap(cmd):  # (subprocess.run calls Popen: the stand-in's own command passes unchanged)
        if "--json" not in cmd:
            return cmd
        return [sys.executable, "-c", PROBE, cmd[cmd.index("--json") + 1], how[0]]

    real_popen, real_run = subprocess.Popen, subprocess.run
    monkeypatch.setattr(gpu_check_extra.subprocess, "Popen", lambda cmd, **kw: real_popen(swap(cmd), **kw))
    monkeypatch.setattr(gpu_check_extra.subprocess, "run", lambda cmd, **kw: real_run(swap(cmd), **kw))
    monkeypatch.setattr(gpu_check_extra, "_BACKGROUND", [])
    return how


def _args(tmp_path, steps: str) -> argparse.Namespace:
    return argparse.Namespace(out=str(tmp_path), device="cpu", quick=True, steps=steps)


def _attention(tmp_path, steps: str):
    recorded, said = [], []
    budget = gpu_check.Budget(600.0, steps.split(","))
    entry = gpu_check_extra.step_attention(
        _args(tmp_path, steps), budget, recorded.append, said.append, lambda: dict(os.environ)
    )
    return entry, recorded, said


def test_the_probe_runs_beside_the_compilation_and_is_recorded_when_waited_for(stand_in_probe, tmp_path):
    entry, recorded, _ = _attention(tmp_path, "device,attention,train_compile")
    assert entry["status"] == "running" and len(gpu_check_extra._BACKGROUND) == 1
    gpu_check_extra.finish_background()
    assert not gpu_check_extra._BACKGROUND
    (final,) = recorded  # recorded over the "running" entry, through the step's own callback
    assert final["status"] == "ok" and "math@128" in final["summary"] and len(final["rows"]) == 2


def test_a_probe_still_running_at_its_limit_is_stopped_and_what_it_wrote_is_kept(stand_in_probe, tmp_path):
    stand_in_probe[0] = "hang"
    _, recorded, _ = _attention(tmp_path, "attention,train_compile")
    _wait_for_rows(tmp_path / "attention.json", 2)  # the limit is applied to a probe that has written them
    gpu_check_extra.finish_background(limit_s=0.5)
    (final,) = recorded
    assert final["status"] == "failed" and final["summary"].startswith("stopped after")
    assert len(final["rows"]) == 2  # the rows it had written


def _wait_for_rows(out: Path, count: int) -> None:
    """Until the running stand-in's ``out`` holds ``count`` rows (whole JSON: it may be read mid-write);
    fails the test after :data:`HANG_GUARD_S` (a probe that never writes them)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        try:
            if len(json.loads(out.read_text())) == count:
                return
        except (OSError, ValueError):  # not written yet, or half written
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"hang guard: the stand-in probe did not write {count} rows to {out} in {HANG_GUARD_S:g} s"
            )
        time.sleep(0.01)


def test_the_probe_runs_in_the_foreground_unless_train_compile_is_next(stand_in_probe, tmp_path):
    for steps in ("attention,train_compile", "attention,train,train_compile", "attention"):
        entry, recorded, _ = _attention(tmp_path, steps)
        if steps == "attention,train_compile":
            assert entry["status"] == "running"
            gpu_check_extra.finish_background()
        else:
            assert entry.get("status", "ok") == "ok" and len(entry["rows"]) == 2 and not recorded
            assert not gpu_check_extra._BACKGROUND


def test_gpu_check_finishes_the_probe_before_any_other_step(stand_in_probe, tmp_path, monkeypatch):
    stand_in_probe[0] = "hang"
    seen = []

    def compile_step(args, budget, partial):  # a train_compile that never reaches its turns
        seen.append(("train_compile", len(gpu_check_extra._BACKGROUND)))
        return {"summary": "stand-in"}

    def device_step(args, budget, partial):
        seen.append(("device", len(gpu_check_extra._BACKGROUND)))
        return {"summary": "stand-in"}

    monkeypatch.setitem(gpu_check.STEPS, "train_compile", compile_step)
    monkeypatch.setitem(gpu_check.STEPS, "device", device_step)
    monkeypatch.setattr(gpu_check_extra, "finish_background", _limited(gpu_check_extra.finish_background))
    steps = "attention,train_compile,device"
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--steps", steps]) == 0
    assert seen == [("train_compile", 1), ("device", 0)]  # beside the compilation only
    report = (tmp_path / "gpu_check.json").read_text()
    assert '"running"' not in report  # the attention step's entry was finished


def _limited(finish):
    """finish_background with a short limit by default: the hanging stand-in is stopped at once."""
    return lambda limit_s=None: finish(0.5 if limit_s is None else min(limit_s, 0.5))


def test_a_variant_stopped_during_its_profile_keeps_its_steps_per_second_in_the_summary():
    row = {"precision": "bf16", "scope": "step", "mode": "reduce-overhead", "flags": [], "batch": 64}
    row |= {"steps_per_s": 17.23, "ready_s": 120.0, "compiling_at_once": 3, "warmup_peak_reserved_gb": 18.3}
    stopped = gpu_check_extra._compiled_line("m", {**row, "status": "stopped: its profile ran past 30 s"})
    assert "17.23 steps/s [stopped: its profile ran past 30 s]" in stopped and "18.3 GB" in stopped
    done = gpu_check_extra._compiled_line("m", {**row, "seconds": 150.2})
    assert "17.23 steps/s (compiled and warm in 120.0 s, 3 compiling at once; 150.2 s" in done


@pytest.mark.parametrize(
    ("requested", "free_gb", "cpus", "expected"),
    [
        (5, 60.0, 16, 3),  # an H100 with the probe beside: memory decides
        (5, 120.0, 16, 5),  # an H200: --compile-parallel decides
        (5, None, 2, 2),  # a 2-core CPU smoke run: the CPUs decide (5 at once never finished there)
        (5, 5.0, 16, 1),  # less memory than one variant takes: still one
    ],
)
def test_the_compile_wave_holds_no_more_variants_than_memory_and_cpus_allow(
    requested, free_gb, cpus, expected
):
    assert gpu_check_extra.wave_size(requested, free_gb, 20.0, cpus) == expected
