"""A loaded SEPS model whose run scores with one dense caption per image warns once when called without
it, then carries no hook (old code kept its hook for good, and the warning state on the matcher); a
pickled copy taken before the warning still warns once."""

from __future__ import annotations

import io
import warnings

import pytest
import torch

from patchword.runs import load_run

pytestmark = pytest.mark.usefixtures("one_thread")

_WARNING = "evaluated with one dense caption per image and is called without dense text"


def _call(run):
    ids, lens = run.tokenize(["w5 w6", "w7 w8 w9"])
    with torch.no_grad():
        return run.model(torch.randn(2, 3, 32, 32), ids, lens).sims


def test_the_hook_warns_once_then_leaves_the_model(trained_tiny_run):
    run = load_run(trained_tiny_run)
    assert len(run.model._forward_pre_hooks) == 1
    copy = torch.load(io.BytesIO(_saved(run.model)), weights_only=False)
    with pytest.warns(UserWarning, match=_WARNING):
        _call(run)
    assert not run.model._forward_pre_hooks  # nothing left to run on each call
    assert not hasattr(run.model.matcher, "dense_expected")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _call(run)
    run.model = copy.eval()
    with pytest.warns(UserWarning, match=_WARNING):
        _call(run)


def test_no_hook_where_the_run_scores_without_dense_text(trained_tiny_run):
    run = load_run(trained_tiny_run, overrides=["data.dense=false"])
    assert not run.model._forward_pre_hooks


def _saved(model) -> bytes:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return buffer.getvalue()
