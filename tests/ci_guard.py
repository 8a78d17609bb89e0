"""The CI rule that nothing skips: under ``CI=true`` (as ``.ci/run`` runs the suite) a skip or an xfail,
in a test or at collection (a module-level ``pytest.importorskip``), fails the run.

A missing optional dependency or data file would otherwise leave code untested without anyone noticing;
``make test`` installs what the suite exercises. The one exception: tests marked ``cuda`` skip on a machine
without a CUDA device (``make gpu-check`` runs them where there is one).

``tests/conftest.py`` re-exports these hooks; ``tests/project/test_ci_guard.py`` runs an inner pytest
with this module alone as a plugin (``-p ci_guard``) to check them.
"""

from __future__ import annotations

import os

import pytest

__all__ = [
    "IN_CI",
    "pytest_make_collect_report",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
]

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _skips_for_want_of_cuda(item) -> bool:
    """Whether ``item`` is marked ``cuda`` and this machine has no CUDA device: a skip expected under CI."""
    if item.get_closest_marker("cuda") is None:
        return False
    import torch

    return not torch.cuda.is_available()


def _reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips as a whole (``importorskip`` at its top, ``pytest.skip(allow_module_level=True)``)
    reports one collection skip, which no per-test hook sees: under CI it is a collection error."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: skipped at collection under CI=true: {_reason(report)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped, xfailed or xpassed test fails under CI (``cuda`` tests without a CUDA device excepted)."""
    outcome = yield
    report = outcome.get_result()
    if not IN_CI or _skips_for_want_of_cuda(item):
        return
    if hasattr(report, "wasxfail"):  # xfail (reported as skipped) or xpass (reported as passed)
        report.outcome = "failed"
        report.longrepr = f"xfail under CI=true, where every test must pass: {report.wasxfail}"
        del report.wasxfail
    elif report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may skip: {_reason(report)}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The last line of defence: a skip or xfail the hooks above did not turn into a failure (a plugin's own
    report) still fails the session."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not IN_CI or reporter is None:
        return
    stats = reporter.stats
    left = [r for r in stats.get("skipped", []) + stats.get("xfailed", []) if "cuda" not in r.keywords]
    if left and session.exitstatus == 0:
        reporter.write_line(f"CI=true: {len(left)} skipped or xfailed; the run fails", red=True)
        session.exitstatus = 1
