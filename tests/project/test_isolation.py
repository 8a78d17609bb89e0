"""The suite keeps to itself: caches in the session's temporary directory (``conftest.private_caches``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from project_paths import TESTS


def test_the_synthetic_cache_lives_in_the_sessions_temporary_directory(private_caches):
    from patchword.data.synthetic.dataset import default_cache_dir

    assert default_cache_dir() == private_caches / "patchword" / "synthetic"
    assert not str(default_cache_dir()).startswith(str(Path.home() / ".cache"))


def test_processes_a_test_starts_inherit_the_private_cache(private_caches):
    code = "from patchword.data.synthetic.dataset import default_cache_dir; print(default_cache_dir())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert Path(done.stdout.strip()) == private_caches / "patchword" / "synthetic"


def test_every_module_comparing_an_engine_or_a_reference_is_rerun_with_avx2_kernels():
    """A module that compares a scoring engine or a reference loop with something else rests on
    floating-point agreement: it belongs to ``make test-numerics`` (f715cbc left test_pruning out)."""
    from conftest import NUMERICS_MODULES, NUMERICS_SIGNS

    tests = TESTS
    comparing = {
        path.stem
        for path in tests.rglob("test_*.py")
        if any(sign in path.read_text() for sign in NUMERICS_SIGNS) and path.stem != "test_isolation"
    }
    assert comparing - NUMERICS_MODULES == set()
    assert {"test_pruning", "test_model_export", "test_bench", "test_engine"} <= NUMERICS_MODULES
    assert {path.stem for path in tests.rglob("test_*.py")} >= NUMERICS_MODULES


def test_the_numerics_rerun_refuses_to_run_without_the_kernels_it_names(tmp_path):
    """``--expect-cpu-capability`` (make test-numerics) stops a run whose kernels are not the ones named."""
    import torch

    actual = torch.backends.cpu.get_cpu_capability()
    other = "AVX2" if actual != "AVX2" else "DEFAULT"
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    tests = TESTS
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    cmd += ["--confcutdir", str(tests), "-p", "conftest", str(tmp_path / "test_one.py")]
    env = {**os.environ, "PYTHONPATH": str(tests)}
    for capability, code in ((actual, 0), (other, 4)):
        done = subprocess.run(
            [*cmd, "--expect-cpu-capability", capability],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == code, done.stdout + done.stderr
    assert f"torch's CPU kernels run with {actual}" in done.stderr
