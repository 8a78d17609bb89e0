"""The two-stage search picks its default device by the one rule the scoring engine uses,
``patchword.device.module_device`` (the matcher's device, else the tokens'): ``eval/two_stage.py``
imported the engine's private copy of it (``_matcher_device``), and ``global_embeddings`` did not check
``img_tokens`` (a list was an AttributeError deep in its blocks)."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest
import torch

import patchword.eval.two_stage as two_stage
from patchword.eval import global_embeddings
from patchword.matching import build_matcher

DIM = 8


def test_two_stage_imports_no_private_name_and_the_engine_keeps_no_copy_of_the_rule():
    tree = ast.parse(inspect.getsource(two_stage))
    private = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("patchword")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == []
    engine = importlib.import_module(two_stage.engine_for.__module__)  # where the scoring engine lives
    assert not hasattr(engine, "_matcher_device")


def _tokens(n_img: int = 3, per_image: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    img = torch.randn(n_img, 4, DIM, generator=g)
    caps = torch.randn(n_img * per_image, 5, DIM, generator=g)
    return img, caps, torch.full((n_img * per_image,), 5)


def test_global_embeddings_refuses_image_tokens_that_are_no_tensor_naming_them():
    matcher = build_matcher("vse", embed_dim=DIM, has_cls=False, pool="mean").eval()
    img, caps, lens = _tokens()
    with pytest.raises(ValueError, match="img_tokens must be a torch.Tensor, got list"):
        global_embeddings(matcher, img.tolist(), caps, lens)
    with pytest.raises(ValueError, match=r"img_tokens must have 3 dimensions, got shape \(3, 32\)"):
        global_embeddings(matcher, img.reshape(3, -1), caps, lens)
