"""Per-image work and the alignment of blocks of pairs of the SEPS / LAPS scoring engine
(:mod:`patchword.eval.engine.seps`, whose docstring gives the notation): saliency, aggregation logits and
E = exp(logits - max) once per image, the top-K selection of a block of pairs, the aggregation weights
Omega, and HRPA from the token-word cosines in the three exact formulations."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from patchword.eval.engine.base import tf32_products
from patchword.eval.engine.seps_blocks import ImageBlock, ImagePart, Selection, Texts, TokenSet
from patchword.eval.engine.staging import host, is_accelerator
from patchword.matching.aggregation import TokenAggregation
from patchword.matching.ops import l2norm
from patchword.matching.selection import (
    combine_paper_scores,
    fusion_weights,
    image_prior,
    image_saliency,
    saliency_centre,
    scores_from_prior,
)

__all__ = ["SEPSAlignment"]

# Above this logit range (max - min over an image's patches) exp(Lg - max) could leave the normal float
# range (exp(-87) is the smallest normal float32), so that image falls back to the per-pair softmax.
_EXP_RANGE = 80.0


class SEPSAlignment:
    """The arithmetic of :class:`~patchword.eval.engine.seps.SEPSEngine` (a mixin: it reads the engine's
    ``cfg``, ``n``, ``k``, ``n_c``, ``has_cls``, ``aggr``, ``aggr_dense`` and ``matcher``)."""

    def _images(self, img_tokens: torch.Tensor, prior: torch.Tensor | None = None) -> ImageBlock:
        """Per-image tensors of a block of (B, L_v, C) tokens; with ``prior`` (B, N), images pruned at
        index time and the image-only part of their selection scores (saliency and predictor unused)."""
        cls_tok = img_tokens[:, 0] if self.has_cls else None
        patches = img_tokens[:, int(self.has_cls) :].contiguous()
        unit = l2norm(patches)
        logits_t, exp_t, flags = {}, {}, {}
        for net in {id(self.aggr): self.aggr, id(self.aggr_dense): self.aggr_dense}.values():
            lg = net.logits(patches).transpose(1, 2).contiguous()  # (B, N_c, N): the MLP once per image
            top = lg.amax(dim=2, keepdim=True)
            logits_t[id(net)] = lg
            exp_t[id(net)] = torch.exp(lg - top)
            flags[id(net)] = (top.squeeze(2) - lg.amin(dim=2)).amax(dim=1) < _EXP_RANGE
        # the flags of every net read on the host at once: one wait for the device per image block; the
        # first block of a call also reads the finiteness of the call's inputs (engine.check_inputs)
        pending, self._pending_check = getattr(self, "_pending_check", None), None
        values = list(flags.values())
        if pending is not None:
            values.append(pending.flag.expand_as(values[0]))
        read = torch.stack(values).tolist()
        if pending is not None:
            pending.settle(all(read.pop()))
        stable = dict(zip(flags, read, strict=True))
        scorer = self.matcher.scorer if prior is None else None
        return ImageBlock(
            patches=patches,
            unit=unit,
            saliency=None
            if prior is not None
            else image_saliency(patches, unit, saliency_centre(img_tokens, self.cfg.saliency, detach=False)),
            predicted=scorer(patches) if scorer is not None else None,
            prior=prior,
            logits_t=logits_t,
            exp_t=exp_t,
            stable=stable,
            gram_=None,
            cls=l2norm(cls_tok) if cls_tok is not None else None,
        )

    @torch.no_grad()
    def patch_priors(self, img_tokens: torch.Tensor, *, device, block: int = 64) -> torch.Tensor:
        """(N_img, N) float32: the image-only part of every patch's selection score (``image_prior``) of
        (N_img, L_v, C) unpruned image tokens, in blocks of ``block`` images: what index-time pruning
        ranks patches by and keeps for the kept ones (``ScoringInputs.patch_prior``)."""
        self.n = self.cfg.num_patches
        dtype = self.aggr.scale.dtype
        shape = (img_tokens.shape[0], img_tokens.shape[1] - int(self.has_cls))
        out = torch.empty(shape, dtype=torch.float32, device=device)  # copied back once
        for i0 in range(0, img_tokens.shape[0], block):
            img = self._images(img_tokens[i0 : i0 + block].to(device=device, dtype=dtype))
            prior = image_prior(img.saliency, img.predicted, self.cfg.score_mode, self.cfg.beta)
            out[i0 : i0 + block] = prior.float()
        return host(out)

    def _scores(self, img: ImageBlock, terms: list[torch.Tensor]) -> torch.Tensor:
        """Selection scores of every pair, exactly as ``SEPSMatcher._select``: (B, T, N). On images
        pruned at index time, the precomputed image part plus the text terms, min-max normalised (paper
        variant) over the kept patches: an approximation (docs/search.md, "Index-time patch pruning")."""
        if img.prior is not None:
            return scores_from_prior(img.prior, terms, self.cfg.score_mode, self.cfg.beta)
        if self.cfg.score_mode == "sum":
            return img.saliency[:, None] + sum(terms)
        return combine_paper_scores(img.predicted, img.saliency, terms, self.cfg.beta)

    def _select(self, score: torch.Tensor, net: TokenAggregation) -> tuple[Selection, torch.Tensor]:
        """Top-K of the pair scores (B, T, N) -> the selection and the fusion weights (B, T, N)."""
        if self.k < self.n:
            idx = score.topk(self.k, dim=-1, sorted=False).indices
            keep = torch.zeros(score.shape, dtype=torch.bool, device=score.device).scatter_(-1, idx, True)
        else:
            idx = torch.arange(self.n, device=score.device).expand(score.shape)
            keep = torch.ones(score.shape, dtype=torch.bool, device=score.device)
        return Selection(idx, keep, net), fusion_weights(score, keep)

    def _aggregation(
        self,
        img: ImageBlock,
        keep: torch.Tensor,
        net: TokenAggregation,
        normalise: bool,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T, N_c, N) aggregation weights of the block's pairs (softmax over the kept patches).

        Unnormalised (each row scaled by its Z, which cancels under L2 normalisation) unless asked.
        Written into ``out`` when given (a view of Omega: no temporary).
        """
        key = id(net)
        mask = keep[:, :, None, :].to(img.patches.dtype)
        exp_t = img.exp_t[key][:, None]  # (B, 1, N_c, N)
        w = torch.mul(exp_t, mask, out=out) if out is not None else exp_t * mask
        if normalise:
            w.div_(w.sum(dim=3, keepdim=True))
        for b, stable in enumerate(img.stable[key]):
            if not stable:  # logits far apart, E could underflow: the exact masked softmax, as the forward
                logits = img.logits_t[key][b][None].masked_fill(~keep[b][:, None, :], -math.inf)
                w[b] = torch.softmax(logits, dim=2)
        return w

    def _gathered(self, img: ImageBlock, sel: Selection, normalise: bool) -> torch.Tensor:
        """(B, T, N_c, K) aggregation weights of the kept patches ``sel.idx`` only (softmax over them)."""
        key = id(sel.net)
        b, t, k = sel.idx.shape
        rows = self._flat_rows(sel.idx)  # (B * T * K,)
        exp = img.exp_t[key].transpose(1, 2).reshape(-1, self.n_c)  # (B * N, N_c)
        w = exp.index_select(0, rows).view(b, t, k, -1).transpose(2, 3)
        if normalise:
            w = w / w.sum(dim=3, keepdim=True)
        for i, stable in enumerate(img.stable[key]):
            if not stable:
                logits = img.logits_t[key][i].index_select(1, sel.idx[i].reshape(-1)).view(-1, t, k)
                w[i] = torch.softmax(logits.transpose(0, 1), dim=2)
        return w

    def _flat_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Patch indices (B, T, K) -> rows of the block's (B * N, ...) per-patch tensors."""
        offsets = torch.arange(idx.shape[0], device=idx.device)[:, None, None] * self.n
        return (idx + offsets).reshape(-1)

    def _part(self, img: ImageBlock, score: torch.Tensor) -> ImagePart:
        """The image-only dense token sets of the block from its (B, 1, N) dense selection scores."""
        sel, fusion = self._select(score, self.aggr_dense)
        weights = self._aggregation(img, sel.keep, self.aggr_dense, normalise=True)[:, 0]  # (B, N_c, N)
        return ImagePart(weights, torch.bmm(weights, img.patches), fusion[:, 0])

    def _weights(self, img: ImageBlock, ts: TokenSet) -> torch.Tensor:
        """Omega (B, T, N_c + 1, N): every image token of the block's pairs as weights over patches."""
        b, t = ts.fusion.shape[:2]
        n_c = self.n_c
        omega = torch.empty(b, t, n_c + 1, self.n, dtype=ts.fusion.dtype, device=ts.fusion.device)
        agg = omega[:, :, :n_c]
        for i, sel in enumerate(ts.branches):
            if i == 0:
                self._aggregation(img, sel.keep, sel.net, normalise=not ts.single, out=agg)
            else:
                agg.add_(self._aggregation(img, sel.keep, sel.net, normalise=True))
        if ts.part is not None:
            agg.add_(ts.part.weights[:, None])
        omega[:, :, n_c].copy_(ts.fusion)
        return omega

    # ------------------------------------------------------------------ alignment (B images x T texts)
    def _align(self, img: ImageBlock, ts: TokenSet, txt: Texts, form: str) -> torch.Tensor:
        """HRPA of the block's pairs (token set ``ts``) with a text block: (B, T) similarities.

        The selection is made by then: with ``precision="tf32"`` on an accelerator, these products (the
        bulk of the arithmetic) use TF32; the relevance products that rank patches stay float32."""
        with tf32_products(self.precision == "tf32" and is_accelerator(img.patches.device)):
            return self._align_products(img, ts, txt, form)

    def _align_products(self, img: ImageBlock, ts: TokenSet, txt: Texts, form: str) -> torch.Tensor:
        b, t, n = img.patches.shape[0], txt.size, self.n
        length = txt.words.shape[1]
        if form == "kdirect":
            tok = self._cosines_kept(img, ts, txt)
        elif form == "gram":
            omega = self._weights(img, ts)  # (B, T, M', N)
            q = torch.matmul(img.patches, txt.flat.T)  # (B, N, T * L): one GEMM for the whole block
            qt = q.view(b, n, t, length).permute(0, 2, 3, 1).contiguous()  # (B, T, L, N)
            tok = torch.matmul(qt, omega.transpose(2, 3))  # (B, T, L, M') token-word dot products
            sq = torch.bmm(omega.view(b, -1, n), img.gram).view_as(omega).mul_(omega).sum(dim=3)  # (B, T, M')
            tok.mul_(sq.clamp_min(0).sqrt().clamp_min(1e-12).reciprocal()[:, :, None, :])
        else:
            omega = self._weights(img, ts)
            tokens = torch.bmm(omega.view(b, -1, n), img.patches).view(b, t, omega.shape[2], -1)  # (B,T,M',C)
            tok = self._cosines(tokens, txt)
        cls = None if img.cls is None else (img.cls @ txt.flat.T).view(b, t, length)  # (B, T, L)
        return self._hrpa(tok, cls, txt)

    def _cosines(self, tokens: torch.Tensor, txt: Texts) -> torch.Tensor:
        """Raw tokens (B, T, M, C) -> cosines with the words (B, T, L, M)."""
        inv = torch.linalg.vector_norm(tokens, dim=-1).clamp_min(1e-12).reciprocal()  # (B, T, M)
        words_t = txt.words.transpose(1, 2)  # (T, C, L), shared by the images
        b, t, m, c = tokens.shape
        if is_accelerator(tokens.device) and m < words_t.shape[2]:
            # One product batched over the texts, the images' tokens as rows: it copies the tokens once
            # (M x C per pair) where the broadcast product below copies each text's words once per
            # image (C x L per pair): dense texts are longer than the M token set.
            rows = tokens.transpose(0, 1).reshape(t, b * m, c)  # (T, B * M, C)
            cos = torch.bmm(rows, words_t).view(t, b, m, -1).transpose(0, 1)  # (B, T, M, L) view
        elif is_accelerator(tokens.device):  # one broadcast product: one launch for the whole block
            cos = torch.matmul(tokens, words_t)
        else:  # one bmm per image (measured faster on the CPU than the broadcast copy of the words)
            cos = torch.stack([torch.bmm(tokens[i], words_t) for i in range(tokens.shape[0])])  # (B,T,M,L)
        return cos.mul_(inv[..., None]).transpose(2, 3)

    def _cosines_kept(self, img: ImageBlock, ts: TokenSet, txt: Texts) -> torch.Tensor:
        """(B, T, L, N_c + 1) cosines from raw tokens that aggregate only each pair's K kept patches
        (gathered rows of P: half the FLOPs of the masked product at K = N / 2)."""
        b, t = ts.fusion.shape[:2]
        c = img.patches.shape[2]
        flat_p = img.patches.reshape(-1, c)
        agg = None
        for sel in ts.branches:
            kept = flat_p.index_select(0, self._flat_rows(sel.idx)).view(b * t, -1, c)  # (B*T, K, C)
            w = self._gathered(img, sel, normalise=not ts.single).reshape(b * t, self.n_c, -1)
            part = torch.bmm(w, kept)  # (B*T, N_c, C)
            agg = part if agg is None else agg.add_(part)
        agg = agg.view(b, t, self.n_c, c)
        if ts.part is not None:
            agg.add_(ts.part.tokens[:, None])
        fus = torch.bmm(ts.fusion, img.patches)[:, :, None, :]  # (B, T, 1, C)
        return self._cosines(torch.cat([agg, fus], dim=2), txt)  # (B, T, L, N_c + 1)

    def _hrpa(self, tok: torch.Tensor, cls: torch.Tensor | None, txt: Texts) -> torch.Tensor:
        """``HRPA.forward`` on [CLS?, tokens] x words from the parts: (B, T, L, M'), (B, T, L) -> (B, T)."""
        hrpa = self.matcher.hrpa
        valid = txt.valid  # (T, L)
        word_best = tok.amax(dim=3)  # (B, T, L)
        patch_best = tok.masked_fill(~valid[:, :, None], -math.inf).amax(dim=2)  # (B, T, M')
        if cls is not None:
            word_best = torch.maximum(word_best, cls)
            cls_best = cls.masked_fill(~valid, -math.inf).amax(dim=2, keepdim=True)
            patch_best = torch.cat([cls_best, patch_best], dim=2)
        if hrpa.leaky_slope is not None:
            # LeakyReLU is monotone: the max of the activations is the activation of the max.
            word_best = F.leaky_relu(word_best, hrpa.leaky_slope)
            patch_best = F.leaky_relu(patch_best, hrpa.leaky_slope)
        sims = (word_best * valid).sum(dim=-1) / txt.n_words + patch_best.mean(dim=-1)
        if hrpa.word_topk is not None:
            sims = sims + hrpa.word_topk(word_best, valid.expand_as(word_best))
            sims = sims + hrpa.patch_topk(patch_best)
        return sims

    @staticmethod
    def _relevance(img: ImageBlock, guide: torch.Tensor) -> torch.Tensor:
        """``text_relevance(img.unit, guide, per_image=False)``, (B, T, N), as one matrix product: the
        einsum decomposes into a dozen ops, each a launch on an accelerator."""
        return torch.matmul(img.unit, guide.T).transpose(1, 2)
