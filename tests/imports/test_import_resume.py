"""An imported run holds weights, not a training: ``--resume`` says how to fine-tune them instead."""

from __future__ import annotations

import torch
from test_import_scan_naaf import SCAN_SPECIALS, official_checkpoint, scan_opt, vocab_words, write_json_vocab

from conftest import one_error_line
from patchword.cli import main
from patchword.imports import ImportOptions, import_checkpoint


def test_resuming_an_imported_run_is_one_line_naming_init_from(tmp_path, capsys):
    """Defect: ``patchword train --resume IMPORTED`` died in ``Trainer.load_state_dict`` with
    ``KeyError: 'optimizer'`` (a traceback, exit 1): an import's last.pt holds weights alone."""
    ckpt = tmp_path / "model_best.pth.tar"
    torch.save(official_checkpoint(scan_opt()), ckpt)
    vocab = write_json_vocab(tmp_path / "vocab.json", vocab_words(SCAN_SPECIALS))
    run = tmp_path / "imported"
    import_checkpoint(ckpt, run, options=ImportOptions(vocab=str(vocab)))
    before = sorted(p.name for p in run.iterdir())
    assert main(["train", "--resume", str(run)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --resume: ") and "holds imported weights" in line
    assert f"train.init_from={run / 'best.pt'}" in line
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written
