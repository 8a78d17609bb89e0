"""A rerun of a finished sweep checks every member it would keep before ``sweep.json`` is rewritten: a damaged
later member stops it with one line naming the file and the complete record is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [*TINY_RUN_32, "train.max_steps=2"]


def _sweep(out: Path) -> int:
    return main(["sweep", "--seeds", "0,1", "--name", "s0", *TINY, f"output_dir={out}"])


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A complete 2-seed sweep (its runs record their output_dir: a copy elsewhere would be another sweep)."""
    assert _sweep(tmp_path) == 0
    return tmp_path / "s0"


@pytest.mark.parametrize(
    ("damaged", "expected"),
    [
        ("config.yaml", "config.yaml: not a run config: invalid YAML"),
        ("summary.json", "summary.json"),
    ],
)
def test_a_damaged_later_member_leaves_sweep_json_as_it_was(sweep, capsys, damaged, expected):
    """f715cbc rewrote sweep.json after seed 0 (without seed 1's results), then failed on seed 1."""
    before = (sweep / "sweep.json").read_bytes()
    assert sorted(json.loads(before)["runs"]["runs"]) == ["0", "1"]
    (sweep / "seed-1" / damaged).write_text("x: [\n" if damaged.endswith(".yaml") else "{")
    assert _sweep(sweep.parent) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(sweep / "seed-1") in line and expected in line
    assert (sweep / "sweep.json").read_bytes() == before


def test_a_member_made_with_other_settings_is_refused_before_anything_is_rewritten(sweep, capsys):
    before = (sweep / "sweep.json").read_bytes()
    # seed 1's run as if made with another learning rate: the rerun must not mix the two recipes
    config = sweep / "seed-1" / "config.yaml"
    text = config.read_text()
    assert "  lr: " in text
    config.write_text(
        "\n".join("  lr: 0.5" if line.startswith("  lr: ") else line for line in text.splitlines())
    )
    assert _sweep(sweep.parent) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --name: {sweep / 'seed-1'} was made with other settings (train.lr")
    assert (sweep / "sweep.json").read_bytes() == before


def test_an_intact_rerun_keeps_every_result(sweep):
    before = json.loads((sweep / "sweep.json").read_text())
    assert _sweep(sweep.parent) == 0
    after = json.loads((sweep / "sweep.json").read_text())
    assert after["runs"] == before["runs"] and after["summary"] == before["summary"]
