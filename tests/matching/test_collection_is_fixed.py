"""The cases of the test modules that run over every built-in matcher do not depend on what else pytest
collected: they are built from a fixed list (``matcher_support.BUILTIN_MATCHERS``), not from the global
registry as each module is imported. Old code: collected after ``test_plugin_matcher.py`` and
``tests/models/test_matcher_option_checks.py`` (which register ``toy-dot`` and ``opts-mean`` when imported),
``test_length_checks.py``, ``test_registry_presets.py`` and ``test_matcher_empty_and_sizes.py`` had cases of
those toys, which they had not when collected alone."""

from __future__ import annotations

import subprocess
import sys

from matcher_support import BUILTIN_MATCHERS
from project_paths import ROOT

FIXED = [
    "tests/matching/test_length_checks.py",
    "tests/matching/test_registry_presets.py",
    "tests/matching/test_training_only.py",
    "tests/matching/test_matcher_empty_and_sizes.py",
]
TOYS = {
    "tests/matching/test_plugin_matcher.py": "toy-dot",
    "tests/models/test_matcher_option_checks.py": "opts-mean",
}


def test_the_cases_hold_no_toy_another_module_registered_before_them():
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *TOYS, *FIXED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard only
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = [line for line in collected.stdout.splitlines() if line.startswith(tuple(FIXED))]
    assert {line.split("::")[0] for line in ids} == set(FIXED)
    assert [line for line in ids if any(toy in line for toy in TOYS.values())] == []


def test_the_fixed_list_is_every_matcher_patchword_itself_registers():
    """A new built-in matcher is added to the list (a toy of a test module, an installed plug-in are not);
    in a fresh process: here the registry holds whatever the modules collected so far registered."""
    script = (
        "from patchword.matching import list_matchers, matcher_spec\n"
        "print(*[n for n in list_matchers() if matcher_spec(n).cls.__module__.startswith('patchword.')])"
    )
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert sorted(fresh.stdout.split()) == sorted(BUILTIN_MATCHERS)
