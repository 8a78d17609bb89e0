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

Over 400 lines: the drivers of every SEPS / LAPS scoring mode (image- or caption-tied, paper or code) over one
plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from patchword._validation import check_lengths, check_tensor, values_checked
from patchword.eval.engine.base import PendingCheck, ScoringEngine, ScoringInputs
from patchword.eval.engine.seps_align import SEPSAlignment
from patchword.eval.engine.seps_blocks import (
    MIN_BUCKET,
    ImageBlock,
    PackedTexts,
    Texts,
    TokenSet,
    length_blocks,
)
from patchword.eval.engine.seps_plan import _DIAGONAL_GROUP, FORMS, SEPSPlanner
from patchword.eval.engine.staging import Staged, host, is_accelerator, row_buffer, stage
from patchword.eval.engine.workers import engine_plan, in_workers
from patchword.matching.ops import l2norm, masked_mean
from patchword.matching.selection import text_relevance
from patchword.matching.seps import SEPSMatcher
from patchword.progress import progress_bar

__all__ = ["SEPSEngine"]


class SEPSEngine(SEPSPlanner, SEPSAlignment, ScoringEngine):
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
    precisions = ("fp32", "tf32")

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
        if formulation not in ("auto",) + FORMS:
            raise ValueError(f"formulation must be 'auto' or one of {FORMS}, got {formulation!r}")
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
        # during a call: the guides of caption-tied dense texts ("guide" mode)
        self._dense_guide: torch.Tensor | None = None
        self._accelerator = False  # whether the job planned last computes on an accelerator
        # during a call on an accelerator: the inputs' finiteness, read with the first stability flags
        self._pending_check: PendingCheck | None = None

    def check_shapes(self, inputs: ScoringInputs) -> None:
        """The matcher's own image checks (its patch count, plus CLS; a pruned image's prior), which its
        forward makes of every batch, made of the whole job (values: :meth:`check_inputs`)."""
        with values_checked():
            self.matcher.validate_images(inputs.img_tokens, inputs.patch_prior)
        self._check_text_shapes(inputs)

    @torch.no_grad()
    def patch_priors(self, img_tokens: torch.Tensor, *, device, block: int = 64) -> torch.Tensor:
        """(N_img, N) float32: the image-only part of every patch's selection score of (N_img, [1 +] N, C)
        unpruned image tokens (:meth:`SEPSAlignment.patch_priors`), after the entry check of :meth:`score`
        (:meth:`check_inputs`: the matcher's token count and width, finite tokens). The finiteness of device
        tokens is read with the first image block's stability flags, as in :meth:`score`: no wait of its
        own."""
        check_tensor(img_tokens, "img_tokens", ndim=3, finite=False)
        caption = img_tokens.new_zeros(1, 1, img_tokens.shape[2])  # no caption is read
        inputs = ScoringInputs(img_tokens, caption, torch.ones(1, dtype=torch.long))
        # deferred only where the blocks compute on the tokens' own accelerator (the flags are read there)
        defer = is_accelerator(device) and _same_device(img_tokens.device, torch.device(device))
        with self._call(self.check_inputs(inputs, defer=defer)):
            return super().patch_priors(img_tokens, device=device, block=block)

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
        check_tensor(img_tokens, "img_tokens", ndim=3, finite=False)
        check_tensor(dense_tokens, "dense_tokens", shape=(img_tokens.shape[0], None, None), finite=False)
        # values: on the host lengths, after staging (check_inputs)
        dense_lens = check_lengths(
            dense_lens, "dense_lens", size=dense_tokens.shape[0], max_len=dense_tokens.shape[1], values=False
        )
        caption = img_tokens.new_zeros(1, 1, img_tokens.shape[2])  # no caption is read
        inputs = ScoringInputs(img_tokens, caption, torch.ones(1, dtype=torch.long), dense_tokens, dense_lens)
        job = stage(inputs, device, self.aggr.scale.dtype)
        pending = self.check_inputs(job.inputs, defer=job.accelerator)
        self._bind(job.inputs)
        self._accelerator = job.accelerator
        n_img = img_tokens.shape[0]
        out = torch.empty(n_img, dtype=torch.float32, device=device)  # copied back once
        with self._call(pending):
            for i0 in range(0, n_img, block):
                rows = slice(i0, min(i0 + block, n_img))
                out[rows] = self._prepare(job, rows, rows).dense_const.float()
        return host(out)

    @torch.no_grad()
    def score(self, inputs, out, *, budget, device, progress) -> None:
        device = torch.device(device)
        job = stage(inputs, device, self.aggr.scale.dtype)
        inputs = job.inputs  # lengths and pairing on the host from here on
        # once: what the matcher's forward checks of each batch (on an accelerator the finiteness is read
        # with the first image block's stability flags: no wait of its own)
        pending = self.check_inputs(inputs, defer=job.accelerator)
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
        with self._call(pending, job, plan, mode):
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
                        block = self._caption_block(img, job, cols, mode, widths[start], txt)
                        if dense_scores is not None:
                            block = block + dense_scores[:, dense_pos[cols]]
                        rows[:, cols] = block.float()
                        bar.update(block.numel())
                    if target is not None:
                        target.copy_(rows)  # the one copy back of this image block

                in_workers(workers, range(0, n_img, plan.image_block), image_block)

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
        pending = self.check_inputs(inputs, defer=job.accelerator)  # once, read as in score
        img_index, txt_index = (
            host(torch.as_tensor(img_index)).long(),
            host(torch.as_tensor(txt_index)).long(),
        )
        plan, workers = engine_plan(self, inputs, budget, device)
        mode = plan.details["mode"]
        result = torch.empty(img_index.shape[0], dtype=torch.float32, device=device)  # copied back once
        with (
            self._call(pending, job, plan, mode),
            progress_bar(int(img_index.shape[0]), "re-rank pairs", progress, unit="pair") as bar,
        ):
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
                    img_v, job, texts_dev[start:stop], mode, lens[start], texts_per_image=count
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

    @contextlib.contextmanager
    def _call(
        self, pending: PendingCheck | None, job: Staged | None = None, plan=None, mode: str | None = None
    ) -> Iterator[None]:
        """The state of one call, dropped when it ends: the finiteness check not read yet (read with the
        first stability flags, seps_align), and for a scoring ``job`` the packed caption cache and the
        dense guides its ``plan`` asks for."""
        self._pending_check = pending
        try:
            if job is not None:
                if mode == "pair_guide" and job.inputs.dense_index is not None:
                    self._dense_guide = self._dense_guides(job, plan.details["guide_chunk"])
                if plan.details.get("text_cache"):
                    inputs = job.inputs
                    self._cache = PackedTexts.build(
                        inputs.cap_tokens, job.cap_lens, inputs.cap_lens, job.device, job.dtype
                    )
            yield
        finally:
            self._cache = self._dense_guide = self._pending_check = None

    def _caption_block(
        self,
        img,
        job: Staged,
        cols,
        mode,
        width: int,
        txt: Texts | None = None,
        texts_per_image: int | None = None,
    ) -> torch.Tensor:
        """(B, T) similarities of the image block with the captions ``cols`` (an index on the device, of
        the longest length ``width``) (sparse + guided parts); ``texts_per_image``: how many texts each
        image meets in this call (default: every text)."""
        inputs = job.inputs
        txt = self._captions(job, cols, width) if txt is None else txt
        branches = 2 if mode == "pair_guide" else 1
        # Chosen per block from its width, on every device: the length buckets of an accelerator plan
        # are sorted, and most of them are far shorter than the longest caption (at ViT-B/16 shapes
        # "gram" is cheaper below ~30 words, "direct" above; docs/benchmarks.md, "device work").
        form = self._form(txt.words.shape[1], branches, texts_per_image or inputs.num_texts)
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
                img = self._prepare(job, slice(i0, i1), slice(i0, i1))
                out[i0:i1, start:stop] = self._dense_scores(img, txt)
                bar.update((i1 - i0) * (stop - start))
        return out


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` are one device (``cuda`` is the current CUDA device, ``cuda:1`` another)."""
    if a.type != b.type:
        return False
    current = torch.cuda.current_device() if a.type == "cuda" and (a.index is None or b.index is None) else 0
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)
