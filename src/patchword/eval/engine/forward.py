"""The fallback engine: the matcher's own forward over blocks of pairs sized from the memory budget."""

from __future__ import annotations

import torch

from patchword._validation import values_checked
from patchword.eval.engine.base import BlockPlan, ScoringEngine, ScoringInputs
from patchword.eval.engine.staging import row_buffer, stage
from patchword.eval.engine.workers import engine_plan, in_workers
from patchword.progress import progress_bar

__all__ = ["ForwardEngine", "forward_pair_bytes"]

_F32 = 4


def forward_pair_bytes(matcher, img_len: int, txt_len: int, dense_len: int, dim: int) -> int:
    """Working bytes one image-caption pair costs inside ``matcher.forward``.

    A matcher may declare it (:meth:`Matcher.pair_memory_bytes`); when that returns None the estimate
    assumes the forward materialises four fp32 token tensors of the pair (image, caption and dense tokens
    side by side), generous for every built-in matcher (SEPS: ~0.3 MB at ViT-224, C=512; the estimate is
    ~2.9 MB), so a forward-only matcher gets smaller blocks rather than exceeding the budget.
    """
    declared = matcher.pair_memory_bytes(img_len, txt_len, dense_len, dim)
    if declared is not None:
        return int(declared)
    return 4 * _F32 * dim * (img_len + txt_len + dense_len)


class ForwardEngine(ScoringEngine):
    """Score by calling ``matcher(img_block, cap_block, lens, dense...)``: exact by construction.

    Used for matchers without a fast engine, and as the ground truth the fast engines are tested against.
    The values of the inputs are checked once before the loop, so the matcher calls check shapes only;
    ``lens`` are the host lengths for a matcher that plans with them (``Matcher.host_lengths``): on an
    accelerator the loop waits for the device once per image block, for its rows.
    """

    name = "forward"

    def plan(self, inputs: ScoringInputs, budget: int, device: torch.device | None = None) -> BlockPlan:
        """Images and captions per block so that inputs, working tensors and the output block fit."""
        n_img, n_txt = inputs.num_images, inputs.num_texts
        l_v, dim = inputs.img_tokens.shape[1:]
        l_t = inputs.cap_tokens.shape[1]
        l_d = 0 if inputs.dense_tokens is None else inputs.dense_tokens.shape[1]
        per_pair = forward_pair_bytes(self.matcher, l_v, l_t, l_d, dim) + _F32
        per_image = _F32 * dim * (l_v + (l_d if inputs.dense_index is None else 0))
        per_text = _F32 * dim * (l_t + (l_d if inputs.dense_index is not None else 0))
        for image_block in sorted({min(n_img, b) for b in (128, 64, 32, 16, 8, 4, 2, 1)}, reverse=True):
            room = budget - image_block * per_image
            text_block = min(n_txt, room // (image_block * per_pair + per_text)) if room > 0 else 0
            if text_block >= min(n_txt, 16) or (image_block == 1 and text_block >= 1):
                peak = image_block * per_image + text_block * (per_text + image_block * per_pair)
                return BlockPlan(self.name, image_block, int(text_block), 0, int(peak), budget)
        need = (per_image + per_text + per_pair) / (1 << 20)
        raise ValueError(
            f"a scoring memory budget of {budget:,} bytes (eval.max_memory_mb / --max-memory-mb, shared "
            "among the engine's workers, in whole bytes) is too small to score even one pair with "
            f"{type(self.matcher).__name__}.forward (needs ~{need:.3g} MiB)"
        )

    def __init__(self, matcher, workers: int | None = None) -> None:
        super().__init__(matcher)
        self.workers = workers  # CPU threads taking image blocks from a queue (None: one per torch thread)

    @torch.no_grad()
    def score(self, inputs, out, *, budget, device, progress) -> None:
        self.score_staged(stage(inputs, device, None), out, budget=budget, progress=progress)

    @torch.no_grad()
    def score_staged(self, job, out, *, budget, progress) -> None:
        inputs, device = job.inputs, job.device  # lengths and pairing on the host: widths are read there
        self.check_inputs(job.inputs)  # once; the blocks read captions up to the longest one
        plan, workers = engine_plan(self, inputs, budget, device)
        n_img, n_txt = inputs.num_images, inputs.num_texts
        image_tied = inputs.dense_tokens is not None and inputs.dense_index is None
        cap_lens = inputs.cap_lens if self.matcher.host_lengths else job.cap_lens
        with progress_bar(n_img * n_txt, "score pairs", progress, unit="pair") as bar:

            @values_checked()  # in the thread that takes the block: the checks are per thread
            def image_block(i0: int) -> None:
                i1 = min(i0 + plan.image_block, n_img)
                rows = slice(i0, i1)
                img = inputs.img_tokens[rows].to(device)
                # images pruned at index time: only matchers with a prunable engine accept them (SEPS)
                pruned = (
                    {} if inputs.patch_prior is None else {"patch_prior": inputs.patch_prior[rows].to(device)}
                )
                target_rows, target = row_buffer(job, out, i0, i1)
                for t0 in range(0, n_txt, plan.text_block):
                    cols = slice(t0, t0 + plan.text_block)
                    width = int(inputs.cap_lens[cols].max())  # host
                    dense = (None, None)
                    if image_tied:
                        dense = (inputs.dense_tokens[rows].to(device), job.dense_lens[rows])
                    elif inputs.dense_tokens is not None:
                        owner = job.dense_index[cols]
                        dense = (inputs.dense_tokens[owner].to(device), job.dense_lens[owner])
                    caps = inputs.cap_tokens[cols, :width].to(device)
                    sims = self.matcher(img, caps, cap_lens[cols], *dense, **pruned).sims
                    target_rows[:, cols] = sims.float()
                    bar.update(sims.numel())
                if target is not None:
                    target.copy_(target_rows)

            in_workers(workers, range(0, n_img, plan.image_block), image_block)
