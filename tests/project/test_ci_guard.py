"""The CI rule that nothing skips (``tests/ci_guard.py``), checked with inner pytest runs.

Each case writes a tiny test module, runs ``python -m pytest`` on it in a subprocess with the guard as its
only plugin, once with ``CI=true`` and once without, and compares the exit codes: f715cbc's hook saw
per-test reports only, so a module-level ``importorskip`` (73 official-import tests when ``transformers``
is missing) and any xfail passed under CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from project_paths import TESTS

CASES = {
    "module-level importorskip": (
        'import pytest\npytest.importorskip("no_such_module_here")\n\ndef test_a():\n    assert True\n',
        "skipped at collection under CI=true",
    ),
    "module-level skip": (
        'import pytest\npytest.skip("no data", allow_module_level=True)\n\ndef test_a():\n    pass\n',
        "skipped at collection under CI=true",
    ),
    "skip in a test": (
        'import pytest\n\ndef test_a():\n    pytest.skip("no data")\n',
        "skipped under CI=true",
    ),
    "skipif marker": (
        'import pytest\n\n@pytest.mark.skipif(True, reason="never")\ndef test_a():\n    pass\n',
        "skipped under CI=true",
    ),
    "xfail": (
        'import pytest\n\n@pytest.mark.xfail(reason="known")\ndef test_a():\n    assert False\n',
        "xfail under CI=true",
    ),
    "xpass": (
        'import pytest\n\n@pytest.mark.xfail(reason="known")\ndef test_a():\n    assert True\n',
        "xfail under CI=true",
    ),
}


def _inner_pytest(tmp_path: Path, source: str, *args: str, ci: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if ci:
        env["CI"] = "true"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "ci_guard", "-p", "no:cacheprovider", "-c", os.devnull]
    return subprocess.run(
        [*cmd, "--rootdir", str(tmp_path), *args, str(tmp_path / "test_inner.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,  # a hang guard only
    )


@pytest.mark.parametrize("case", list(CASES))
def test_every_kind_of_skip_fails_under_ci_and_passes_without(tmp_path, case):
    source, message = CASES[case]
    plain = _inner_pytest(tmp_path, source, ci=False)
    # 0: passed with a skip; 5: a module skipped whole leaves no test collected (pytest's "no tests ran")
    assert plain.returncode in (0, 5), plain.stdout + plain.stderr
    under_ci = _inner_pytest(tmp_path, source, ci=True)
    assert under_ci.returncode in (1, 2), under_ci.stdout  # tests failed / collection errors
    assert message in under_ci.stdout, under_ci.stdout


def test_a_cuda_test_may_skip_on_a_machine_without_cuda(tmp_path):
    """The one exception: ``cuda``-marked tests skip where there is no CUDA device."""
    import torch

    source = (
        "import pytest\nimport torch\n\n@pytest.mark.cuda\n"
        '@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")\n'
        "def test_a():\n    assert torch.cuda.is_available()\n"
    )
    done = _inner_pytest(tmp_path, source, "-m", "cuda or not cuda", ci=True)
    assert done.returncode == 0, done.stdout
    assert ("1 skipped" if not torch.cuda.is_available() else "1 passed") in done.stdout


def test_under_ci_the_suite_fails_when_transformers_cannot_be_imported(tmp_path):
    """With ``transformers`` made unimportable, collecting the official-import and encoder modules is an
    error, not three skipped modules (f715cbc: ``importorskip`` at their top, and the run passed)."""
    (tmp_path / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import sys

            class _Hide:
                def find_spec(self, name, path=None, target=None):
                    if name == "transformers" or name.startswith("transformers."):
                        raise ImportError("transformers hidden by the test")
                    return None

            sys.meta_path.insert(0, _Hide())
            """
        )
    )
    env = {**os.environ, "CI": "true", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS)])}
    names = ("imports/test_import_seps.py", "imports/test_import_tgdt_ucmfh.py", "encoders/test_encoders.py")
    modules = [str(TESTS / name) for name in names]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *modules],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        env=env,
        timeout=600,  # a hang guard only
    )
    assert done.returncode != 0, done.stdout
    assert "transformers hidden by the test" in done.stdout + done.stderr
