"""An imported SEPS / LAPS checkpoint's card and report (review of the card, defects A and E).

* A: the card named the ``--hf-vision`` directory (an absolute path on the import machine, which supplied the
  architecture only) as the image backbone, and never said the weights were the checkpoint's.
* E: patchword cuts texts to ``opt.max_word`` BERT tokens before BERT, the official code cuts BERT's output
  (docs/models.md, "SEPS max_word"): the import said nothing, and the published-vs-measured comparison (card
  and ``patchword report``) had no caveat for it.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from conftest import write_laps_dataset
from patchword.cli import main
from patchword.imports import ImportOptions, import_checkpoint
from patchword.testing.official_seps import BERT, official_checkpoint, write_tiny_backbones

sys.path.insert(0, str(Path(__file__).parents[1] / "imports"))  # the import helpers of tests/imports
from test_import_published_comparison import record_evaluation  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CUT = "BERT tokens before BERT"


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    """Tiny Hugging Face ViT / BERT directories, a LAPS-layout dataset and an official SEPS checkpoint."""
    root = tmp_path_factory.mktemp("official")
    write_tiny_backbones(root)
    torch.save(official_checkpoint("vit", embed=24), root / "model_best.pth")
    write_laps_dataset(root / "laps")
    return root


@pytest.mark.parametrize("family", ["seps", "laps"])
def test_the_card_and_report_say_where_the_weights_came_from_and_that_texts_are_cut(
    official, tmp_path, caplog, family
):
    data = official / "laps"
    overrides = [f"data.root={data}", f"data.image_root={data / 'images'}"]
    if family == "seps":
        overrides += [f"data.dense_train={data / 'train.jsonl'}", f"data.dense_test={data / 'test.jsonl'}"]
    options = ImportOptions(
        hf_vision=str(official / "vit"), hf_text=str(official / "bert"), overrides=overrides
    )
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="patchword.imports.seps"):
        record = import_checkpoint(official / "model_best.pth", run, family_name=family, options=options)

    # E: one warning on import, naming both lengths
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and CUT in r.getMessage()
    ]
    assert len(warnings) == 1, warnings
    cut = record["opt"]["max_word"], BERT["max_position_embeddings"]
    assert f"to {min(cut)} {CUT}" in warnings[0] and f"keeps its first {cut[0]} embeddings" in warnings[0]
    assert ("dense caption" in warnings[0]) == (family == "seps")

    record_evaluation(run, "test", 1000)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    # A: the weights are the checkpoint's; the --hf-* directories supplied the architecture only
    official_weights = (
        f"weights from the official `{family}` checkpoint (sha256 `{record['source_sha256'][:16]}`"
    )
    assert f"* image encoder: Hugging Face `vit`; {official_weights}" in card
    assert f"* text encoder: Hugging Face `bert`; {official_weights}" in card
    assert (
        "architecture recorded in `backbones.json` (the directory given to the import supplied no weights)"
        in (card)
    )
    assert str(official / "vit") not in card and str(official / "bert") not in card
    # E: every published row measured here carries the caveat
    caveat = (
        f"patchword cuts each text to {min(cut)} {CUT} (data.max_caption_len), the official evaluation runs "
        f"BERT on the whole text and keeps its first {cut[0]} embeddings (opt.max_word)"
    )
    rows = card.count("| measured here | ")
    assert rows >= 1 and card.count(f"* caveat: {caveat}") == rows
    assert ("most SEPS dense captions" in card) == (family == "seps")

    report = tmp_path / "report.md"
    assert main(["report", str(run), "--out", str(report)]) == 0
    (caption,) = [line for line in report.read_text().splitlines() if "NOT LIKE FOR LIKE" in line]
    assert caveat in caption
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["metrics"]["images"] == 1000
