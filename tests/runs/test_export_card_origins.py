"""Where an export's model card says each encoder's weights came from (review of the card, defect A).

Before: a warm-started run (``train.init_from``) read "tiny (from scratch)" and its Training section never
named the file; an imported SCAN checkpoint's encoders read "precomp (from scratch)" and its 36 regions
"patches: 36"; a run on the shipped pretrained tiny encoders named them for the image encoder only; a Hugging
Face run named its backbone without saying it supplied the initial weights.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, tiny_hf_laps_overrides
from patchword.cli import main
from patchword.runs import load_run

sys.path.insert(0, str(Path(__file__).parents[1] / "imports"))  # the import helpers of tests/imports
from test_import_published_comparison import import_scan  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _card(out: Path) -> str:
    return (out / "README.md").read_text()


def _parts(run: Path) -> dict[str, int]:
    """Tensors of the run's model per part (``image_encoder``, ``text_encoder``, ``matcher``)."""
    counts: dict[str, int] = {}
    for key in load_run(run).model.state_dict():
        counts[key.split(".")[0]] = counts.get(key.split(".")[0], 0) + 1
    return counts


def test_a_warm_started_run_names_the_file_and_the_tensors_it_supplied(trained_tiny_run, tmp_path):
    init = tmp_path / "init.pt"
    shutil.copyfile(trained_tiny_run / "best.pt", init)
    args = [*TINY_RUN_32, "train.max_steps=1", f"train.init_from={init}", "progress=false"]
    assert main(["train", *args, f"output_dir={tmp_path}", "name=warm"]) == 0
    run = tmp_path / "warm"
    named = load_run(run).config.train.init_from  # as the run's config.yaml records it
    parts = _parts(run)
    total = sum(parts.values())

    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    card = _card(tmp_path / "out")
    image, text = parts["image_encoder"], parts["text_encoder"]
    warm = f"warm-started from `{named}` (train.init_from)"
    assert f"* image encoder: tiny ViT; {warm}: all {image} of its tensors" in card
    assert f"* text encoder: tiny transformer; {warm}: all {text} of its tensors" in card
    matcher = parts["matcher"]
    assert (
        f"* warm start: `{named}` (train.init_from), loaded over the encoders' initialisation: {total} of "
        f"the model's {total} tensors (image encoder {image} of {image}, text encoder {text} of {text}, "
        f"matcher {matcher} of {matcher})" in card
    )
    assert "from scratch" not in card
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert record["warm_start"] == {
        "init_from": named,
        "tensors": {part: [n, n] for part, n in parts.items()},
    }

    # the file gone: a new export of the run states the counts training recorded (a run trained before
    # that record says it cannot count: tests/runs/test_warm_start_record.py); the export of the export
    # carries the counts too (same weights, by their sha256)
    init.unlink()
    assert main(["export", str(run), str(tmp_path / "again")]) == 0
    again = _card(tmp_path / "again")
    assert f"{total} of the model's {total} tensors" in again
    assert "not counted" not in again
    assert main(["export", str(tmp_path / "out"), str(tmp_path / "copy")]) == 0
    assert f"{total} of the model's {total} tensors" in _card(tmp_path / "copy")


def test_the_pretrained_tiny_encoders_are_named_for_both_encoders(tmp_path):
    """``model.tiny_pretrained`` loads the image AND the text encoder; the card named it for the image one."""
    args = ["data.num_train=8", "data.num_dev=4", "data.num_test=4", "model.embed_dim=128"]
    args += ["model.tiny_pretrained=synthetic-64", "data.vocab_path=synthetic-64", "train.batch_size=8"]
    args += ["train.max_steps=1", "train.num_threads=1", "progress=false"]
    assert main(["train", *args, f"output_dir={tmp_path}", "name=pre"]) == 0
    assert main(["export", str(tmp_path / "pre"), str(tmp_path / "out")]) == 0
    card = _card(tmp_path / "out")
    start = "initialised from the pretrained tiny encoders `synthetic-64` (model.tiny_pretrained)"
    assert f"* image encoder: tiny ViT; {start}" in card
    assert f"* text encoder: tiny transformer; {start}" in card
    assert "warm start" not in card and "from scratch" not in card


def test_an_imported_region_model_says_its_weights_are_the_checkpoints_and_counts_regions(tmp_path):
    run = import_scan(tmp_path, "scan")
    imported = json.loads((run / "import.json").read_text())
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    card = _card(tmp_path / "out")
    official = f"weights from the official `scan` checkpoint (sha256 `{imported['source_sha256'][:16]}`"
    assert f"* image encoder: region encoder over precomputed features; {official}" in card
    assert f"* text encoder: Bi-GRU; {official}" in card
    regions = load_run(run).config.model.precomp.num_regions
    assert f"* regions (precomputed region features): {regions}, CLS token: False" in card
    assert "patches:" not in card and "from scratch" not in card


def test_a_hugging_face_run_says_its_backbones_supplied_the_initial_weights(tiny_hf, laps_dataset, tmp_path):
    overrides = [*tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path), "train.max_steps=1"]
    assert main(["train", *overrides, f"output_dir={tmp_path / 'runs'}", "name=hf", "progress=false"]) == 0
    run = tmp_path / "runs" / "hf"
    model = load_run(run).config.model
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    card = _card(tmp_path / "out")
    assert f"architecture and initial weights from Hugging Face `{model.hf_vision}` (model.hf_vision)" in card
    assert f"architecture and initial weights from Hugging Face `{model.hf_text}` (model.hf_text)" in card
