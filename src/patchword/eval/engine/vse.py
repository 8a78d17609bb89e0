"""Engine of the global-cosine baseline: one GEMM per block of the cached global embeddings."""

from __future__ import annotations

import torch

from patchword._validation import values_checked
from patchword.eval.engine.base import BlockPlan, ScoringEngine
from patchword.eval.engine.staging import row_buffer, stage
from patchword.progress import progress_bar

__all__ = ["VSEEngine"]

_F32 = 4


class VSEEngine(ScoringEngine):
    """sims = global_image(img) @ global_text(cap).T, exactly what :class:`VSEMatcher` computes.

    Embeddings are computed per block (each image and caption once per block row/column) and the
    similarity block is one matrix product.
    """

    name = "vse"
    reads_caption_padding = True  # the pooled mean spans the whole padded axis

    @torch.no_grad()
    def score(self, inputs, out, *, budget, device, progress) -> None:
        self.score_staged(stage(inputs, device, None), out, budget=budget, progress=progress)

    @torch.no_grad()
    def score_staged(self, job, out, *, budget, progress) -> None:
        inputs, device = job.inputs, job.device
        self.check_inputs(job.inputs)  # once: the embeddings of the blocks below check shapes only
        n_img, n_txt = inputs.num_images, inputs.num_texts
        l_v, dim = inputs.img_tokens.shape[1:]
        l_t = inputs.cap_tokens.shape[1]
        # a block of B images and T captions holds their tokens (pooling temporaries: x2), embeddings
        # and the B x T result
        per_img, per_txt = _F32 * (2 * l_v * dim + dim), _F32 * (2 * l_t * dim + dim)
        image_block = min(n_img, 1024)
        while True:
            room = budget - image_block * per_img
            text_block = min(n_txt, room // (per_txt + _F32 * image_block)) if room > 0 else 0
            if text_block >= 1:
                break
            if image_block == 1:
                raise ValueError(f"max_memory_mb={budget / (1 << 20):.3g} is too small for one VSE pair")
            image_block = max(1, image_block // 2)
        peak = image_block * per_img + text_block * (per_txt + _F32 * image_block)
        self.last_plan = BlockPlan(self.name, image_block, int(text_block), 0, int(peak), budget)
        m, img_dtype = self.matcher, inputs.img_tokens.dtype
        with progress_bar(n_img * n_txt, "score pairs", progress, unit="pair") as bar, values_checked():
            for i0 in range(0, n_img, image_block):
                i1 = min(i0 + image_block, n_img)
                img = m.global_image(inputs.img_tokens[i0:i1].to(device))
                rows, target = row_buffer(job, out, i0, i1)
                for t0 in range(0, n_txt, text_block):
                    cols = slice(t0, t0 + text_block)
                    # caption tokens in the image tokens' dtype, as the matcher's forward takes them
                    txt = m.global_text(inputs.cap_tokens[cols].to(device, img_dtype), job.cap_lens[cols])
                    block = img @ txt.T
                    rows[:, cols] = block.float()
                    bar.update(block.numel())
                if target is not None:
                    target.copy_(rows)
