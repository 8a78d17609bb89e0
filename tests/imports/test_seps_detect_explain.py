"""The SEPS importer's ``detect`` is ``explain``'s empty answer: whatever ``explain`` finds missing, the
checkpoint is not detected (one rule, written once)."""

from __future__ import annotations

import pytest
import torch

from patchword.imports import seps
from patchword.testing.official_seps import official_checkpoint


@pytest.fixture(scope="module")
def official():
    return official_checkpoint("vit", embed=8)


def _without(ckpt, prefix):
    return {**ckpt, "model": {k: v for k, v in ckpt["model"].items() if not k.startswith(prefix)}}


@pytest.mark.parametrize(
    ("change", "missing"),
    [
        (lambda c: c, ""),
        (lambda c: {k: v for k, v in c.items() if k != "model"}, "it has no 'model' entry"),
        (lambda c: {**c, "model": [1]}, "its 'model' entry is a list, not a state dict"),
        (lambda c: {**c, "model": {0: torch.zeros(1)}}, "its 'model' entry is not keyed by parameter names"),
        (lambda c: _without(c, "txt_enc.bert."), "its 'model' state dict has no parameter txt_enc.bert.*"),
        (lambda c: {k: v for k, v in c.items() if k != "opt"}, "it has no 'opt'"),
    ],
)
def test_detect_is_explain_finding_nothing_missing(official, change, missing):
    ckpt = change(official)
    said = seps.explain(ckpt)
    assert said.startswith(missing) and bool(said) == bool(missing)
    assert seps.detect(ckpt) is not bool(missing)
