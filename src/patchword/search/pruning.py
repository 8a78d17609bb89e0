"""Index-time patch pruning (``patchword index build --keep-patches F``): store fewer patches per image.

SEPS / LAPS keep, for each (image, caption) pair, the K patches with the highest selection score
``image part + text part`` (the image part: the saliency s_im, and in the paper variant the learned score
s_p; the text part: the patches' relevance to the caption). An index pruned to M > K patches per image keeps
the M patches with the highest *image* part, computed on all N patches before pruning, and stores that image
part of each kept patch (``patch_prior``) with the patches' grid positions (``patch_ids``).

This is an approximation, never exact: a dropped patch can no longer be selected by a caption it is
relevant to, it no longer feeds the fusion token (the softmax over the patches a pair drops), and the paper
variant's min-max normalisation of the text part runs over the kept patches. Its recall cost is measured
(docs/search.md, "Index-time patch pruning"); the manifest records what was pruned and how
(:func:`pruning_record`). What stays exact: the image-only score terms (precomputed on all N patches), the
aggregation of the kept patches, and a ``--dense-store scores`` dense branch (computed before pruning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from patchword.errors import ConfigError
from patchword.eval.engine.base import ScoringEngine

__all__ = ["PrunedTokens", "kept_patches", "prune_patches", "pruning_record"]

#: How the manifest names the pruning rule (``pruning.by``).
RULE = "image-only selection score (saliency; paper variant: learned score too), computed on all patches"


@dataclass
class PrunedTokens:
    """Image tokens pruned to M patches: ``tokens`` (B, [1 +] M, C) (CLS first when the model has one, the
    kept patches in grid order), ``patch_ids`` (B, M) int16 their grid positions, ``prior`` (B, M) float32
    the image part of their selection scores."""

    tokens: torch.Tensor
    patch_ids: torch.Tensor
    prior: torch.Tensor


def kept_patches(engine: ScoringEngine, fraction: float) -> int:
    """M = ceil(N * ``fraction``) patches kept per image by ``engine``'s matcher.

    Raises:
        ConfigError: (``--keep-patches``) the matcher cannot score pruned images, the fraction is not in
            (0, 1], or M leaves no patch for the fusion token (M <= K).
    """
    if not engine.prunable:
        raise ConfigError(
            "--keep-patches",
            f"{type(engine.matcher).__name__} cannot score images pruned at index time (only SEPS / LAPS "
            "select patches per caption)",
        )
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError("--keep-patches", f"must be a fraction in (0, 1], got {fraction!r}")
    cfg = engine.matcher.config
    n, k = cfg.num_patches, cfg.num_keep
    m = math.ceil(n * fraction - 1e-9)
    if m <= k:
        raise ConfigError(
            "--keep-patches",
            f"{fraction} keeps {m} of {n} patches, but the matcher selects K={k} per caption and needs more "
            f"for its fusion token: give more than {k / n:.3f}",
        )
    return m


def pruning_record(engine: ScoringEngine, fraction: float) -> dict[str, Any]:
    """What the manifest says about a pruned index (``Manifest.pruning``)."""
    cfg = engine.matcher.config
    return {
        "kept": kept_patches(engine, fraction),
        "of": cfg.num_patches,
        "fraction": fraction,
        "by": RULE,
        "exact": False,
    }


@torch.no_grad()
def prune_patches(engine: ScoringEngine, tokens: torch.Tensor, keep: int, *, device) -> PrunedTokens:
    """Keep the ``keep`` patches of each image with the highest image part of the selection score.

    Args:
        engine: a prunable engine (:class:`~patchword.eval.engine.seps.SEPSEngine`) of the fine matcher.
        tokens: (B, L_v, C) unpruned image tokens ([CLS?, N patches]).
        keep: M, from :func:`kept_patches`.
    """
    has_cls = int(engine.matcher.config.has_cls)
    prior = engine.patch_priors(tokens, device=device)  # (B, N)
    ids = prior.topk(keep, dim=1).indices.sort(dim=1).values  # (B, M), grid order
    patches = tokens[:, has_cls:]
    kept = patches.gather(1, ids[..., None].expand(-1, -1, patches.shape[2]))
    out = torch.cat([tokens[:, :has_cls], kept], dim=1)
    return PrunedTokens(out, ids.to(torch.int16), prior.gather(1, ids))
