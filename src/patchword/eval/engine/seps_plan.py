"""The block plan of the SEPS / LAPS scoring engine (:mod:`patchword.eval.engine.seps`): how dense text
enters (the mode), the cost model that picks an exact formulation per text block, the working bytes per pair
and per image, and the block sizes that fit a memory budget, cache-sized on the CPU and as large as the
budget allows on an accelerator."""

from __future__ import annotations

import torch

from patchword.eval.engine.base import BlockPlan, ScoringInputs
from patchword.eval.engine.memory import largest_fitting
from patchword.eval.engine.seps_blocks import MIN_BUCKET
from patchword.eval.engine.staging import is_accelerator

__all__ = ["FORMS", "SEPSPlanner"]

_F32 = 4
_I64 = 8
# The exact formulations (module docstring); "auto" picks the cheapest per text block.
FORMS = _FORMS = ("gram", "direct", "kdirect")
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


class SEPSPlanner:
    """Modes, costs and the memory plan of :class:`~patchword.eval.engine.seps.SEPSEngine` (a mixin: it
    reads the engine's ``cfg``, ``n``, ``k``, ``n_c``, ``dim``, ``formulation``, ``matcher`` and the
    ``text_cache`` / ``dense_pass`` / ``max_image_block`` switches)."""

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
        # Blocks of shorter texts may pick another formulation (``_caption_block``): budget for the
        # hungriest. ``form`` is the longest captions' (reported in the plan's details).
        forms = (_ACCEL_FORMS if accel else _FORMS) if self.formulation == "auto" else (self.formulation,)
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
            f"a scoring memory budget of {budget:,} bytes (eval.max_memory_mb / --max-memory-mb, shared "
            "among the engine's workers, in whole bytes) is too small to score one SEPS pair "
            f"(needs ~{cost(1, 1, 1) / (1 << 20):.3g} MiB at N={n}, C={c})"
        )
