"""Where things are, for tests in any sub-folder of ``tests/``: the project root, the test data shipped with
the tests, and the shared data folder that sits beside the project (``../shared``, as CI places it)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the project: src/, tests/, benchmarks/, configs/, README.md
TEST_DATA = TESTS / "data"
BENCHMARKS = ROOT / "benchmarks"
SHARED_DATA = ROOT.parent / "shared" / "data"
