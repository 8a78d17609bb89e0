"""SEPS-family matchers and their inputs for the tests that compare scoring paths (engine, forward, CUDA,
pruning): seeded, in eval mode."""

from __future__ import annotations

import torch

from patchword.matching import build_matcher


def seeded_matcher(name: str, geometry: tuple[int, bool, float, float], dim: int, **options):
    """``build_matcher(name)`` after ``torch.manual_seed(1)``, in eval mode; ``geometry`` is
    ``(num_patches, has_cls, sparse_ratio, aggr_ratio)``, ``options`` any other matcher option."""
    num_patches, has_cls, sparse_ratio, aggr_ratio = geometry
    torch.manual_seed(1)
    matcher = build_matcher(
        name,
        embed_dim=dim,
        num_patches=num_patches,
        has_cls=has_cls,
        sparse_ratio=sparse_ratio,
        aggr_ratio=aggr_ratio,
        **options,
    )
    return matcher.eval()


# (num_patches, has_cls, sparse_ratio, aggr_ratio): ViT-B/16-224 (196 + CLS) and Swin-B-224 (49, no CLS)
ENGINE_SHAPES = {"vit": (196, True, 0.5, 0.4), "swin": (49, False, 0.8, 0.6)}
ENGINE_DIM = 64

# The built-in matchers, a fixed list that test modules parametrise their cases over at collection. Not
# ``list_matchers()`` as a module is imported: the registry is global, and a test module that registers a toy
# when imported (``toy-dot``, ``opts-mean``) put it in those cases only when pytest had imported that module
# first (``tests/matching/test_collection_is_fixed.py`` checks that collection does not depend on it).
BUILTIN_MATCHERS = ("seps", "laps", "vse", "clip", "filip", "scan", "naaf", "tgdt")


def engine_matcher(kind="vit", variant="code", name="seps", **kw):
    return seeded_matcher(name, ENGINE_SHAPES[kind], ENGINE_DIM, variant=variant, **kw)


def engine_inputs(kind="vit", n_img=5, n_txt=8, seed=0):
    n, has_cls, *_ = ENGINE_SHAPES[kind]
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(n_img, n + int(has_cls), ENGINE_DIM, generator=g)
    caps = torch.randn(n_txt, 14, ENGINE_DIM, generator=g)
    lens = torch.randint(3, 15, (n_txt,), generator=g)
    dense = torch.randn(n_img, 40, ENGINE_DIM, generator=g)
    dense_lens = torch.randint(5, 41, (n_img,), generator=g)
    txt2img = torch.arange(n_txt) % n_img
    return img, caps, lens, dense, dense_lens, txt2img
