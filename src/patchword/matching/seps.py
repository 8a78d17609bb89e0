"""SEPS (ICLR 2026) and LAPS (CVPR 2024): text-aware patch slimming plus patch-word alignment.

Two presets of independent switches (``variant``):

========================  =====================================  =========================================
switch                    ``variant="code"`` (official SEPS)     ``variant="paper"`` (Eqs. 1-5, 7)
========================  =====================================  =========================================
``score_mode``            ``"sum"``: s_im + s_t, no gradient     ``"predictor"``: (1-2b) s_p + b (...)
``dense_mode``            ``"branch"``: own selection + HRPA,    ``"guide"``: dense text guides selection
                          sims summed                            and aggregation; alignment uses the caption
``aggregation``           ``"shared"``: one TokenAggregation     ``"dual"``: W_s and W_d, summed (Eq. 4)
``hrpa_topk``             0 (mean terms only)                    5 (adds MLP(TopK) per direction)
``similarity``            ``"leaky_relu"`` (slope 0.1)           ``"cosine"``
``gumbel``                False (hard top-K)                     True (straight-through decisions)
``ratio_mode``            ``"sum_masks"``                        ``"per_branch"``
========================  =====================================  =========================================

Any switch can be set explicitly to mix the two (ablations). ``dense_pairing`` decides which dense
caption a pair uses: ``"image"`` (default, leak-free) the candidate image's own; ``"caption"`` (official
protocol, leaky) the one of the caption's ground-truth image.

Over 400 lines: SEPS and LAPS, both variants and every switch of the official semantics in one class, read
side by side with the reference notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch

from patchword._validation import check_tensor
from patchword.matching.aggregation import TokenAggregation
from patchword.matching.base import Matcher, MatcherOutput, caption_blocks
from patchword.matching.config_check import check_config_fields
from patchword.matching.hrpa import HRPA, pair_cosines
from patchword.matching.ops import autocast_off, full_precision, l2norm, length_mask, masked_mean
from patchword.matching.registry import register_matcher
from patchword.matching.selection import (
    PatchScorer,
    combine_paper_scores,
    fusion_weights,
    image_saliency,
    saliency_centre,
    scores_from_prior,
    text_relevance,
    topk_decisions,
)
from patchword.precision import autocast_enabled

__all__ = ["SEPSConfig", "SEPSMatcher", "SelectionTrace", "VARIANT_PRESETS"]

VARIANT_PRESETS = {
    "code": dict(
        score_mode="sum",
        dense_mode="branch",
        aggregation="shared",
        hrpa_topk=0,
        similarity="leaky_relu",
        gumbel=False,
        ratio_mode="sum_masks",
    ),
    "paper": dict(
        score_mode="predictor",
        dense_mode="guide",
        aggregation="dual",
        hrpa_topk=5,
        similarity="cosine",
        gumbel=True,
        ratio_mode="per_branch",
    ),
}


@dataclass
class SEPSConfig:
    """Every constructor argument of :class:`SEPSMatcher`; ``None`` switches take the variant's value."""

    embed_dim: int = 512  # C, width of the projected tokens
    num_patches: int = 196  # N spatial tokens (CLS excluded): 196 ViT-B/16-224, 49 Swin-B-224
    has_cls: bool = True  # token 0 of img_tokens is CLS (ViT); Swin has none
    sparse_ratio: float = 0.5  # rho: K = ceil(N * rho) patches kept
    aggr_ratio: float = 0.4  # N_c = int(N * aggr_ratio * rho) aggregated tokens
    # preset of the switches below: "code" (official SEPS) or "paper"
    variant: Literal["code", "paper"] = "code"
    # "image" (leak-free) or "caption" (official protocol, leaky)
    dense_pairing: Literal["image", "caption"] = "image"
    detach_selection: bool = False  # True reproduces the official no_grad around selection
    use_dense: bool = True  # False: ignore dense text even if given (LAPS)
    score_mode: Literal["sum", "predictor"] | None = None  # "sum" | "predictor"
    dense_mode: Literal["branch", "guide"] | None = None  # "branch" | "guide"
    aggregation: Literal["shared", "dual"] | None = None  # "shared" | "dual"
    hrpa_topk: int | None = None  # k of the HRPA TopK-MLP terms; 0 disables them
    # "leaky_relu" | "cosine" on the patch-word matrix
    similarity: Literal["leaky_relu", "cosine"] | None = None
    leaky_slope: float = 0.1  # negative slope when similarity == "leaky_relu"
    gumbel: bool | None = None  # straight-through relaxed decisions
    gumbel_tau: float = 1.0  # temperature of the relaxed decisions
    # "sum_masks" | "per_branch" (how RatioLoss combines branches)
    ratio_mode: Literal["sum_masks", "per_branch"] | None = None
    beta: float = 0.25  # paper Eq. (3) attention weight
    joint_score: bool = False  # paper Eq. (3) literally: both branches score with s_st + s_dt together
    caption_chunk: int = 0  # score at most this many captions at a time in eval (0 = all)
    # global image embedding (warm-up, two-stage): "cls" or "mean" of all tokens
    global_pool: Literal["cls", "mean"] = "cls"
    # s_im, the image saliency of selection: cosine with the mean patch (official) or with CLS (needs has_cls)
    saliency: Literal["mean_patch", "cls"] = "mean_patch"

    def check(self) -> None:
        """Checks that need no token geometry (the run config runs them before anything is built): every
        option's type (``TypeError`` naming it) and range (``ValueError`` naming it)."""
        check_config_fields(self)  # types, Literal choices and embed_dim, num_patches >= 1
        for name in ("sparse_ratio", "aggr_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)!r}")
        # tau divides the relaxed logits: 0 makes every gradient of the paper variant NaN
        if not 0 < self.gumbel_tau < math.inf:
            raise ValueError(f"gumbel_tau must be a finite number > 0, got {self.gumbel_tau!r}")
        for name in ("leaky_slope", "beta"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if self.hrpa_topk is not None and self.hrpa_topk < 0:
            raise ValueError(
                f"hrpa_topk must be >= 0 (0 disables the TopK-MLP terms), got {self.hrpa_topk!r}"
            )
        if self.caption_chunk < 0:
            raise ValueError(
                f"caption_chunk must be >= 0 (0 = all captions at once), got {self.caption_chunk!r}"
            )

    def resolved(self) -> SEPSConfig:
        """A copy with every ``None`` switch filled from the variant preset, validated."""
        self.check()
        preset = VARIANT_PRESETS[self.variant]
        cfg = replace(self, **{k: v for k, v in preset.items() if getattr(self, k) is None})
        cfg.check()
        if cfg.saliency == "cls" and not cfg.has_cls:
            raise ValueError("saliency='cls' needs image tokens with a CLS token (has_cls=True)")
        if cfg.num_keep < 1 or cfg.num_aggregated < 1:
            raise ValueError(
                f"num_patches={cfg.num_patches} with sparse_ratio={cfg.sparse_ratio} and "
                f"aggr_ratio={cfg.aggr_ratio} leaves K={cfg.num_keep}, N_c={cfg.num_aggregated} tokens"
            )
        return cfg

    @property
    def num_keep(self) -> int:
        """K = ceil(N * rho) selected patches."""
        return math.ceil(self.num_patches * self.sparse_ratio)

    @property
    def num_aggregated(self) -> int:
        """N_c = int(N * aggr_ratio * rho) aggregated tokens (the official expression)."""
        return int(self.num_patches * self.aggr_ratio * self.sparse_ratio)

    def check_pruned(self, kept: int) -> None:
        """Images pruned at index time to ``kept`` patches need more than K (the fusion token needs
        dropped patches) and at most N."""
        if not self.num_keep < kept <= self.num_patches:
            raise ValueError(
                f"images pruned to {kept} patches: the matcher keeps K={self.num_keep} of "
                f"N={self.num_patches} per pair and needs more than K (the fusion token) and at most N"
            )


@dataclass
class _Branch:
    """One selection branch for a block of captions; tensors are (B_v, T, ...), T = captions or 1."""

    keep: torch.Tensor  # (B_v, T, N) bool
    decision: torch.Tensor  # (B_v, T, N) float, straight-through when Gumbel
    soft: torch.Tensor | None  # (B_v, T, N) relaxed keep probabilities
    aggregated: torch.Tensor  # (B_v, T, N_c, C)
    extra: torch.Tensor  # (B_v, T, C)
    weights: torch.Tensor  # (B_v, T, N, N_c) aggregation weights over the patches (zero where dropped)
    fuse: torch.Tensor  # (B_v, T, N) fusion-token weights over the dropped patches


@dataclass
class _BlockSelection:
    """The selection of all images against a block of captions, before alignment.

    ``aggregated`` / ``extra`` (and their patch weights) are the tokens HRPA aligns with the caption;
    ``decisions`` the branches' masks; ``dense_align`` a dense branch aligned with the dense words instead
    (``branch`` mode, caption-tied); ``dense_sims`` an image-tied dense score added as is.
    """

    aggregated: torch.Tensor  # (B_v, T, N_c, C)
    extra: torch.Tensor  # (B_v, T, C)
    weights: torch.Tensor  # (B_v, T, N, N_c)
    fuse: torch.Tensor  # (B_v, T, N)
    decisions: list[torch.Tensor]
    keeps: list[torch.Tensor]  # (B_v, T|1, N) bool per branch, for explanations
    dense_align: _Branch | None = None
    dense_sims: torch.Tensor | None = None


@dataclass
class SelectionTrace:
    """How one (image, caption) pair was scored, for explanations (:meth:`SEPSMatcher.selection_trace`).

    Attributes:
        branches: (name, (N,) bool kept patches) per selection branch, in ``selection_branches`` order.
        mixture: (N_c + 1, N) patch weights of the image tokens HRPA aligns with the caption besides CLS:
            the aggregated tokens, then the fusion token (each token = mixture row @ raw patches).
        patches: (N, C) the raw patch tokens.
        cls: (C,) the raw CLS token, or None.
    """

    branches: list[tuple[str, torch.Tensor]]
    mixture: torch.Tensor
    patches: torch.Tensor
    cls: torch.Tensor | None


# What changes training only: the scores of an eval-mode forward (hard top-K, no Gumbel noise) are the
# same whatever these are (seps_independent's reference leaves them out for that reason).
_TRAINING_ONLY = {
    "detach_selection": "it only cuts the gradients of patch selection, as the official no_grad does",
    "gumbel": "it only makes the selection's gradients straight-through; evaluation keeps the hard top-K",
    "gumbel_tau": "it is the temperature of the straight-through gradients; evaluation keeps the hard top-K",
    "ratio_mode": "it combines the training ratio loss",
}
_SEPS_PLUGIN = dict(
    pair_chunk=True,
    engine="patchword.eval.engine.seps:SEPSEngine",
    report=("variant",),
    training_only=_TRAINING_ONLY,
)


@register_matcher("seps", SEPSConfig, **_SEPS_PLUGIN)
@register_matcher("laps", SEPSConfig, section="seps", use_dense=False, **_SEPS_PLUGIN)
class SEPSMatcher(Matcher):
    """SEPS / LAPS similarity head over projected image and text tokens.

    ``forward(img_tokens (B_v, L_v, C), cap_tokens (B_t, L_t, C), cap_lens (B_t,), dense_tokens,
    dense_lens)`` with dense tokens (B_v, L_d, C) for ``dense_pairing="image"`` or (B_t, L_d, C) for
    ``"caption"``. Returns :class:`MatcherOutput` with (B_v, B_t) sims and the selection decisions.

    All pairs are scored at once: per-image work (saliency, aggregation logits, score predictor) is done
    once per image and the caption-dependent selection enters as masks, which equals the official
    per-caption loop (see :func:`patchword.testing.seps_reference_scores`).
    """

    @classmethod
    def reads_dense(cls, config: SEPSConfig) -> bool:
        return config.use_dense

    def __init__(self, config: SEPSConfig) -> None:
        super().__init__()
        cfg = config.resolved()
        self.config = cfg
        self.embed_dim = cfg.embed_dim
        self.has_cls = cfg.has_cls
        self.global_pool = cfg.global_pool
        self.consumes_dense = cfg.use_dense  # LAPS: False
        self.dense_pairing = cfg.dense_pairing
        self.num_keep = cfg.num_keep
        self.selection_ratio = cfg.sparse_ratio
        # branch 0 is selected under the caption's guidance, branch 1 (dense text read) under the dense text's
        self.selection_branches = ("caption", "dense") if cfg.use_dense else ("caption",)
        self.ratio_mode = cfg.ratio_mode
        self.aggr_net = TokenAggregation(cfg.embed_dim, cfg.num_aggregated)
        # Dual aggregation (paper Eq. 4) gives the dense-guided selection its own weights W_d.
        self.aggr_net_dense = (
            TokenAggregation(cfg.embed_dim, cfg.num_aggregated) if cfg.aggregation == "dual" else None
        )
        self.scorer = PatchScorer(cfg.embed_dim) if cfg.score_mode == "predictor" else None
        self.hrpa = HRPA(cfg.leaky_slope if cfg.similarity == "leaky_relu" else None, cfg.hrpa_topk)

    # ------------------------------------------------------------------ public API
    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
        *,
        patch_prior: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """(B_v, B_t) similarities and the selection decisions. ``patch_prior`` (B_v, M): images pruned
        at index time to M patches (``img_tokens`` (B_v, [1 +] M, C)) and the image part of their selection
        scores (:func:`~patchword.matching.selection.image_prior` on all patches before pruning).

        Tokens of any float dtype: outside autocast they are cast to the dtype of the matcher's parameters
        first (as ``score_matrix`` scores them); ``sims`` are float32 (float64 for a float64 matcher)."""
        cfg = self.config
        self.validate_images(img_tokens, patch_prior)
        cap_lens = self.validate_text(cap_tokens, cap_lens)
        if not cfg.use_dense:
            dense_tokens = None
        if dense_tokens is not None:
            expected = img_tokens.shape[0] if cfg.dense_pairing == "image" else cap_tokens.shape[0]
            dense_lens = self.validate_text(dense_tokens, dense_lens, "dense_tokens", batch=expected)
        img_tokens, cap_tokens, dense_tokens = self._compute_dtype(img_tokens, cap_tokens, dense_tokens)
        img = _ImageCache.build(self, img_tokens, patch_prior)
        image_dense = None
        if dense_tokens is not None and cfg.dense_pairing == "image":
            image_dense = self._image_tied_dense(img, dense_tokens, dense_lens)

        chunk = cap_tokens.shape[0] if self.training or cfg.caption_chunk <= 0 else cfg.caption_chunk
        sims, decisions = [], []
        for part in caption_blocks(cap_tokens.shape[0], chunk):
            if image_dense is not None:
                dense = image_dense
            elif dense_tokens is not None:
                dense = self._caption_tied_dense(img, dense_tokens[part], dense_lens[part])
            else:
                dense = None
            block_sims, block_decisions = self._score_block(img, cap_tokens[part], cap_lens[part], dense)
            sims.append(block_sims)
            decisions.append(block_decisions)
        decisions = [torch.cat(branch, dim=1) for branch in zip(*decisions, strict=True)]
        if image_dense is not None and image_dense.branch is not None:
            decisions.append(image_dense.branch.decision)  # (B_v, 1, N): depends on the image only
        return MatcherOutput(sims=full_precision(torch.cat(sims, dim=1)), decisions=decisions)

    # ------------------------------------------------------------------ internals
    def _compute_dtype(self, *tokens: torch.Tensor | None) -> list[torch.Tensor | None]:
        """The token tensors in the dtype of the matcher's parameters (float16, bfloat16 or float64 tokens
        given to a float32 matcher are scored as :func:`~patchword.eval.score_matrix` scores them: its
        engine casts them so), unless autocast is on, which casts the products' operands itself (a
        reduced-precision training step passes its tokens as they come)."""
        dtype = self.aggr_net.scale.dtype

        def cast(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None or x.dtype == dtype or autocast_enabled(x.device.type):
                return x
            return x.to(dtype)

        return [cast(x) for x in tokens]

    def validate_images(self, img_tokens: torch.Tensor, patch_prior: torch.Tensor | None = None) -> None:
        """The image checks of :meth:`forward` (shapes only): (B_v, [1 +] N, C) tokens with the matcher's
        patch count N (plus CLS), or, with ``patch_prior`` (B_v, M), an image pruned at index time to M
        patches. Raises ValueError naming what does not fit. Scoring engines make it of a whole job."""
        cfg = self.config
        if patch_prior is None:
            self.validate_image_tokens(img_tokens, cfg.num_patches + int(cfg.has_cls))
            return
        kept = patch_prior.shape[-1]
        cfg.check_pruned(kept)
        self.validate_image_tokens(img_tokens, kept + int(cfg.has_cls))
        check_tensor(patch_prior, "patch_prior", shape=(img_tokens.shape[0], kept))

    def _image_tied_dense(self, img: _ImageCache, tokens: torch.Tensor, lens: torch.Tensor) -> _DenseText:
        """Dense text of each candidate image: its selection (and in "branch" mode its whole score) is
        a per-image quantity, computed once instead of once per caption."""
        cfg = self.config
        words = l2norm(tokens)
        relevance = self._relevance(img, tokens, lens, per_image=True)
        dense = _DenseText(relevance, words, lens)
        if cfg.dense_mode == "guide" and cfg.joint_score:
            return dense  # the joint score mixes in the caption: selection stays per pair
        dense.branch = self._select(img, [relevance], self.aggr_net_dense or self.aggr_net)
        if cfg.dense_mode == "branch":
            # Pair image v with its own description only.
            align = pair_cosines(img.cls, dense.branch.aggregated, dense.branch.extra, words, diagonal=True)
            dense.sims = self.hrpa(align, length_mask(lens, words.shape[1])[:, None, None])  # (B_v, 1)
        return dense

    def _caption_tied_dense(self, img: _ImageCache, tokens: torch.Tensor, lens: torch.Tensor) -> _DenseText:
        """Dense text of each caption's ground-truth image (official protocol): a per-pair quantity."""
        relevance = self._relevance(img, tokens, lens, per_image=False)
        return _DenseText(relevance, l2norm(tokens), lens)

    @staticmethod
    def _relevance(
        img: _ImageCache, tokens: torch.Tensor, lens: torch.Tensor, per_image: bool
    ) -> torch.Tensor:
        """s_t of every patch for the texts ``tokens`` (T, L, C) with lengths ``lens`` (T,): (B_v, T, N),
        or (B_v, 1, N) when ``per_image`` (T = B_v), in float32 whatever the autocast or token dtype.

        It ranks patches for the top-K: in bfloat16 (8 significant bits) the cosines of ~200 patches tie
        at the K-th place for most pairs and rounding, not the text, decides the kept set (see
        :meth:`_ImageCache.build`)."""
        with autocast_off(tokens):
            guide = l2norm(masked_mean(full_precision(tokens), lens))
            return text_relevance(img.patches_unit, guide, per_image)

    def _select_block(
        self, img: _ImageCache, cap_tokens: torch.Tensor, cap_lens: torch.Tensor, dense: _DenseText | None
    ) -> _BlockSelection:
        """Select, aggregate and fuse patches for all images against a block of T captions."""
        cfg = self.config
        s_sparse = self._relevance(img, cap_tokens, cap_lens, per_image=False)
        aggr_dense = self.aggr_net_dense or self.aggr_net
        if dense is not None and cfg.dense_mode == "guide":
            joint = [s_sparse, dense.relevance]
            b_s = self._select(img, joint if cfg.joint_score else [s_sparse], self.aggr_net)
            b_d = dense.branch or self._select(
                img, joint if cfg.joint_score else [dense.relevance], aggr_dense
            )
            decisions = [b_s.decision] if dense.branch is not None else [b_s.decision, b_d.decision]
            return _BlockSelection(
                b_s.aggregated + b_d.aggregated,
                0.5 * (b_s.extra + b_d.extra),
                b_s.weights + b_d.weights,
                0.5 * (b_s.fuse + b_d.fuse),
                decisions,
                [b_s.keep, b_d.keep],
            )
        b_s = self._select(img, [s_sparse], self.aggr_net)
        selection = _BlockSelection(
            b_s.aggregated, b_s.extra, b_s.weights, b_s.fuse, [b_s.decision], [b_s.keep]
        )
        if dense is None:
            return selection
        if dense.sims is not None:  # image-tied "branch" mode: a per-image score, selected once
            selection.dense_sims = dense.sims
            selection.keeps.append(dense.branch.keep)
            return selection
        # "branch" mode with caption-tied dense text: its own selection and alignment, sims added.
        selection.dense_align = self._select(img, [dense.relevance], aggr_dense)
        selection.decisions.append(selection.dense_align.decision)
        selection.keeps.append(selection.dense_align.keep)
        return selection

    def _score_block(
        self, img: _ImageCache, cap_tokens: torch.Tensor, cap_lens: torch.Tensor, dense: _DenseText | None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Score all images against a block of T captions: (B_v, T) sims and per-pair decisions."""
        sel = self._select_block(img, cap_tokens, cap_lens, dense)
        sims = self._align(img, sel.aggregated, sel.extra, l2norm(cap_tokens), cap_lens)
        if sel.dense_sims is not None:
            sims = sims + sel.dense_sims
        if sel.dense_align is not None:
            branch = sel.dense_align
            sims = sims + self._align(img, branch.aggregated, branch.extra, dense.words, dense.lens)
        return sims, sel.decisions

    @torch.no_grad()
    def selection_trace(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
        *,
        patch_prior: torch.Tensor | None = None,
    ) -> SelectionTrace:
        """The selection of one pair, as ``forward`` makes it (eval mode: hard top-K, no Gumbel noise).

        Args:
            img_tokens: (1, L_v, C); cap_tokens: (1, L, C) and cap_lens (1,); dense_tokens: (1, L_d, C)
                and dense_lens (1,), tied to the image, or None; patch_prior: (1, M) for an image pruned
                at index time (see :meth:`forward`), or None.
        """
        if self.training:
            raise ValueError("selection_trace explains the eval-mode selection: call .eval() first")
        cfg = self.config
        cap_lens = self.validate_text(cap_tokens, cap_lens, batch=1)
        self.validate_images(img_tokens, patch_prior)
        img_tokens, cap_tokens, dense_tokens = self._compute_dtype(img_tokens, cap_tokens, dense_tokens)
        img = _ImageCache.build(self, img_tokens, patch_prior)
        dense = None
        if dense_tokens is not None and cfg.use_dense:
            dense_lens = self.validate_text(dense_tokens, dense_lens, "dense_tokens", batch=1)
            if cfg.dense_pairing == "image":
                dense = self._image_tied_dense(img, dense_tokens, dense_lens)
            else:
                dense = self._caption_tied_dense(img, dense_tokens, dense_lens)
        sel = self._select_block(img, cap_tokens, cap_lens, dense)
        mixture = torch.cat([sel.weights[0, 0].T, sel.fuse[0, 0][None]])  # (N_c + 1, N)
        names = self.selection_branches
        branches = [(names[i], keep[0, 0]) for i, keep in enumerate(sel.keeps)]
        return SelectionTrace(branches, mixture, img.patches_sel[0], None if img.cls is None else img.cls[0])

    def _select(self, img: _ImageCache, text_terms: list[torch.Tensor], aggr: TokenAggregation) -> _Branch:
        """Score, select, aggregate and fuse patches for every pair (B_v, T) of the block.

        ``text_terms``: (B_v, T, N) or (B_v, 1, N) float32 relevances (:meth:`_relevance`). The score, the
        top-K decisions and the fusion weights are float32 with autocast off (reduced precision never
        decides which patches are kept); the aggregation and the token products that follow run in the
        precision of the rest of the matcher."""
        cfg = self.config
        with autocast_off(img.patches_sel):
            if img.prior is not None:  # an image pruned at index time
                prior = full_precision(img.prior)
                score = scores_from_prior(prior, text_terms, cfg.score_mode, cfg.beta).detach()
            elif cfg.score_mode == "sum":
                # Official code: s_im + s_t, computed without gradient.
                score = (img.saliency[:, None] + sum(text_terms)).detach()
            else:
                score = combine_paper_scores(img.predicted, img.saliency, text_terms, cfg.beta)
            keep, decision, soft = topk_decisions(
                score, self.num_keep, gumbel=cfg.gumbel, tau=cfg.gumbel_tau, sample=self.training
            )
            fuse = fusion_weights(score, keep)
        weights = aggr.weights(img.aggr_logits[id(aggr)], keep)
        # The float32 fusion weights and decisions back to the dtypes of the products below: needed under
        # precision=bf16, whose bfloat16 einsums take no float32 operand; a no-op in float32 and float64,
        # and under autocast the einsums would cast them down anyway.
        fuse = fuse.to(img.patches_sel.dtype)
        if decision.requires_grad:
            # The identity in the forward pass (the decision is 1 on kept and 0 on dropped patches); it
            # routes the straight-through gradient to the scores.
            weights = weights * decision.to(weights.dtype)[..., None]
            fuse = fuse * (1.0 - decision.to(fuse.dtype))
        aggregated = torch.einsum("vtnk,vnc->vtkc", weights, img.patches_sel)
        extra = torch.einsum("vtn,vnc->vtc", fuse, img.patches_sel)
        return _Branch(keep, decision, soft, aggregated, extra, weights, fuse)

    def _align(
        self,
        img: _ImageCache,
        aggregated: torch.Tensor,
        extra: torch.Tensor,
        words: torch.Tensor,
        lens: torch.Tensor,
    ) -> torch.Tensor:
        """HRPA of [CLS?, aggregated, extra], normalised only now as officially, vs the words: (B_v, T)."""
        align = pair_cosines(img.cls, aggregated, extra, words)
        return self.hrpa(align, length_mask(lens, words.shape[1])[None, :, None])


@dataclass
class _DenseText:
    """Dense captions prepared for one caption block."""

    relevance: torch.Tensor  # (B_v, 1, N) image-tied or (B_v, T, N) caption-tied s_dt
    words: torch.Tensor  # (B_v | T, L_d, C) L2-normalised dense tokens
    lens: torch.Tensor  # (B_v | T,) valid dense lengths
    branch: _Branch | None = None  # image-tied selection, shared by every caption
    sims: torch.Tensor | None = None  # (B_v, 1) image-tied "branch"-mode dense score


@dataclass
class _ImageCache:
    """Per-image tensors computed once per forward and shared by every caption block."""

    cls: torch.Tensor | None  # (B_v, C) raw CLS token
    patches_sel: torch.Tensor  # (B_v, N, C) raw patches feeding selection (detached if configured)
    patches_unit: torch.Tensor  # (B_v, N, C) L2-normalised patches, float32 (or float64)
    saliency: torch.Tensor | None  # (B_v, N) s_im, float32 (None with ``prior``)
    predicted: torch.Tensor | None  # (B_v, N) s_p (paper score predictor), float32
    aggr_logits: dict[int, torch.Tensor]  # id(TokenAggregation) -> (B_v, N, N_c)
    prior: torch.Tensor | None = None  # (B_v, N) image part of the selection score (pruned images)

    @classmethod
    def build(
        cls, matcher: SEPSMatcher, img_tokens: torch.Tensor, prior: torch.Tensor | None = None
    ) -> _ImageCache:
        has_cls = matcher.config.has_cls
        patches = img_tokens[:, int(has_cls) :]
        # detach_selection reproduces the official torch.no_grad() around TokenSparse: selected and
        # fusion tokens carry no gradient to the image encoder (CLS still does).
        patches_sel = patches.detach() if matcher.config.detach_selection else patches
        nets = [net for net in (matcher.aggr_net, matcher.aggr_net_dense) if net is not None]
        pruned = prior is not None  # the image-only terms came with the pruned patches
        centre = saliency_centre(img_tokens, matcher.config.saliency, matcher.config.detach_selection)
        # The image terms of the selection score in float32 with autocast off, whatever the run's
        # precision: in bfloat16 the scores of a ViT-B image's 196 patches tie at the K-th place for most
        # pairs, and the kept set then differs from float32's almost always. (float32 tensors pass through
        # unchanged, float64 stays float64.)
        with autocast_off(patches_sel):
            patches_full = full_precision(patches_sel)
            patches_unit = l2norm(patches_full)
            centre = None if centre is None else full_precision(centre)
            saliency = None if pruned else image_saliency(patches_full, patches_unit, centre)
            scored = matcher.scorer is not None and not pruned
            predicted = matcher.scorer(patches_full) if scored else None
        return cls(
            cls=img_tokens[:, 0] if has_cls else None,
            patches_sel=patches_sel,
            patches_unit=patches_unit,
            saliency=saliency,
            predicted=predicted,
            aggr_logits={id(net): net.logits(patches_sel) for net in nets},
            prior=prior,
        )
