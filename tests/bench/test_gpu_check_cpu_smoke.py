"""``make gpu-check``'s scoring step runs on the CPU at its smallest shapes (the command a GPU runs first,
with a few minutes of device time: a step that breaks must break here), and any step's error makes the
command's exit code 1 once every step has run."""

from __future__ import annotations

import json
import sys

from project_paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import gpu_check  # noqa: E402


def test_the_quick_scoring_step_runs_on_the_cpu_and_agrees_with_the_loop(tmp_path):
    """Old code: the image-tied warm-up gave the official loop 2 images and 16 dense rows (a ValueError)."""
    code = gpu_check.main(["--quick", "--device", "cpu", "--steps", "scoring", "--out", str(tmp_path)])
    scoring = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]["scoring"]
    assert code == 0, scoring.get("error")
    assert scoring["status"] == "ok"


def test_a_step_with_an_error_makes_the_exit_code_1_after_every_step_ran(tmp_path, monkeypatch):
    def broken(args, budget, partial):
        raise RuntimeError("broken on purpose")

    monkeypatch.setitem(gpu_check.STEPS, "scoring", broken)
    code = gpu_check.main(["--quick", "--device", "cpu", "--steps", "scoring,device", "--out", str(tmp_path)])
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert code == 1
    assert steps["scoring"]["status"] == "error" and steps["device"]["status"] == "ok"
