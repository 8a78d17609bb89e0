"""TGDT (Liu et al., TIP 2023): global + token-level similarity, CMC training, two-stage inference.

The matcher scores the outputs of TGDT's region and text transformers, which live in the encoders
(``model.precomp.context`` with a global token on the image side, ``model.text_context`` on the text
side; see :mod:`patchword.encoders.context` and ``configs/tgdt_*.yaml``), so each image and caption is
transformed once however many pairs are scored. With all tokens L2-normalised
(reference/tgdt_ucmfh.md A.4):

* global similarity ``s_g(I, T) = <i_0, t_0>``: the output at position 0 on both sides (the image's
  global slot, the caption's [CLS] / <start>);
* local similarity ``s_l(I, T) = 10 * sum_w max_r <v_r, u_w>`` (TERAN's MrSw, x10 as official) over the
  regions (global slot excluded) and the caption's words: the first ``skip_text_head`` and last
  ``skip_text_tail`` valid positions are dropped (official: [CLS] and '.', [SEP] of BERT, ``1:-2``; the
  defaults 1 and 1 drop <start> and <end> of the word vocabulary) and padding is masked.

Training (``.train()``): ``sims`` is ``s_l`` (the trainer's hinge) and ``extras`` carries the global
embeddings, on which the trainer adds :class:`~patchword.losses.CMCLoss` (``global_loss = "cmc"``).
Evaluation (``.eval()``): ``sims`` is ``s_g`` (``inference="global"``), ``s_l`` (``"local"``) or
``hybrid_alpha * s_g + s_l`` for every pair (``"hybrid"``, i.e. the re-ranking score of the two-stage
search without the shortlist). The two-stage search itself runs through
:func:`patchword.eval.two_stage_scores` as :meth:`TGDTMatcher.two_stage_plan` describes: a global top-k
shortlist per query (50 captions per image, 100 images per caption, as official), re-ranked by
``hybrid_alpha * s_g + s_l``; candidates outside the shortlist are ``-inf`` and a ground truth outside it
is a miss (the official evaluator counts it as rank 0, a hit).

Not reproduced (documented in reference A.7): the official code trains only a second transformer stage
on a frozen, TERAN-pretrained first stage. Here one transformer per modality is trained end to end and,
by default, the same tokens serve training and test; ``local_tokens="stage1"`` (set by ``patchword
import`` for official checkpoints) computes the eval-mode local similarity on the first stage's tokens as
the official test-time forward does (``switch_test()``), the encoders handing over [final, stage 1]
channels (``emit_stage1`` of their context transformers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from patchword.matching.attention import caption_chunks, word_region_scores
from patchword.matching.base import Matcher, MatcherOutput, TwoStagePlan, caption_blocks
from patchword.matching.ops import autocast_off, full_precision, l2norm, masked_mean
from patchword.matching.registry import register_matcher

__all__ = ["TGDTConfig", "TGDTMatcher", "TGDTTokens"]

_INFERENCE = ("global", "local", "hybrid")


@dataclass
class TGDTConfig:
    """Arguments of :class:`TGDTMatcher`; defaults are the official ones where they apply."""

    embed_dim: int = 1024  # C, width of the transformer outputs
    has_cls: bool = True  # token 0 of img_tokens is the global slot (else: global = mean of the regions)
    # caption global embedding: "first" (token 0, official) or "mean"
    text_global: Literal["first", "mean"] = "first"
    local_scale: float = 10.0  # factor of the local similarity (official x10)
    skip_text_head: int = 1  # leading valid text positions left out of s_l (official 1: [CLS])
    skip_text_tail: int = 1  # trailing valid text positions left out (official 2: '.', [SEP]; 1: <end>)
    # eval-mode sims: global | local | hybrid (hybrid_alpha * s_g + s_l)
    inference: Literal["global", "local", "hybrid"] = "hybrid"
    hybrid_alpha: float = 1.0  # weight of s_g in the hybrid score (official: d_g + d_l)
    shortlist_i2t: int = 50  # two-stage: captions kept per image query (official 50)
    shortlist_t2i: int = 100  # two-stage: images kept per caption query (official 100)
    # eval-mode local similarity on the final tokens, or on stage 1's as the official test-time forward
    # (switch_test()); stage1 reads tokens of 2C channels [final, stage 1] (model.*.context.emit_stage1)
    local_tokens: Literal["final", "stage1"] = "final"
    max_pair_elements: int = 1 << 22  # bound on B_v x captions x L x R elements per chunk (0 = no chunks)


def _unit_global(pooled: torch.Tensor) -> torch.Tensor:
    """(N, C) pooled tokens -> unit global embeddings in float32 (float64 stays), normalised with autocast
    off: they give ``s_g``, which picks the two-stage shortlist (a top-k; reduced precision must not)."""
    with autocast_off(pooled):
        return l2norm(full_precision(pooled))


@dataclass
class TGDTTokens:
    """Normalised global and local tokens of a set of images or captions.

    Attributes:
        global_: (N, C) unit global embeddings, float32 (float64 for float64 tokens).
        local: (N, L, C) unit local tokens.
        mask: (N, L) bool, True at the local positions that count (None: all count).
    """

    global_: torch.Tensor
    local: torch.Tensor
    mask: torch.Tensor | None = None


@register_matcher("tgdt", TGDTConfig, engine="patchword.eval.engine.tgdt:TGDTEngine")
class TGDTMatcher(Matcher):
    """TGDT similarity head: global and token-level local similarity of transformer outputs.

    ``forward(img_tokens (B_v, 1 + R, C), cap_tokens (B_t, L, C), cap_lens (B_t,))``; token 0 of the
    images is the global slot when ``has_cls``. Returns :class:`MatcherOutput` with (B_v, B_t) sims and,
    in training mode, ``extras = {"global_img": (B_v, C), "global_txt": (B_t, C)}``.
    """

    global_loss = "cmc"

    consumes_dense = False  # region / global matchers ignore dense text

    @classmethod
    def reads_stage1_tokens(cls, config: object) -> bool:
        return config.local_tokens == "stage1"

    def __init__(self, config: TGDTConfig) -> None:
        super().__init__()
        if config.inference not in _INFERENCE:
            raise ValueError(f"inference must be one of {_INFERENCE}, got {config.inference!r}")
        if config.text_global not in ("first", "mean"):
            raise ValueError(f"text_global must be 'first' or 'mean', got {config.text_global!r}")
        if config.skip_text_head < 0 or config.skip_text_tail < 0:
            raise ValueError("skip_text_head and skip_text_tail must be >= 0")
        if config.shortlist_i2t < 1 or config.shortlist_t2i < 1:
            raise ValueError("shortlist_i2t and shortlist_t2i must be >= 1")
        if config.local_tokens not in ("final", "stage1"):
            raise ValueError(f"local_tokens must be 'final' or 'stage1', got {config.local_tokens!r}")
        self.config = config
        # width of the tokens the encoders hand over: [final, stage 1] channels for stage-1 local tokens
        self.embed_dim = config.embed_dim * (2 if config.local_tokens == "stage1" else 1)
        self.has_cls = config.has_cls

    def _global_and_local(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, L, embed_dim) -> (tokens the global embedding reads, tokens the local similarity reads),
        (N, L, C) each: the final tokens both, except stage 1's for the local similarity in eval mode."""
        if self.config.local_tokens == "final":
            return tokens, tokens
        final, stage1 = tokens.split(self.config.embed_dim, dim=-1)
        return final, final if self.training else stage1

    # ------------------------------------------------------------------ tokens
    def image_tokens(self, img_tokens: torch.Tensor) -> TGDTTokens:
        """(B_v, L_v, C) -> global (B_v, C) and regions (B_v, R, C), unit norm."""
        self.validate_image_tokens(img_tokens)
        final, local = self._global_and_local(img_tokens)
        if self.has_cls:  # validate_image_tokens refused a global slot without a region
            return TGDTTokens(_unit_global(final[:, 0]), l2norm(local[:, 1:]))
        return TGDTTokens(_unit_global(final.mean(dim=1)), l2norm(local))

    def text_tokens(self, cap_tokens: torch.Tensor, cap_lens: object) -> TGDTTokens:
        """(B_t, L, C), (B_t,) -> global (B_t, C), words (B_t, L, C) unit norm, and the word mask."""
        lens = self.validate_text(cap_tokens, cap_lens)
        cfg = self.config
        final, local = self._global_and_local(cap_tokens)
        glob = final[:, 0] if cfg.text_global == "first" else masked_mean(final, lens)
        pos = torch.arange(cap_tokens.shape[1], device=cap_tokens.device)[None]
        mask = (pos >= cfg.skip_text_head) & (pos < (lens - cfg.skip_text_tail)[:, None])
        return TGDTTokens(_unit_global(glob), l2norm(local), mask)

    def global_image(self, img_tokens: torch.Tensor) -> torch.Tensor:
        return full_precision(self.image_tokens(img_tokens).global_)

    def global_text(self, cap_tokens: torch.Tensor, cap_lens: object) -> torch.Tensor:
        return full_precision(self.text_tokens(cap_tokens, cap_lens).global_)

    # ------------------------------------------------------------------ similarities
    def local_scores(self, img: TGDTTokens, txt: TGDTTokens) -> torch.Tensor:
        """``s_l`` of every image against every caption: (B_v, B_t), computed in caption chunks."""
        regions, words, mask = img.local, txt.local.to(img.local.dtype), txt.mask
        n_img, n_reg = regions.shape[:2]
        n_txt, n_word = words.shape[:2]
        step = caption_chunks(n_img, n_txt, n_word * n_reg, self.config.max_pair_elements)
        out = []
        for part in caption_blocks(n_txt, step):
            best = word_region_scores(regions, words[part]).amax(-1)  # (B_v, T, L)
            if mask is not None:
                best = best * mask[part].to(best.dtype)[None]
            out.append(best.sum(-1))
        return self.config.local_scale * torch.cat(out, dim=1)

    def paired_scores(
        self, img_tokens: torch.Tensor, cap_tokens: torch.Tensor, cap_lens: object
    ) -> torch.Tensor:
        """Eval-mode ``sims`` of P given pairs, image row p with caption row p: (P,) (two-stage re-ranking).

        Equal to ``forward(...).sims.diagonal()`` without scoring the P x P cross pairs.
        """
        img = self.image_tokens(img_tokens)
        txt = self.text_tokens(cap_tokens, cap_lens)
        if img.global_.shape[0] != txt.global_.shape[0]:
            raise ValueError(
                f"img_tokens and cap_tokens must hold the same number of pairs, got "
                f"{img.global_.shape[0]} and {txt.global_.shape[0]}"
            )
        with autocast_off(img.global_):
            glob = (img.global_ * txt.global_.to(img.global_.dtype)).sum(-1)
        if self.config.inference == "global":
            return glob
        best = torch.einsum("prc,plc->plr", img.local, txt.local.to(img.local.dtype)).amax(-1)  # (P, L)
        local = full_precision(self.config.local_scale * (best * txt.mask.to(best.dtype)).sum(-1))
        return local if self.config.inference == "local" else self.config.hybrid_alpha * glob + local

    def forward(
        self,
        img_tokens: torch.Tensor,
        cap_tokens: torch.Tensor,
        cap_lens: torch.Tensor,
        dense_tokens: torch.Tensor | None = None,
        dense_lens: torch.Tensor | None = None,
    ) -> MatcherOutput:
        """Score every image against every caption.

        Args:
            img_tokens: (B_v, L_v, C) image transformer outputs, global slot first when ``has_cls``.
            cap_tokens: (B_t, L, C) text transformer outputs; ``cap_lens`` (B_t,) valid counts.
            dense_tokens, dense_lens: ignored.

        Returns:
            :class:`MatcherOutput`: training: ``sims = s_l`` and the global embeddings in ``extras``;
            evaluation: ``sims`` as ``inference`` says. ``sims`` and the global embeddings are float32
            (float64 for float64 tokens) whatever the token dtype or autocast; ``s_g``, which picks the
            two-stage shortlist, is computed in full precision with autocast off.
        """
        img = self.image_tokens(img_tokens)
        txt = self.text_tokens(cap_tokens, cap_lens)
        if self.training:
            sims = full_precision(self.local_scores(img, txt))
            return MatcherOutput(sims=sims, extras={"global_img": img.global_, "global_txt": txt.global_})
        mode = self.config.inference
        with autocast_off(img.global_):
            glob = img.global_ @ txt.global_.to(img.global_.dtype).T
        if mode == "global":
            return MatcherOutput(sims=glob)
        local = full_precision(self.local_scores(img, txt))
        return MatcherOutput(sims=local if mode == "local" else self.config.hybrid_alpha * glob + local)

    # ------------------------------------------------------------------ two-stage search
    def with_inference(self, inference: str) -> TGDTMatcher:
        """A copy scoring with another ``inference`` mode (the matcher has no parameters to share)."""
        return TGDTMatcher(replace(self.config, inference=inference)).train(self.training)

    def two_stage_plan(self) -> TwoStagePlan | None:
        """How to run TGDT's two-stage search with :func:`patchword.eval.two_stage_scores`, or None.

        With ``inference="hybrid"`` the shortlists come from ``global_embed`` (``s_g``), the fine matcher
        is this one in ``"local"`` mode and ``alpha = hybrid_alpha``, so shortlisted pairs score
        ``hybrid_alpha * s_g + s_l`` (official: ``d_g + d_l``, top 50 captions per image, top 100 images
        per caption). Other modes rank every candidate (None).
        """
        if self.config.inference != "hybrid":
            return None
        cfg = self.config
        return TwoStagePlan(
            self.with_inference("local"), cfg.shortlist_i2t, cfg.shortlist_t2i, cfg.hybrid_alpha
        )

    def pair_memory_bytes(self, img_len: int, txt_len: int, dense_len: int, dim: int) -> int:
        """Working bytes per pair in :meth:`forward`: the (L, R) score block and its reductions."""
        return 3 * 4 * img_len * txt_len
