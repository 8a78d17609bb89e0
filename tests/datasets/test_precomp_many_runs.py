"""Uneven id runs on a large split: the most common run length was found with one ``list.count`` per run
(quadratic: 200,000 runs took about 20 s, on the CPU here), now with one ``Counter`` of all runs. The tests
check what it finds (not its time: a verdict set by the clock would depend on the machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchword.data.precomp import _refuse_uneven_runs
from patchword.errors import DataError


def test_the_one_run_longer_than_the_usual_length_is_named():
    ids = [f"im{k}" for k in range(2_000) for _ in range(2)] + ["im0x"] * 3  # the last run is one too long
    with pytest.raises(DataError, match=r"goes on past 2 lines \(3 lines\), where most runs have 2"):
        _refuse_uneven_runs(ids, Path("test_ids.txt"))


def test_ties_still_go_to_the_first_run_length():
    """Two runs of 3 and two of 2: the first run's length (3) is the usual one, so the run of 2 is named."""
    with pytest.raises(
        DataError,
        match=r"^ids\.txt:6: id 'b' ends the run of id 'a' from line 4 after 2 lines, where most runs have 3",
    ):
        _refuse_uneven_runs(["x", "x", "x", "a", "a", "b", "b", "c", "c", "c"], Path("ids.txt"))
