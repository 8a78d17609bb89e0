"""The matcher contract shared by every fine-grained similarity head."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from patchword._validation import check_finite, check_lengths, check_tensor
from patchword.matching.ops import full_precision, l2norm, masked_mean

__all__ = ["MatcherOutput", "Matcher", "TwoStagePlan", "caption_blocks", "chunk_widths"]


@dataclass
class MatcherOutput:
    """What a matcher returns.

    Attributes:
        sims: (B_v, B_t) image-caption similarity, float32.
        decisions: patch-selection decision masks, one per selection branch, each (B_v, B_t, N) or
            (B_v, 1, N) when the branch depends only on the image. Forward values are the hard {0, 1}
            masks; they carry a gradient only for differentiable (Gumbel straight-through) decisions.
            Empty for matchers without patch selection.
        extras: other named outputs a training loss may need, e.g. ``global_img`` (B_v, C) and
            ``global_txt`` (B_t, C) for matchers trained with a global consistency loss (TGDT's CMC).
    """

    sims: torch.Tensor
    decisions: list[torch.Tensor] = field(default_factory=list)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class TwoStagePlan:
    """How a matcher wants to be evaluated when it is not by ranking the full matrix: the arguments of
    :func:`patchword.eval.two_stage_scores` (TGDT's hybrid search).

    Attributes:
        fine: the matcher that re-scores shortlisted pairs.
        k_i2t, k_t2i: captions kept per image query, images kept per caption query.
        alpha: weight of the global similarity added to the fine score.
    """

    fine: Matcher
    k_i2t: int
    k_t2i: int
    alpha: float


class Matcher(nn.Module):
    """Base class and the whole contract the rest of patchword relies on.

    Subclasses implement ``forward(img_tokens, cap_tokens, cap_lens, dense_tokens=None, dense_lens=None)``
    returning :class:`MatcherOutput`. Image tokens are projected but not L2-normalised; token 0 is CLS
    when ``has_cls``. Caption lengths count every valid position including [CLS]/[SEP].

    Everything a trainer, an evaluator, a scoring engine or a server asks of a matcher is declared here
    with a default; subclasses override what differs (``tests/matching/test_matcher_contract.py`` checks every
    registered matcher against it).
    """

    embed_dim: int
    has_cls: bool = False
    # Global image embedding (two-stage search, global warm-up): "cls" uses token 0 when there is a CLS
    # token, "mean" averages all image tokens (always the case without CLS).
    global_pool: str = "cls"
    # Name of an extra loss the trainer adds on ``MatcherOutput.extras`` ("cmc": CMCLoss on the global
    # embeddings, as TGDT trains); None for matchers trained with the hinge on ``sims`` alone.
    global_loss: str | None = None

    # Whether ``forward`` reads dense text; callers skip encoding it when False (saves a text pass). True
    # by default so a new matcher is never silently starved of an input it reads.
    consumes_dense: bool = True
    # "image": dense tokens are (B_v, L_d, C), one per candidate image (leak-free); "caption": (B_t, L_d, C),
    # the dense text of each caption's ground-truth image (the official SEPS protocol, leaky).
    dense_pairing: str = "image"

    # Patch selection: the kept share the ratio loss pulls towards (None: the matcher selects nothing) and
    # how that loss combines the branches' decisions ("sum_masks" | "per_branch", see RatioLoss).
    selection_ratio: float | None = None
    ratio_mode: str = "sum_masks"
    # Names of the ``MatcherOutput.decisions`` branches, in order (SEPS: ("caption", "dense")).
    selection_branches: tuple[str, ...] = ()

    #: Whether it compares tokens (False: a global matcher, pooled embeddings only; pretraining with one is
    #: evaluated by the global cosine, nothing finer)
    token_level: bool = True

    #: Whether ``forward`` plans with the values of ``cap_lens`` (SCAN and NAAF trim each chunk of captions
    #: to its longest one) and takes them on the host while its tokens are on an accelerator: the forward
    #: engine then hands it the host lengths it planned with, which it reads without waiting for the device
    #: (False: the lengths come on the tokens' device).
    host_lengths: bool = False

    @classmethod
    def reads_stage1_tokens(cls, config: object) -> bool:
        """Whether a matcher built from ``config`` reads the context transformers' stage-1 tokens
        (``emit_stage1``; TGDT's official test-time local tokens), known before building it."""
        return False

    @classmethod
    def reads_dense(cls, config: object) -> bool:
        """Whether a matcher built from ``config`` reads dense text (known before building it, so data
        loading can skip dense captions)."""
        return cls.consumes_dense

    @property
    def leaky(self) -> bool:
        """True when a query carries text generated from its target image (caption-tied dense text)."""
        return self.consumes_dense and self.dense_pairing == "caption"

    def temperature_scale(self) -> torch.Tensor | None:
        """The learned inverse temperature a contrastive (InfoNCE) loss multiplies the sims by (CLIP's
        ``exp(logit_scale)``); None for matchers trained without one."""
        return None

    def update_from_batch(
        self, sims, row_max, cap_lens, *, row_offset=0, image_ids=None, all_reduce=None
    ) -> None:
        """Statistics a matcher fits on the whole training batch after the loss's forward (NAAF's
        thresholds; the matcher marks ``extras["row_max"]`` in its training output): ``sims`` (B, B) of the
        global batch, this process's ``row_max`` rows from ``row_offset``, the batch images' dataset
        ``image_ids`` (B,) and a sum over processes. The default has none."""

    def selection_trace(self, img_tokens, cap_tokens, cap_lens, dense_tokens=None, dense_lens=None):
        """How one (image, caption) pair's patches were selected (explanations), or None for a matcher
        that selects no patches (see :meth:`SEPSMatcher.selection_trace`)."""
        return None

    def two_stage_plan(self) -> TwoStagePlan | None:
        """The two-stage search this matcher is evaluated with, or None to rank the full matrix."""
        return None

    def pair_memory_bytes(self, img_len: int, txt_len: int, dense_len: int, dim: int) -> int | None:
        """Working bytes one (image, caption) pair costs in ``forward``; None: let the scoring engine use
        its generic estimate."""
        return None

    # Input checks: shapes always; values too, except those a training step would have to wait for: in
    # training mode token finiteness is not checked, nor lengths that are on an accelerator (reading them
    # makes the host wait for the device, which a training step must not do in its hot path). Lengths given
    # on the host (a CPU tensor, a sequence) are checked in every mode: that reads nothing from a device.

    def validate_image_tokens(self, img_tokens: torch.Tensor, num_tokens: int | None = None) -> None:
        """Check (B, L_v, C) image tokens; ``num_tokens``: the L_v the matcher expects (patches, plus one
        when ``has_cls``), None: any from the least the matcher reads: one token, and one past the CLS for
        a matcher that compares tokens (``token_level``)."""
        check_tensor(img_tokens, "img_tokens", shape=(None, None, self.embed_dim), finite=False)
        if num_tokens is not None and img_tokens.shape[1] != num_tokens:
            patches = f"{num_tokens - int(self.has_cls)} patches" + (" + CLS" if self.has_cls else "")
            raise ValueError(
                f"img_tokens has {img_tokens.shape[1]} tokens per image, the matcher expects {num_tokens} "
                f"({patches}; shape {tuple(img_tokens.shape)})"
            )
        # A CLS alone has no patch to compare with a word (FILIP's max over none was torch's IndexError);
        # a global matcher pools what it is given, the CLS alone included. A shape: nothing is read.
        least = 1 + int(self.has_cls and self.token_level)
        if img_tokens.shape[1] < least:
            needs = "the CLS (global slot) and at least one patch or region" if least == 2 else "one token"
            raise ValueError(
                f"img_tokens has {img_tokens.shape[1]} tokens per image, the matcher needs {needs} "
                f"(shape {tuple(img_tokens.shape)})"
            )
        if not self.training:
            check_finite(img_tokens, "img_tokens")

    def validate_text(
        self, tokens: torch.Tensor, lens: object, name: str = "cap_tokens", batch: int | None = None
    ) -> torch.Tensor:
        """Check (B, L, C) text tokens and their (B,) lengths; return the lengths as int64."""
        check_tensor(tokens, name, shape=(batch, None, self.embed_dim), finite=not self.training)
        lens_name = name.replace("_tokens", "_lens")
        on_host = not isinstance(lens, torch.Tensor) or lens.device.type == "cpu"
        lens = check_lengths(
            lens,
            lens_name,
            size=tokens.shape[0],
            max_len=tokens.shape[1],
            values=on_host or not self.training,
        )
        # host lengths go up without waiting for the device's queue (pageable memory is staged at once)
        return lens.to(tokens.device, non_blocking=lens.device.type == "cpu")

    def global_image(self, img_tokens: torch.Tensor) -> torch.Tensor:
        """(B_v, L_v, C) tokens -> (B_v, C) L2-normalised global image embedding (CLS or mean, see
        ``global_pool``)."""
        self.validate_image_tokens(img_tokens)
        use_cls = self.has_cls and self.global_pool == "cls"
        pooled = img_tokens[:, 0] if use_cls else img_tokens.mean(dim=1)
        return l2norm(full_precision(pooled))

    def global_text(self, cap_tokens: torch.Tensor, cap_lens: object) -> torch.Tensor:
        """(B_t, L_t, C) tokens and (B_t,) lengths -> (B_t, C) L2-normalised mean over valid tokens."""
        lens = self.validate_text(cap_tokens, cap_lens)
        return l2norm(masked_mean(full_precision(cap_tokens), lens))

    def global_embed(
        self, img_tokens: torch.Tensor, cap_tokens: torch.Tensor, cap_lens: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Global embeddings for the first stage of two-stage search.

        Returns:
            ((B_v, C), (B_t, C)) L2-normalised image and caption embeddings; their dot product is the
            global similarity.
        """
        return self.global_image(img_tokens), self.global_text(cap_tokens, cap_lens)


def caption_blocks(n_txt: int, step: int) -> list[slice]:
    """The blocks of at most ``step`` captions a matcher scores in turn, as slices of its ``n_txt`` captions.

    A batch of no captions is one empty block: the block's computation still runs once, on (0, L, C)
    caption tokens, and returns the (B_v, 0) sims and the (B_v, 0, ...) decisions and extras it returns for
    any other batch (as a batch of no images does), where looping over no block at all left nothing to
    concatenate. ``n_txt`` is a shape: nothing is read from a device.
    """
    step = max(1, step)
    return [slice(start, start + step) for start in range(0, max(1, n_txt), step)]


def chunk_widths(cap_lens: object, lens: torch.Tensor, step: int, width: int) -> list[int]:
    """The longest caption of each block of ``step`` captions (:func:`caption_blocks`): the widths the
    blocks are trimmed to; ``width`` (the tokens' L) for the empty block of a batch of no captions.

    Read from ``cap_lens`` as the caller gave it when that is on the host (a sequence, or the host lengths
    a scoring engine planned with: no wait for the device), else from the validated ``lens`` on their
    device, in one read for all chunks.
    """
    if lens.shape[0] == 0:
        return [width]
    given_on_host = not isinstance(cap_lens, torch.Tensor) or cap_lens.device.type == "cpu"
    source = torch.as_tensor(cap_lens).long() if given_on_host else lens
    padded = F.pad(source, (0, -source.shape[0] % step))  # lengths are >= 0: the zeros change no maximum
    return padded.view(-1, step).amax(dim=1).tolist()
