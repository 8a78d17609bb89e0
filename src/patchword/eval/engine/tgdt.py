"""TGDT's engine: block-wise forward for full matrices, direct paired scores for lists of pairs."""

from __future__ import annotations

import torch

from patchword._validation import values_checked
from patchword.eval.engine.forward import ForwardEngine
from patchword.eval.engine.staging import host, stage

__all__ = ["TGDTEngine"]


class TGDTEngine(ForwardEngine):
    """:class:`ForwardEngine` whose ``score_pairs`` scores listed pairs with
    :meth:`TGDTMatcher.paired_scores` (no per-image forward calls): the re-ranking of two-stage search."""

    name = "tgdt"

    def score_pairs(self, inputs, img_index, txt_index, *, budget, device, progress=None) -> torch.Tensor:
        l_v, dim = inputs.img_tokens.shape[1:]
        l_t = inputs.cap_tokens.shape[1]
        # gathered and normalised tokens of both sides plus the (L_t, L_v) score block, fp32
        per_pair = 4 * (2 * (l_v + l_t) * dim + 2 * l_v * l_t)
        step = max(1, budget // per_pair)
        job = stage(inputs, device, None)
        self.check_inputs(job.inputs, whole_captions=True)  # once: the pair chunks check shapes only
        # each index where the tensors it indexes live (uploaded once on an accelerator)
        img_index, txt_index = (
            torch.as_tensor(img_index).to(job.device),
            torch.as_tensor(txt_index).to(job.device),
        )
        out = torch.empty(img_index.shape[0], dtype=torch.float32, device=job.device)  # copied back once
        with values_checked():
            for p0 in range(0, img_index.shape[0], step):
                r, c = img_index[p0 : p0 + step], txt_index[p0 : p0 + step]
                scores = self.matcher.paired_scores(
                    job.inputs.img_tokens[r], job.inputs.cap_tokens[c], job.cap_lens[c]
                )
                out[p0 : p0 + step] = scores.float()
        return host(out)
