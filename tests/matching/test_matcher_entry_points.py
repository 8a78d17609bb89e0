"""A third-party matcher from the shell: a toy distribution installed into a temporary site directory
declares it in the ``patchword.matchers`` entry-point group; ``patchword train`` and ``patchword eval``
find it with no import in between (f715cbc had no entry-point group: a plug-in could not be used from the
command line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_MODEL_32


def _toy_source() -> str:
    """The toy matcher of test_plugin_matcher.py (its imports, config and class), registered under another
    name: the same plug-in, shipped as a distribution instead of defined in the test."""
    text = (Path(__file__).parent / "test_plugin_matcher.py").read_text()
    imports = [
        line
        for line in text.splitlines()
        if line.startswith(("from dataclasses", "from torch", "from patchword.matching"))
    ]
    body = text[text.index("@dataclass\nclass ToyConfig") : text.index("\n\nTINY = [")]
    assert '@register_matcher("toy-dot", ToyConfig, report=("flavour",))' in body
    body = body.replace('@register_matcher("toy-dot", ToyConfig, report=("flavour",))',
                        '@register_matcher("toy-entry-point", ToyConfig, report=("scale",))')  # fmt: skip
    return "\n".join(["from __future__ import annotations", *imports, "", body, ""])


def _install_toy_distribution(site: Path) -> None:
    """What ``pip install`` leaves for a distribution with one module and two entry points (one broken)."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "toy_entry_point_matcher.py").write_text(_toy_source())
    info = site / "toy_entry_point_matcher-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-entry-point-matcher\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[patchword.matchers]\ntoy = toy_entry_point_matcher\nbroken = toy_module_that_is_not_there\n"
    )


def _patchword(site: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "patchword", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # a hang guard only
    )


def test_an_entry_point_matcher_trains_and_evaluates_from_the_shell(tmp_path):
    site = tmp_path / "site"
    _install_toy_distribution(site)
    runs = tmp_path / "runs"
    argv = [
        "train",
        "data.num_train=24",
        "data.num_dev=8",
        "data.num_test=10",
        *TINY_MODEL_32,
        "model.matcher=toy-entry-point",
        "model.options.scale=2.0",
        "train.batch_size=16",
        "train.max_steps=3",
        "train.num_threads=1",
        f"output_dir={runs}",
        "name=toy",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    done = _patchword(site, *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    # the broken entry point is one warning naming it; the rest of patchword goes on
    assert "matcher plug-in 'broken' (toy_module_that_is_not_there) failed to load" in done.stderr
    summary = json.loads((runs / "toy" / "summary.json").read_text())
    assert (summary["matcher"], summary["scale"], summary["steps"]) == ("toy-entry-point", 2.0, 3)
    done = _patchword(site, "eval", str(runs / "toy"), "--out", str(tmp_path / "e.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    evaluated = json.loads((tmp_path / "e.json").read_text())
    assert evaluated["rsum"] == pytest.approx(summary["rsum"]) and evaluated["matcher"] == "toy-entry-point"
    # without the distribution the name is unknown: one line naming the key
    done = _patchword(tmp_path, *argv[:-3], f"output_dir={tmp_path / 'other'}", "name=toy")
    assert done.returncode == 2
    assert "model.matcher" in done.stderr and "toy-entry-point" in done.stderr
