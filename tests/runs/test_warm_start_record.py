"""A warm-started run records what ``train.init_from`` supplied when training starts (review, item 1).

Before: training discarded ``warm_start``'s list, so the export counted again against the file, and its card
said "not counted" once the file was gone, or named a relative path read from another working directory.
Now the first record of ``metrics.jsonl`` holds the file's absolute path, its sha256 and the per-part counts;
``summary.json`` repeats it, a resume keeps it, and the card reads it first (a run trained before the record
existed is still counted against the file).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.fileio import file_sha256
from patchword.runs import load_run
from patchword.train.runner import resume_run

pytestmark = pytest.mark.usefixtures("one_thread")


def _parts(run: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in load_run(run).model.state_dict():
        counts[key.split(".")[0]] = counts.get(key.split(".")[0], 0) + 1
    return counts


def _first_record(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])


def _line(init: str, parts: dict[str, int]) -> str:
    total = sum(parts.values())
    image, text, matcher = parts["image_encoder"], parts["text_encoder"], parts["matcher"]
    return (
        f"* warm start: `{init}` (train.init_from), loaded over the encoders' initialisation: {total} of "
        f"the model's {total} tensors (image encoder {image} of {image}, text encoder {text} of {text}, "
        f"matcher {matcher} of {matcher})"
    )


def test_the_card_states_the_counts_recorded_at_training_with_the_file_gone(
    trained_tiny_run, tmp_path, monkeypatch
):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(trained_tiny_run / "best.pt", work / "init.pt")
    digest = file_sha256(work / "init.pt")
    monkeypatch.chdir(work)  # a relative init_from, read from this working directory
    args = [*TINY_RUN_32, "train.max_steps=1", "train.init_from=init.pt", "progress=false"]
    assert main(["train", *args, f"output_dir={tmp_path}", "name=warm"]) == 0
    run = tmp_path / "warm"
    parts = _parts(run)
    absolute = str(work / "init.pt")
    counts = {part: [n, n] for part, n in parts.items()}
    recorded = {"init_from": absolute, "sha256": digest, "tensors": counts}
    assert _first_record(run) == {"step": 0, "split": "warm_start", **recorded}
    assert json.loads((run / "summary.json").read_text())["warm_start"] == recorded

    # the file gone, exported from another working directory: the card still states the counts
    (work / "init.pt").unlink()
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert _line(absolute, parts) in card
    warm = f"warm-started from `{absolute}` (train.init_from)"
    assert f"* image encoder: tiny ViT; {warm}: all {parts['image_encoder']} of its tensors" in card
    assert "not counted" not in card

    # a resume (the file still gone) keeps the first session's record, in metrics.jsonl and summary.json
    resume_run(run, ["train.max_steps=2"])
    assert _first_record(run) == {"step": 0, "split": "warm_start", **recorded}
    assert json.loads((run / "summary.json").read_text())["warm_start"] == recorded
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(0) == 1 and max(steps) == 2


def test_a_run_without_the_record_is_still_counted_against_the_file(trained_tiny_run, tmp_path):
    """A run trained before the record existed (its metrics.jsonl starts with a step): counted on export."""
    init = tmp_path / "init.pt"
    shutil.copyfile(trained_tiny_run / "best.pt", init)
    args = [*TINY_RUN_32, "train.max_steps=1", f"train.init_from={init}", "progress=false"]
    assert main(["train", *args, f"output_dir={tmp_path}", "name=old"]) == 0
    run = tmp_path / "old"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["split"] == "warm_start"
    (run / "metrics.jsonl").write_text("\n".join(lines[1:]) + "\n")  # as such a run wrote it
    parts = _parts(run)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert _line(str(init), parts) in (tmp_path / "out" / "README.md").read_text()
    init.unlink()
    assert main(["export", str(run), str(tmp_path / "gone")]) == 0
    assert "not counted: no weights at that path on export" in (tmp_path / "gone" / "README.md").read_text()
