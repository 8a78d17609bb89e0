"""The model card of an exported run evaluated by a two-stage (shortlist) search labels its protocol as
``patchword report`` labels the row (``leak-free, two-stage (shortlist 40/8, α 1.0)``), and says that a
ground truth outside the shortlist counts as a miss, with the share of queries it missed."""

from __future__ import annotations

import json

import pytest

from conftest import TINY_REGIONS, TINY_TGDT
from patchword.cli import main
from patchword.eval.two_stage import two_stage_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_two_stage_evaluation_is_labelled_as_the_report_labels_it(tmp_path):
    """Old code: "Protocol: leak-free" for an evaluation whose record says exhaustive: false."""
    runs, out = tmp_path / "runs", tmp_path / "export"
    assert (
        main(["train", *TINY_REGIONS, *TINY_TGDT, "train.max_steps=2", f"output_dir={runs}", "name=t"]) == 0
    )
    assert main(["export", str(runs / "t"), str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert metrics["cost"]["exhaustive"] is False
    label = two_stage_of(metrics)
    assert label == "two-stage (shortlist 40/8, α 1.0)"  # the report's, for this record
    card = (out / "README.md").read_text()
    assert f"Protocol: leak-free, {label}; checkpoint `best.pt` of the run" in card
    (note,) = [line for line in card.splitlines() if line.startswith("**Two-stage:**")]
    assert "a ground truth outside the shortlist counts as a miss at every k" in note
    missed = (metrics["shortlist_miss_i2t"], metrics["shortlist_miss_t2i"])
    assert note.endswith(
        f"the shortlist missed it for {missed[0]:.1f}% of the image queries and {missed[1]:.1f}% of the "
        "caption queries."
    )


def test_the_protocol_label_of_exhaustive_leaky_and_two_stage_records():
    from patchword.runs.card import _protocol  # here: the card's label, also for the published comparison

    assert _protocol({"leaky": False}) == "leak-free"
    assert _protocol({"leaky": True}) == "LEAKY"
    assert _protocol({"leaky": True}, detail=True) == "LEAKY (a query carries dense text of its own image)"
    two_stage = {"leaky": True, "shortlist_i2t": 5, "shortlist_t2i": 3, "hybrid_alpha": 0.5}
    assert (
        _protocol(two_stage)
        == "LEAKY, " + two_stage_of(two_stage)
        == "LEAKY, two-stage (shortlist 5/3, α 0.5)"
    )
