"""Exact fast scoring engine of SEPS / LAPS (every variant and switch of :class:`SEPSMatcher`).

Notation, for one image: raw patches P (N, C) (CLS excluded), its Gram matrix G = P P^T (N, N) and, per
aggregation net, logits Lg (N, N_c) (the official MLP, run once per image) with E = exp(Lg - max_n Lg).
A pair (image, text) keeps the top-K patches of its selection score (mask ``keep``); its aggregated
token k and its fusion token are

    a_k = sum_n Omega_kn P_n,   Omega_kn = keep_n E_nk / Z_k,  Z_k = sum_n keep_n E_nk  (masked softmax)
    f   = sum_n phi_n P_n,      phi = softmax of the scores over the dropped patches

so every image token of a pair is a row of a weight matrix Omega (N_c + 1, N) times P. HRPA needs only the
cosines between these tokens and the unit words W (L, C) of the text. Three exact formulations, the
cheapest chosen per text block by a cost model (``formulation="auto"``):

* ``"gram"`` (short texts such as captions, the reformulation of reference/synthetic_calibration.md):
  Q = P W^T for the whole block in one GEMM, numerators Q Omega^T, squared token norms
  diag(Omega G Omega^T) from the image's Gram matrix: the (pairs, N_c, C) aggregated tokens are never
  formed. Per pair ~2 L C N + 2 (N_c + 1) N (N + L) FLOPs (~6.8 M at ViT-224, C = 512, L = 17).
* ``"kdirect"`` (long texts such as dense captions): the aggregated tokens from the K kept patches only
  (a row gather of P and a batched GEMM: half the FLOPs of the masked product at K = N / 2), then the
  cosines with the words. Per pair ~2 N_c K C + 2 (N_c + 1) C L FLOPs (~8.6 M at L = 115).
* ``"direct"``: the tokens Omega P as one GEMM over all N patches, then the cosines (no gather; best
  for small widths).

Omega is built from the per-image E by a masked product (no per-pair MLP or exp). For a single selection
branch the normaliser Z cancels under the tokens' L2 normalisation and is skipped; with two branches
(paper "guide" mode: the sparse and dense aggregations are summed) it is kept. The max-shift of E is per
image: an image whose logit range exceeds ``_EXP_RANGE`` (E could underflow) gets the exact per-pair
masked softmax instead.

Everything that depends only on the image (saliency, paper score predictor, logits, E, G, the image-tied
dense branch) is computed once per image, everything that depends only on a text (unit words, global
vector) once per text block. Dense text tied to captions (the official, leaky protocol) is scored once
per distinct dense text (the 5 captions of an image share one) and gathered. HRPA takes its maxima
before the LeakyReLU (monotone, so exact) and calls the matcher's own TopK-MLP modules (paper variant).

Images pruned at index time (``ScoringInputs.patch_prior``, :mod:`patchword.search.pruning`) hold M < N
patches: N is taken from the job (``_bind``), and the image part of the selection score is the stored
prior instead of the saliency / predictor computed here; the result equals the matcher's forward on the
same pruned tokens and priors.

Selection ties at the K-th score may resolve differently from the forward pass (as they do in the
forward itself between different batchings); everything else equals the forward to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from patchword.eval.engine.core import BlockPlan, ScoringEngine, ScoringInputs
from patchword.eval.engine.memory import largest_fitting
from patchword.eval.engine.seps_blocks import (
    MIN_BUCKET,
    ImageBlock,
    ImagePart,
    PackedTexts,
    Selection,
    Texts,
    TokenSet,
    length_blocks,
)
from patchword.eval.engine.staging import Staged, host, is_accelerator, row_buffer, stage
from patchword.eval.engine.workers import engine_plan, in_workers
from patchword.matching.aggregation import TokenAggregation
from patchword.matching.ops import l2norm, masked_mean
from patchword.matching.selection import (
    combine_paper_scores,
    fusion_weights,
    image_prior,
    image_saliency,
    saliency_centre,
    scores_from_prior,
    text_relevance,
)
from patchword.matching.seps import SEPSMatcher
from patchword.progress import progress_bar

__all__ = ["SEPSEngine"]

# Above this logit range (max - min over an image's patches) exp(Lg - max) could leave the normal float
# range (exp(-87) is the smallest normal float32), so that image falls back to the per-pair softmax.
_EXP_RANGE = 80.0
_F32 = 4
_I64 = 8
# The exact formulations (module docstring); "auto" picks the cheapest per text block.
_FORMS = ("gram", "direct", "kdirect")
# Cost-model weights, in GEMM FLOPs (measured on the 2-core CPU): a gathered float (row gathers run at
# ~10-18 GB/s, GEMMs at ~45 GFLOP/s per core), and the slowdown of per-pair small matrix products.
_GATHER_FLOPS = 20
_SMALL_BMM = 1.5
# Pair tensors of one block are kept under this many bytes even when the budget allows more: larger
# blocks fall out of the caches and run slower (measured), without amortising anything more.
_WORKING_SET = 64 << 20
# On an accelerator the cost of a block is its launches (~100 ops) and the host waiting for the device, not
# its caches: blocks are as large as the budget allows, up to these many images and texts, and length
# buckets hold at least _ACCEL_BUCKET texts (sorted by length, so the padding they add stays small).
_ACCEL_IMAGES = 256
_ACCEL_TEXTS = 2048
_ACCEL_DENSE_TEXTS = 1024
_ACCEL_BUCKET = 512
# On an accelerator, image-tied dense text is scored for groups of this many images at once: the (G, G)
# block of the group's images with the group's descriptions, whose diagonal is kept (``_image_dense``).
_DIAGONAL_GROUP = 16
# On an accelerator "kdirect" is left out: its per-pair row gathers ran slowest on an H200 (Flickr30K
# shape, SEPS code variant: gram 1.75 s, direct 1.83 s, kdirect 2.42 s; docs/benchmarks.md, "GPU"), and the
# CPU cost model's choice between the other two matched the measurement (gram for captions, direct for
# dense captions).
_ACCEL_FORMS = ("gram", "direct")
# Dense texts per chunk when their guides are computed once per call (caption-tied "guide" mode).
_GUIDE_CHUNK = 64


class SEPSEngine(ScoringEngine):
    """Fast exact scorer of :class:`~patchword.matching.seps.SEPSMatcher` (see the module docstring).

    Args:
        matcher: the SEPS / LAPS matcher (any variant and switches).
        formulation: ``"auto"`` (cost model per text block), ``"gram"`` or ``"direct"`` (forced; both
            exact, used by the tests).
        max_image_block: images per block at most.
        text_cache: compute every caption's unit words once per call (None: when they fit a quarter of
            the budget; False: per block, as with a tiny budget).
        dense_pass: score caption-tied dense text in a pass of its own, each dense text block built
            once (None: when its (N_img, N_dense) scores fit a quarter of the budget).
        workers: on the CPU, threads that take image blocks from a shared queue, each single-threaded
            with its share of the memory budget (None: one per torch thread; 1: one thread of control
            whose ops use torch's intra-op threads, which degrades badly when another process holds a
            core, see :func:`in_workers`). Accelerators always use one.
    """

    name = "seps"
    prunable = True

    def __init__(
        self,
        matcher: SEPSMatcher,
        formulation: str = "auto",
        max_image_block: int = 16,
        *,
        text_cache: bool | None = None,
        dense_pass: bool | None = None,
        workers: int | None = None,
    ) -> None:
        super().__init__(matcher)
        self.text_cache = text_cache
        self.dense_pass = dense_pass
        self.workers = workers
        if formulation not in ("auto",) + _FORMS:
            raise ValueError(f"formulation must be 'auto' or one of {_FORMS}, got {formulation!r}")
        cfg = matcher.config
        self.cfg = cfg
        self.formulation = formulation
        self.max_image_block = max_image_block
        self.n = cfg.num_patches
        self.k = cfg.num_keep
        self.n_c = cfg.num_aggregated
        self.dim = cfg.embed_dim
        self.has_cls = cfg.has_cls
        self.aggr = matcher.aggr_net
        self.aggr_dense = matcher.aggr_net_dense or matcher.aggr_net
        self._cache: PackedTexts | None = None  # unit words of all captions during a call, if they fit
        # during a call: the formulation of every caption block (accelerators: the plan's, one for all;
        # None: chosen per block) and the guides of caption-tied dense texts ("guide" mode)
        self._caption_form: str | None = None
        self._dense_guide: torch.Tensor | None = None
        self._accelerator = False  # whether the job planned last computes on an accelerator

    # ------------------------------------------------------------------ modes, costs, memory plan
    def _mode(self, inputs: ScoringInputs) -> str:
        """sparse | image_branch | caption_branch | image_guide | pair_guide (how dense text enters)."""
        cfg = self.cfg
        if inputs.dense_tokens is None:
            return "sparse"
        tied = "caption" if inputs.dense_index is not None else "image"
        if cfg.dense_mode == "branch":
            return f"{tied}_branch"
        if tied == "image" and not cfg.joint_score:
            return "image_guide"
        return "pair_guide"

    def flops_per_pair(self, form: str, length: int, branches: int = 1) -> float:
        """Cost model: FLOP-equivalents of aligning one pair with a text of ``length`` words.

        GEMM FLOPs; per-pair small matrix products count ``_SMALL_BMM`` times (they run well below the
        big GEMMs' rate), gathered floats ``_GATHER_FLOPS`` and built weights 4 (measured on the CPU).
        """
        n, k, n_c, c, m = self.n, self.k, self.n_c, self.dim, self.n_c + 1
        cls = 2 * length * c
        if form == "gram":
            return (
                2 * length * c * n
                + 2 * m * n * n
                + _SMALL_BMM * 2 * m * n * length
                + cls
                + 4 * branches * m * n
            )
        if form == "direct":
            return 2 * m * c * n + _SMALL_BMM * 2 * m * c * length + cls + 4 * branches * m * n
        small = branches * 2 * n_c * k * c + 2 * m * c * length
        return _SMALL_BMM * small + 2 * n * c + cls + _GATHER_FLOPS * branches * (k * c + k * n_c)

    def _form(self, length: int, branches: int = 1, texts_per_image: int | None = None) -> str:
        """The cheapest formulation for texts of ``length`` words. With ``texts_per_image``, "gram" also
        pays its share of the per-image Gram matrices (2 N^2 C FLOPs shared by the image's texts): nothing
        when an evaluation scores hundreds of captions per image, the whole of it in a search (1 caption
        against 100 images at ViT-B/16 shapes: "direct" 25% faster, docs/benchmarks.md)."""
        if self.formulation != "auto":
            return self.formulation
        setup = 0.0 if texts_per_image is None else 2 * self.n * self.n * self.dim / max(1, texts_per_image)
        return min(
            _ACCEL_FORMS if self._accelerator else _FORMS,
            key=lambda form: self.flops_per_pair(form, length, branches) + (setup if form == "gram" else 0.0),
        )

    def _pair_bytes(self, form: str, length: int, branches: int = 1) -> int:
        """Upper bound of the working bytes per pair of one image's alignment with a text block."""
        n, k, n_c, c, m = self.n, self.k, self.n_c, self.dim, self.n_c + 1
        floats = 8 * n + 6 * length + 5 * m * length  # scores, fusion, cosines and HRPA temporaries
        if form == "kdirect":
            floats += branches * (k * c + 3 * k * n_c) + 2 * n_c * c + 2 * c
        else:
            floats += (2 + branches) * m * n  # Omega and its masked-product / normalisation temporaries
            floats += length * n + 2 * m * n if form == "gram" else m * c  # Q, Omega G | tokens
        return _F32 * floats + branches * (_I64 * k + 2 * n)

    def _image_bytes(self, mode: str, dense_len: int) -> int:
        n, n_c, c = self.n, self.n_c, self.dim
        nets = 2 if self.matcher.aggr_net_dense is not None else 1
        floats = 3 * n * c + n * n + 6 * n + 2 * c + nets * 4 * n * n_c  # patches, unit, G, E, logits...
        if mode in ("image_branch", "image_guide", "pair_guide"):
            floats += 3 * dense_len * c + 2 * n_c * n + 2 * n  # its dense words, part
            floats += max(self._pair_bytes(f, dense_len) for f in _FORMS) // _F32 + n_c * c
        return _F32 * floats

    def _bind(self, inputs: ScoringInputs) -> None:
        """Take the patch count N of this job: the matcher's, or M for images pruned at index time
        (``inputs.patch_prior``). An engine scores one job at a time."""
        if inputs.patch_prior is None:
            self.n = self.cfg.num_patches
            return
        kept, patches = inputs.patch_prior.shape[1], inputs.img_tokens.shape[1] - int(self.has_cls)
        if kept != patches:
            raise ValueError(f"patch_prior has {kept} patches per image, the image tokens {patches}")
        self.cfg.check_pruned(kept)
        self.n = kept

    def plan(self, inputs: ScoringInputs, budget: int, device: torch.device | str | None = None) -> BlockPlan:
        """Block sizes whose estimated peak fits ``budget``: images B, captions T, dense texts D.

        On the CPU blocks are cache-sized; on an accelerator (``device``) as large as the budget allows
        (module constants ``_ACCEL_*``), the caption-tied dense texts are built once per call instead of
        getting a pass of their own, and length buckets are merged."""
        self._bind(inputs)
        accel = self._accelerator = device is not None and is_accelerator(device)
        mode = self._mode(inputs)
        branches = 2 if mode == "pair_guide" else 1
        n_img, n_txt = inputs.num_images, inputs.num_texts
        cap_len = int(inputs.cap_lens.max())
        dense_len = 0 if inputs.dense_tokens is None else int(inputs.dense_lens.max())
        c, n = self.dim, self.n
        form = self._form(cap_len, branches, n_txt)
        # Blocks of shorter texts may pick another formulation: budget for the hungriest.
        forms = _FORMS if self.formulation == "auto" else (self.formulation,)
        if accel:  # one formulation for every caption block of the call (``_caption_block``): budget for it
            forms = (form,)
        per_text = _F32 * (3 * cap_len * c + 3 * c)  # gathered rows, unit words, guide
        if mode == "pair_guide":  # each caption's dense guide and relevance (the guides: ``_dense_guides``)
            per_text += _F32 * 2 * c
        per_pair_sel = _F32 * 3 * n * branches  # batched relevance and scores of the image block
        heavy = max(self._pair_bytes(f, cap_len, branches) for f in forms)
        n_dense = 0 if inputs.dense_index is None else int(torch.unique(inputs.dense_index).numel())
        dense_form = self._form(dense_len) if mode == "caption_branch" else ""
        dense_heavy = max(self._pair_bytes(f, dense_len) for f in forms)
        dense_text = _F32 * (3 * dense_len * c + 3 * c)

        # The unit words and guides of every caption, packed, are computed once when they take at most a
        # quarter of the budget (otherwise once per image block); likewise the (N_img, N_dense) scores of
        # caption-tied dense text get their own pass (dense texts outer, images inner) when they fit.
        # (x 1.25: the blocks built from it once per call pad each text to its bucket's longest)
        cache = int(1.25 * _F32 * ((int(inputs.cap_lens.sum()) + 1) * c + n_txt * c)) + _I64 * 2 * n_txt
        cache = cache if cache <= budget // 4 and self.text_cache is not False else 0
        dense_pass = mode == "caption_branch" and _F32 * n_img * n_dense <= budget // 4 and not accel
        dense_pass = dense_pass and self.dense_pass is not False
        fixed_all = cache + (_F32 * n_img * n_dense if dense_pass else 0) + _I64 * 3 * n_txt
        guide_chunk = 0
        if mode == "pair_guide" and inputs.dense_index is not None:
            # the guides of every dense text, computed in chunks of at most 1/16 of the budget
            guide_chunk = max(1, min(_GUIDE_CHUNK, budget // 16 // (3 * _F32 * max(dense_len, 1) * c)))
            fixed_all += _F32 * c * (inputs.dense_tokens.shape[0] + 3 * guide_chunk * dense_len)
        # Accelerator: the distinct dense texts' blocks (tokens and unit words) built once per call.
        dense_cache = 2 * _F32 * n_dense * dense_len * c if mode == "caption_branch" and accel else 0
        dense_cache = dense_cache if dense_cache <= budget // 4 else 0
        fixed_all += dense_cache
        # the (G, G) diagonal blocks of _image_dense on an accelerator, G = min(_DIAGONAL_GROUP, B)
        diagonal = (
            self._pair_bytes("direct", dense_len) + per_pair_sel if accel and mode == "image_branch" else 0
        )

        def cost(b: int, t: int, d: int, length: int = cap_len) -> int:
            fixed = fixed_all + b * self._image_bytes(mode, dense_len) + _F32 * 2 * b * t
            fixed += min(_DIAGONAL_GROUP, b) ** 2 * diagonal
            if mode == "caption_branch" and not dense_pass:
                fixed += _F32 * b * n_dense
            text, pair = per_text, heavy
            if length != cap_len:  # a block of shorter texts (accelerator plans size each bucket)
                text = per_text - _F32 * 3 * (cap_len - length) * c
                pair = max(self._pair_bytes(f, length, branches) for f in forms)
            caps = t * text + b * t * (per_pair_sel + pair)
            dense = d * dense_text + b * d * (per_pair_sel + dense_heavy) if mode == "caption_branch" else 0
            # x 1.5: temporaries the per-term counts miss (measured peak / estimate <= 1.27 at ViT-224)
            return int(1.5 * (fixed + max(caps, dense)))

        # Beyond the budget, blocks are kept cache-sized: the pair tensors of one block (B x T pairs)
        # should not exceed _WORKING_SET, texts first (long length buckets), then images.
        # On an accelerator only the budget bounds them.
        def preferred(per_pair: int, n_texts: int, limit: int) -> tuple[int, int]:
            if accel:
                return min(n_img, _ACCEL_IMAGES), min(n_texts, limit)
            pairs = max(1, _WORKING_SET // max(per_pair, 1))
            texts = min(n_texts, limit, max(MIN_BUCKET, pairs))
            return max(1, min(self.max_image_block, n_img, pairs // texts)), texts

        b_pref, t_pref = preferred(heavy + per_pair_sel, n_txt, _ACCEL_TEXTS if accel else 1024)
        d_pref = 1
        if mode == "caption_branch":
            b_dense, d_pref = preferred(
                dense_heavy + per_pair_sel, n_dense, _ACCEL_DENSE_TEXTS if accel else 512
            )
            b_pref = min(b_pref, b_dense)
        min_texts = min(t_pref, _ACCEL_BUCKET if accel else 64)
        candidates = (b_pref, 128, 64, 32, 16, 8, 4, 2, 1) if accel else (b_pref, 8, 4, 2, 1)
        for b in sorted({min(b_pref, x) for x in candidates}, reverse=True):
            t = largest_fitting(lambda t, b=b: cost(b, t, 1), 1, t_pref, budget)
            d = 1
            if mode == "caption_branch":
                d = largest_fitting(lambda d, b=b: cost(b, 1, d), 1, d_pref, budget)
            if t >= 1 and d >= 1 and (t >= min_texts or b == 1):
                d = (
                    min(d, largest_fitting(lambda d, b=b, t=t: cost(b, t, d), 1, d_pref, budget))
                    if d > 1
                    else d
                )
                details = {
                    "mode": mode,
                    "formulation": form,
                    "dense_formulation": dense_form,
                    "text_cache": bool(cache),
                    "dense_pass": dense_pass,
                    "dense_cache": bool(dense_cache),
                    "accelerator": accel,
                    "min_bucket": _ACCEL_BUCKET if accel else MIN_BUCKET,
                    "guide_chunk": guide_chunk,
                }
                if accel:  # blocks of shorter captions hold more of them, within the same budget
                    details["text_block_for_length"] = [t] + [
                        largest_fitting(
                            lambda t, b=b, d=d, length=length: cost(b, t, d, length),
                            t,
                            min(_ACCEL_TEXTS, n_txt),
                            budget,
                        )
                        for length in range(1, cap_len + 1)
                    ]
                dense_block = d if mode == "caption_branch" else 0
                return BlockPlan(self.name, b, t, dense_block, cost(b, t, max(d, 1)), budget, details)
        raise ValueError(
            f"max_memory_mb={budget / (1 << 20):.3g} is too small to score one SEPS pair "
            f"(needs ~{cost(1, 1, 1) / (1 << 20):.3g} MiB at N={n}, C={c})"
        )

    # ------------------------------------------------------------------ per-image work
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
        # the flags of every net read on the host at once: one wait for the device per image block
        read = torch.stack(list(flags.values())).tolist()
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
        """HRPA of the block's pairs (token set ``ts``) with a text block: (B, T) similarities."""
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
        if is_accelerator(tokens.device):  # one broadcast product: one launch for the whole block
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

    # ------------------------------------------------------------------ drivers
    def _dense_columns(
        self, dense_lens: torch.Tensor, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct dense rows (sorted by decreasing length) and, per entry of ``rows``, its column; all on
        the host (``dense_lens`` (N_dense,) and ``rows`` are host tensors)."""
        distinct = torch.unique(rows)
        distinct = distinct[torch.argsort(dense_lens[distinct], descending=True, stable=True)]
        where = torch.empty(int(distinct.max()) + 1, dtype=torch.long)
        where[distinct] = torch.arange(distinct.numel())
        return distinct, where[rows]

    def _prepare(self, job: Staged, rows, host_rows) -> ImageBlock:
        """Per-image work of the images ``rows`` (a slice, or an index on the tokens' device; ``host_rows``
        the same on the host), image-tied dense text (or its precomputed score) too."""
        inputs = job.inputs
        prior = None if inputs.patch_prior is None else job.tokens(inputs.patch_prior[rows])
        img = self._images(job.tokens(inputs.img_tokens[rows]), prior)
        if inputs.image_constants is not None:
            img.dense_const = job.tokens(inputs.image_constants[rows])
        elif inputs.dense_tokens is not None and inputs.dense_index is None:
            self._image_dense(img, job, rows, host_rows)
        return img

    @torch.no_grad()
    def image_constants(
        self,
        img_tokens: torch.Tensor,
        dense_tokens: torch.Tensor,
        dense_lens: torch.Tensor,
        *,
        device,
        block: int = 8,
    ) -> torch.Tensor | None:
        """The image-tied dense branch's score of each image ("branch" mode: SEPS as released), (N_img,)
        float32 on the CPU, in blocks of ``block`` images; None in "guide" mode, where dense text enters
        the selection of every pair."""
        if self.cfg.dense_mode != "branch":
            return None
        device = torch.device(device)
        caption = img_tokens.new_zeros(1, 1, img_tokens.shape[2])  # no caption is read
        inputs = ScoringInputs(img_tokens, caption, torch.ones(1, dtype=torch.long), dense_tokens, dense_lens)
        job = stage(inputs, device, self.aggr.scale.dtype)
        self._bind(job.inputs)
        self._accelerator = job.accelerator
        n_img = img_tokens.shape[0]
        out = torch.empty(n_img, dtype=torch.float32, device=device)  # copied back once
        for i0 in range(0, n_img, block):
            rows = slice(i0, min(i0 + block, n_img))
            out[rows] = self._prepare(job, rows, rows).dense_const.float()
        return host(out)

    @torch.no_grad()
    def score(self, inputs, out, *, budget, device, progress) -> None:
        device = torch.device(device)
        job = stage(inputs, device, self.aggr.scale.dtype)
        inputs = job.inputs  # lengths and pairing on the host from here on
        plan, workers = engine_plan(self, inputs, budget, device)
        mode = plan.details["mode"]
        n_img, n_txt = inputs.num_images, inputs.num_texts
        # Texts sorted by length (descending) and cut into length buckets; results are put back in place.
        cap_order = torch.argsort(inputs.cap_lens, descending=True, stable=True)
        cap_blocks = length_blocks(
            inputs.cap_lens[cap_order],
            plan.text_block,
            plan.details["min_bucket"],
            plan.details.get("text_block_for_length"),
        )
        widths = inputs.cap_lens[cap_order].tolist()
        plan.details["text_blocks"] = len(cap_blocks)
        order = job.put(cap_order)  # sliced per block on the device: no upload inside the loop
        dense_rows = dense_pos = dense_all = None
        total = n_img * n_txt
        if mode == "caption_branch":
            dense_rows, dense_pos = self._dense_columns(inputs.dense_lens, inputs.dense_index)
            dense_pos = job.put(dense_pos)
            total += n_img * dense_rows.numel()
        try:
            self._start_call(job, plan, mode)
            # Every image block meets the same caption (and dense) blocks: build them once when they fit.
            cached = (
                None
                if self._cache is None
                else [self._cache.block(order[a:b], widths[a]) for a, b in cap_blocks]
            )
            self._cache = None
            dense_blocks = None
            if plan.details["dense_cache"]:
                dense_blocks = list(self._dense_blocks(job, dense_rows, plan))
            with progress_bar(total, "score pairs", progress, unit="pair") as bar:
                if plan.details["dense_pass"]:
                    dense_all = self._dense_pass(job, dense_rows, plan, bar)

                def image_block(i0: int) -> None:  # one block of image rows against every caption
                    i1 = min(i0 + plan.image_block, n_img)
                    img = self._prepare(job, slice(i0, i1), slice(i0, i1))
                    dense_scores = None
                    if dense_all is not None:
                        dense_scores = dense_all[i0:i1]
                    elif mode == "caption_branch":
                        dense_scores = self._caption_dense(img, job, dense_rows, plan, dense_blocks)
                        bar.update(dense_scores.numel())
                    rows, target = row_buffer(job, out, i0, i1)
                    for j, (start, stop) in enumerate(cap_blocks):
                        cols = order[start:stop]
                        txt = None if cached is None else cached[j]
                        block = self._caption_block(
                            img, job, cols, mode, widths[start], txt, host_cols=cap_order[start:stop]
                        )
                        if dense_scores is not None:
                            block = block + dense_scores[:, dense_pos[cols]]
                        rows[:, cols] = block.float()
                        bar.update(block.numel())
                    if target is not None:
                        target.copy_(rows)  # the one copy back of this image block

                in_workers(workers, range(0, n_img, plan.image_block), image_block)
        finally:
            self._cache = self._caption_form = self._dense_guide = None

    @torch.no_grad()
    def score_pairs(self, inputs, img_index, txt_index, *, budget, device, progress=None) -> torch.Tensor:
        """Similarities of the listed (image, caption) pairs only: (P,) float32 on the CPU.

        Pairs are grouped by image; each image is prepared once and scored against its own captions in
        length buckets (and, with caption-tied dense text, against the distinct dense texts they use).
        """
        # Re-ranking runs many small per-image products that intra-op threads barely speed up; on a CPU,
        # image blocks go to single-threaded workers (torch releases the GIL), see in_workers.
        device = torch.device(device)
        job = stage(inputs, device, self.aggr.scale.dtype)
        inputs = job.inputs
        img_index, txt_index = (
            host(torch.as_tensor(img_index)).long(),
            host(torch.as_tensor(txt_index)).long(),
        )
        plan, workers = engine_plan(self, inputs, budget, device)
        mode = plan.details["mode"]
        result = torch.empty(img_index.shape[0], dtype=torch.float32, device=device)  # copied back once
        try:
            self._start_call(job, plan, mode)
            with progress_bar(int(img_index.shape[0]), "re-rank pairs", progress, unit="pair") as bar:
                by_length = torch.argsort(inputs.cap_lens[txt_index], descending=True, stable=True)
                order = by_length[torch.argsort(img_index[by_length], stable=True)]  # by image, then length
                images, counts = torch.unique_consecutive(img_index[order], return_counts=True)
                starts = (torch.cumsum(counts, 0) - counts).tolist()
                on_device = (job.put(order), job.put(txt_index), job.put(images))
                groups = (order, images, counts.tolist(), starts, on_device)
                args = (job, txt_index, groups, plan, mode, result, bar)
                in_workers(
                    workers,
                    range(0, images.numel(), plan.image_block),
                    lambda b0: self._score_pairs(*args, b0),
                )
        finally:
            self._cache = self._caption_form = self._dense_guide = None
        return host(result)

    def _score_pairs(self, job: Staged, txt_index, groups, plan, mode, result, bar, b0: int) -> None:
        """Score the pairs of the images ``b0 .. b0 + image_block`` (of the sorted distinct images) into
        ``result`` (on the device)."""
        inputs = job.inputs
        order, images, counts, starts, (order_dev, txt_dev, images_dev) = groups
        rows = images[b0 : b0 + plan.image_block]
        img = self._prepare(job, images_dev[b0 : b0 + plan.image_block], rows)
        for j in range(rows.numel()):
            img_v = img.select(j)
            first, count = starts[b0 + j], counts[b0 + j]
            texts = txt_index[order[first : first + count]]  # host: lengths and buckets
            sel = order_dev[first : first + count]
            texts_dev = txt_dev[sel]
            dense_scores = dense_pos = None
            if mode == "caption_branch":
                dense_rows, dense_pos = self._dense_columns(inputs.dense_lens, inputs.dense_index[texts])
                dense_scores = self._caption_dense(img_v, job, dense_rows, plan)
                dense_pos = job.put(dense_pos)
            # few texts per image: fewer, longer buckets (per-block overhead beats padding here)
            lens = inputs.cap_lens[texts].tolist()
            for start, stop in length_blocks(inputs.cap_lens[texts], plan.text_block, 4 * MIN_BUCKET):
                block = self._caption_block(
                    img_v,
                    job,
                    texts_dev[start:stop],
                    mode,
                    lens[start],
                    texts_per_image=count,
                    host_cols=texts[start:stop],
                )[0]
                if dense_scores is not None:
                    block = block + dense_scores[0, dense_pos[start:stop]]
                result[sel[start:stop]] = block.float()
            bar.update(count)

    def _captions(self, job: Staged, cols, width: int) -> Texts:
        """The captions ``cols`` (device index) as a text block, from the packed cache when there is one."""
        if self._cache is not None:
            return self._cache.block(cols, width)
        inputs = job.inputs
        return Texts.build(job.tokens(inputs.cap_tokens[cols]), job.cap_lens[cols], width)

    def _start_call(self, job: Staged, plan: BlockPlan, mode: str) -> None:
        """The per-call state: the packed caption cache, the caption formulation, the dense guides."""
        self._caption_form = plan.details["formulation"] if plan.details["accelerator"] else None
        self._dense_guide = None
        if mode == "pair_guide" and job.inputs.dense_index is not None:
            self._dense_guide = self._dense_guides(job, plan.details["guide_chunk"])
        self._cache = None
        if plan.details.get("text_cache"):
            inputs = job.inputs
            self._cache = PackedTexts.build(
                inputs.cap_tokens, job.cap_lens, inputs.cap_lens, job.device, job.dtype
            )

    def _caption_block(
        self,
        img,
        job: Staged,
        cols,
        mode,
        width: int,
        txt: Texts | None = None,
        texts_per_image: int | None = None,
        host_cols: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) similarities of the image block with the captions ``cols`` (an index on the device, of
        the longest length ``width``; ``host_cols`` the same on the host) (sparse + guided parts);
        ``texts_per_image``: how many texts each image meets in this call (default: every text)."""
        inputs = job.inputs
        txt = self._captions(job, cols, width) if txt is None else txt
        branches = 2 if mode == "pair_guide" else 1
        form = self._caption_form or self._form(
            txt.words.shape[1], branches, texts_per_image or inputs.num_texts
        )
        relevance = self._relevance(img, txt.guide)  # (B, T, N)
        if mode == "pair_guide":
            if inputs.dense_index is None:  # joint score with image-tied dense text
                dense_rel = img.dense_relevance
            else:  # each caption's dense text: its guide, computed once per dense row (``_dense_guides``)
                dense_rel = self._relevance(img, self._dense_guide[job.dense_index[cols]])
            if self.cfg.joint_score:
                score_s = score_d = self._scores(img, [relevance, dense_rel])
            else:
                score_s, score_d = self._scores(img, [relevance]), self._scores(img, [dense_rel])
            sel, fusion = self._select(score_s, self.aggr)
            sel_d, fusion_d = self._select(score_d.expand_as(score_s), self.aggr_dense)
            ts = TokenSet([sel, sel_d], None, 0.5 * (fusion + fusion_d))
        else:
            sel, fusion = self._select(self._scores(img, [relevance]), self.aggr)
            if mode == "image_guide":
                ts = TokenSet([sel], img.part, 0.5 * (fusion + img.part.fusion[:, None]))
            else:
                ts = TokenSet([sel], None, fusion)
        sims = self._align(img, ts, txt, form)
        if img.dense_const is not None:
            sims = sims + img.dense_const[:, None]
        return sims

    def _image_dense(self, img: ImageBlock, job: Staged, rows, host_rows) -> None:
        """Image-tied dense text: its selection (and in "branch" mode its whole score) per image."""
        inputs = job.inputs
        host_lens = inputs.dense_lens[host_rows]
        width = int(host_lens.max())
        tokens = job.tokens(inputs.dense_tokens[rows][:, :width])
        lens = job.dense_lens[rows]
        guide = l2norm(masked_mean(tokens, lens))
        img.dense_relevance = text_relevance(img.unit, guide, per_image=True)  # (B, 1, N)
        if self.cfg.dense_mode == "guide":
            if not self.cfg.joint_score:
                img.part = self._part(img, self._scores(img, [img.dense_relevance]))
            return
        score = self._scores(img, [img.dense_relevance])  # (B, 1, N)
        # Image v against its own description only. On the CPU one image at a time; on an accelerator
        # groups of G images against their G descriptions as one (G, G) block whose diagonal is kept:
        # G times the arithmetic of these few pairs, 1 / G of the launches.
        group = 1 if not job.accelerator else _DIAGONAL_GROUP
        const = []
        for v0 in range(0, score.shape[0], group):
            v1 = min(v0 + group, score.shape[0])
            txt = Texts.build(tokens[v0:v1], lens[v0:v1], int(host_lens[v0:v1].max()))
            sel, fusion = self._select(score[v0:v1].expand(-1, v1 - v0, -1), self.aggr_dense)
            sims = self._align(
                img.take(v0, v1), TokenSet([sel], None, fusion), txt, self._form(txt.words.shape[1])
            )
            const.append(sims.diagonal())
        img.dense_const = torch.cat(const)

    @staticmethod
    def _relevance(img: ImageBlock, guide: torch.Tensor) -> torch.Tensor:
        """``text_relevance(img.unit, guide, per_image=False)``, (B, T, N), as one matrix product: the
        einsum decomposes into a dozen ops, each a launch on an accelerator."""
        return torch.matmul(img.unit, guide.T).transpose(1, 2)

    def _dense_guides(self, job: Staged, chunk: int) -> torch.Tensor:
        """(N_dense, C) the selection guide of every dense text (L2-normalised masked mean of its raw
        tokens), in blocks of ``chunk`` rows: caption-tied "guide" mode reads each caption's."""
        inputs = job.inputs
        n_dense = inputs.dense_tokens.shape[0]
        lens = inputs.dense_lens.tolist()
        guides = []
        for start in range(0, n_dense, chunk):
            stop = min(start + chunk, n_dense)
            tokens = job.tokens(inputs.dense_tokens[start:stop, : max(lens[start:stop])])
            guides.append(l2norm(masked_mean(tokens, job.dense_lens[start:stop])))
        return torch.cat(guides)

    def _dense_scores(self, img: ImageBlock, txt: Texts) -> torch.Tensor:
        """ "Branch"-mode dense scores (B, D) of an image block with a block of dense texts."""
        score = self._scores(img, [self._relevance(img, txt.guide)])
        sel, fusion = self._select(score, self.aggr_dense)
        return self._align(img, TokenSet([sel], None, fusion), txt, self._form(txt.words.shape[1]))

    def _dense_blocks(self, job: Staged, dense_rows, plan) -> Iterator[tuple[int, int, Texts]]:
        """The distinct dense texts ``dense_rows`` (host, sorted by decreasing length) as text blocks on
        the device, built as they are taken: (start, stop, block) per length bucket of at most
        ``plan.dense_block``."""
        inputs = job.inputs
        rows_dev = job.put(dense_rows)
        for start, stop in length_blocks(inputs.dense_lens[dense_rows], plan.dense_block):
            rows = rows_dev[start:stop]
            width = int(inputs.dense_lens[dense_rows[start]])
            tokens = job.tokens(inputs.dense_tokens[rows][:, :width])
            yield start, stop, Texts.build(tokens, job.dense_lens[rows], width)

    def _caption_dense(self, img: ImageBlock, job: Staged, dense_rows, plan, blocks=None) -> torch.Tensor:
        """Caption-tied "branch"-mode dense scores of the image block with every distinct dense text:
        (B, D_total), column j = dense row ``dense_rows[j]``; ``blocks``: the dense text blocks, when
        built once per call (:meth:`_dense_blocks`)."""
        out = torch.empty(
            img.patches.shape[0], dense_rows.numel(), dtype=img.patches.dtype, device=job.device
        )
        for start, stop, txt in blocks if blocks is not None else self._dense_blocks(job, dense_rows, plan):
            out[:, start:stop] = self._dense_scores(img, txt)
        return out

    def _dense_pass(self, job: Staged, dense_rows, plan, bar) -> torch.Tensor:
        """(N_img, D_total) caption-tied dense scores, dense text blocks outside: each is built once."""
        inputs = job.inputs
        n_img = inputs.num_images
        out = torch.empty(n_img, dense_rows.numel(), dtype=job.dtype, device=job.device)
        for start, stop, txt in self._dense_blocks(job, dense_rows, plan):
            for i0 in range(0, n_img, plan.image_block):
                i1 = min(i0 + plan.image_block, n_img)
                prior = None if inputs.patch_prior is None else job.tokens(inputs.patch_prior[i0:i1])
                img = self._images(job.tokens(inputs.img_tokens[i0:i1]), prior)
                out[i0:i1, start:stop] = self._dense_scores(img, txt)
                bar.update((i1 - i0) * (stop - start))
        return out
