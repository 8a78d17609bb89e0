"""The patch probes check their tokens for NaN / inf once, not again inside every probe and every word's
AUC (the checks stay: tests/eval/test_patch_probe.py); the numbers are those of the public functions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import patchword.eval.patch_probe as probe

pytestmark = pytest.mark.usefixtures("one_thread")


def _counting(monkeypatch) -> list:
    calls, real = [], probe.check_finite

    def counted(x, name, **kwargs):
        calls.append(name)
        return real(x, name, **kwargs)

    monkeypatch.setattr(probe, "check_finite", counted)
    return calls


def _targets(rng, n: int, p: int) -> dict[str, np.ndarray]:
    obj = rng.random((n, p)) < 0.5
    return {
        "coverage": obj.astype(float),
        "object": obj,
        "shape": np.where(obj, rng.integers(0, 3, (n, p)), -1),
        "colour": np.where(obj, rng.integers(0, 4, (n, p)), -1),
    }


def test_probe_patch_tokens_checks_the_tokens_once(monkeypatch):
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    train, test = torch.randn(6, 4, 8), torch.randn(5, 4, 8)
    t_train, t_test = _targets(rng, 6, 4), _targets(rng, 5, 4)
    calls = _counting(monkeypatch)
    got = probe.probe_patch_tokens(train, t_train, test, t_test)
    assert len(calls) == 2  # was 8: both again in each of the three probes
    monkeypatch.undo()
    flat = train.reshape(-1, 8), test.reshape(-1, 8)
    ys, yt = (torch.as_tensor(t["object"]).long().flatten() for t in (t_train, t_test))
    assert got["object"] == probe.fit_linear_probe(flat[0], ys, flat[1], yt).as_dict()


def test_patch_word_grounding_checks_the_patch_tokens_once(monkeypatch):
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    tokens, targets = torch.randn(5, 4, 8), _targets(rng, 5, 4)
    config = SimpleNamespace(colours=["red", "blue", "green", "grey"], shapes=["disc", "square", "star"])
    encoded = {}

    def encode_texts(ids, lens):
        return encoded.setdefault(len(ids), torch.randn(len(ids), 2, 8))

    model = SimpleNamespace(encode_texts=encode_texts)
    tokenizer = SimpleNamespace(
        batch_encode=lambda words: (torch.zeros(len(words), 2), torch.full((len(words),), 2))
    )
    calls = _counting(monkeypatch)
    got = probe.patch_word_grounding(model, tokenizer, tokens, targets, config)
    assert len(calls) == 3  # the patch tokens, and each attribute's word tokens; not every word's scores
    unit = torch.nn.functional.normalize(tokens.double().reshape(-1, 8), dim=-1)
    labels = torch.as_tensor(targets["colour"]).flatten()
    aucs = [
        probe.roc_auc(unit @ torch.nn.functional.normalize(encoded[4][k, 1].double(), dim=0), labels == k)
        for k in range(4)
        if bool((labels == k).any())
    ]
    assert got["colour_auc"] == sum(aucs) / len(aucs)
