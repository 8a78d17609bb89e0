"""What every scoring engine shares: the inputs of a job, a block plan, the engine protocol.

The dispatcher (:mod:`patchword.eval.engine.core`: ``score_matrix``, ``engine_for``) and every engine
(``forward``, ``seps``, ``vse``, ``tgdt``) import these types from here; this module imports no engine, so
engines and dispatcher never import each other (the import contracts in pyproject.toml check it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from patchword._validation import (
    check_all_finite,
    check_lengths,
    check_tensor,
    finite_flag,
    raise_non_finite,
    values_are_checked,
    values_checked,
)
from patchword.eval.engine.memory import CPU_BUDGET_MB
from patchword.matching.base import Matcher
from patchword.progress import progress_bar

__all__ = [
    "DEFAULT_MAX_MEMORY_MB",
    "PRECISIONS",
    "BlockPlan",
    "PendingCheck",
    "ScoringEngine",
    "ScoringInputs",
    "check_input_values",
    "check_precision",
    "tf32_products",
]

#: Working-memory budget on the CPU when none is given (MiB): the default of the engines' callers that
#: take a number (two-stage search, the compositional suite); ``score_matrix`` picks one per device.
DEFAULT_MAX_MEMORY_MB = CPU_BUDGET_MB

#: Precisions of an engine's matrix products (``score_matrix(precision=...)``): "fp32" everywhere (exact),
#: or "tf32": TF32 tensor cores (10-bit mantissa operands, fp32 accumulation) for the products that only
#: feed the final similarity, never for those that feed a top-K patch selection (CUDA only).
PRECISIONS = ("fp32", "tf32")


@dataclass
class ScoringInputs:
    """Validated inputs of one scoring job (all on the CPU or the caller's device, any float dtype).

    Attributes:
        img_tokens: (N_img, L_v, C) projected image tokens (CLS first when the matcher has one).
        cap_tokens: (N_txt, L_t, C) caption tokens; ``cap_lens`` (N_txt,) valid counts incl. specials.
        dense_tokens: (N_dense, L_d, C) dense-caption tokens or None; ``dense_lens`` (N_dense,).
        dense_index: (N_txt,) row of ``dense_tokens`` paired with each caption when dense text is tied to
            captions (official protocol); None when it is tied to images (row v belongs to image v).
        image_constants: (N_img,) the part of every score that depends on the image alone, precomputed by
            :meth:`ScoringEngine.image_constants` (SEPS's image-tied dense branch), in place of the dense
            tokens it came from; None when computed from the inputs.
        patch_prior: (N_img, M) for images pruned to M patches at index time (``img_tokens`` then holds
            [CLS?, M kept patches]): the image-only part of each kept patch's selection score, computed
            on all the image's patches before pruning (:func:`patchword.search.pruning.prune_patches`);
            only engines with ``prunable`` read it. None: every patch is there.
    """

    img_tokens: torch.Tensor
    cap_tokens: torch.Tensor
    cap_lens: torch.Tensor
    dense_tokens: torch.Tensor | None = None
    dense_lens: torch.Tensor | None = None
    dense_index: torch.Tensor | None = None
    image_constants: torch.Tensor | None = None
    patch_prior: torch.Tensor | None = None

    @property
    def num_images(self) -> int:
        return self.img_tokens.shape[0]

    @property
    def num_texts(self) -> int:
        return self.cap_tokens.shape[0]


@dataclass
class BlockPlan:
    """How an engine split the job: block sizes, formulation, and its estimate of the peak (bytes)."""

    engine: str
    image_block: int
    text_block: int
    dense_block: int = 0
    estimated_peak_bytes: int = 0
    budget_bytes: int = 0
    details: dict[str, Any] = field(default_factory=dict)


class ScoringEngine:
    """Base class of the engines. Subclasses implement :meth:`score` and set ``self.last_plan``.

    ``score`` fills ``out`` (N_img, N_txt) float32 (on the CPU, or on the compute device) with the
    matcher's eval-mode similarities, never keeping more than ``budget`` bytes of working tensors alive
    (inputs and ``out`` excluded). Inputs may be on the CPU or on the compute device; engines that compute
    on an accelerator stage them there once (:mod:`~patchword.eval.engine.staging`).
    """

    name = "engine"
    #: Whether the engine scores images pruned at index time (``ScoringInputs.patch_prior``).
    prunable = False
    #: CPU threads of control taking image blocks (None: one per torch thread; 1: the caller alone, its
    #: ops on torch's intra-op threads), for engines that split a job (:mod:`~patchword.eval.engine.workers`).
    workers: int | None = None
    #: The :data:`PRECISIONS` the engine implements; ``precision`` is the one it computes in.
    precisions: tuple[str, ...] = ("fp32",)
    #: Whether the engine reads caption positions past the longest caption (a mean over the whole padded
    #: axis): its finiteness check then covers every position, else those up to the longest caption.
    reads_caption_padding = False

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.last_plan: BlockPlan | None = None
        self.precision = "fp32"

    def check_shapes(self, inputs: ScoringInputs) -> None:
        """The shape checks the matcher's forward makes of its inputs, made of the whole job (no value is
        read): image tokens as the matcher expects them (:meth:`Matcher.validate_image_tokens`), text tokens
        of the same width. An engine whose matcher expects a number of image tokens overrides it."""
        with values_checked():
            self.matcher.validate_image_tokens(inputs.img_tokens)
        self._check_text_shapes(inputs)

    @staticmethod
    def _check_text_shapes(inputs: ScoringInputs) -> None:
        dim = inputs.img_tokens.shape[2]
        check_tensor(inputs.cap_tokens, "cap_tokens", shape=(None, None, dim), finite=False)
        if inputs.dense_tokens is not None:
            check_tensor(inputs.dense_tokens, "dense_tokens", shape=(None, None, dim), finite=False)

    def check_inputs(
        self, inputs: ScoringInputs, *, whole_captions: bool | None = None, defer: bool = False
    ) -> PendingCheck | None:
        """The checks the matcher's forward makes of every block, made once for the whole job at the entry
        of :meth:`score`, :meth:`score_pairs` and :meth:`image_constants`: shapes (:meth:`check_shapes`),
        then the values (:func:`check_input_values`: lengths on the host, the finiteness of every tensor in
        one read of the device). The block loop then runs under
        :func:`~patchword._validation.values_checked`.

        ``inputs``: with the lengths on the host (a staged job's). ``whole_captions``: check the finiteness
        of every caption position (None: :attr:`reads_caption_padding`), else those up to the longest
        caption, all that the blocks read. ``defer``: return the finiteness unread (a
        :class:`PendingCheck`) for the engine to read with its first wait for the device. Under
        ``values_checked`` (a caller checked the whole job: :meth:`score_pairs`'s per-image calls) only
        shapes are checked.
        """
        self.check_shapes(inputs)
        if values_are_checked():
            return None
        whole = self.reads_caption_padding if whole_captions is None else whole_captions
        width = None if whole or inputs.num_texts == 0 else int(inputs.cap_lens.max())  # host lengths
        return check_input_values(inputs, caption_width=width, defer=defer)

    def image_constants(
        self, img_tokens: torch.Tensor, dense_tokens: torch.Tensor, dense_lens: torch.Tensor, *, device
    ) -> torch.Tensor | None:
        """The part of every score that depends on the image alone, if the matcher has one: (N_img,)
        float32, computed from (N_img, L_v, C) image tokens and their image-tied (N_img, L_d, C) dense
        tokens. A search index can store it instead of the dense tokens (``ScoringInputs.image_constants``
        then replaces them, with the same scores). None (the default): no such part."""
        return None

    def score(
        self,
        inputs: ScoringInputs,
        out: torch.Tensor,
        *,
        budget: int,
        device: torch.device,
        progress: bool | None,
    ) -> None:
        raise NotImplementedError

    def score_staged(self, job, out: torch.Tensor, *, budget: int, progress: bool | None) -> None:
        """:meth:`score` of a job staged already (a :class:`~patchword.eval.engine.staging.Staged`: tokens
        on ``job.device``, lengths on the host and on the device). Engines that stage override it, so that
        :meth:`score_pairs` stages once, not once per block; the default scores ``job.inputs``."""
        self.score(job.inputs, out, budget=budget, device=job.device, progress=progress)

    @torch.no_grad()
    def score_pairs(
        self,
        inputs: ScoringInputs,
        img_index: torch.Tensor,
        txt_index: torch.Tensor,
        *,
        budget: int,
        device: torch.device,
        progress: bool | None = None,
    ) -> torch.Tensor:
        """Similarities of the listed pairs only (two-stage re-ranking): (P,) float32 on the CPU.

        The default stages the job once (tokens on ``device``; lengths and the pair lists read on the host
        once; the index tensors uploaded in one copy), scores blocks of images against the distinct texts
        their pairs name (:func:`~patchword.eval.engine.staging.pair_blocks`) with :meth:`score_staged`
        into a matrix on the device, gathers the listed pairs there and copies them back once: the loop
        never waits for the device. Engines may override it with something faster.
        """
        # staging imports this module (ScoringInputs): its helpers are imported here, closing no cycle
        from patchword.eval.engine.staging import host, host_pairs, pair_blocks, stage, sub_job

        job = stage(inputs, device, None)
        self.check_inputs(job.inputs)  # once (lengths on the host): the blocks below check shapes only
        img_index, txt_index = host_pairs(img_index, txt_index, job.inputs.num_images, job.inputs.num_texts)
        plan = pair_blocks(job.inputs, img_index, txt_index, budget, job.accelerator)
        on_host = (plan.images, plan.texts, plan.cells, plan.pairs)
        images, texts, cells, pairs = job.put(torch.cat(on_host)).split([t.numel() for t in on_host])
        result = torch.empty(img_index.shape[0], dtype=torch.float32, device=job.device)  # copied back once
        with (
            progress_bar(int(img_index.shape[0]), "re-rank pairs", progress, unit="pair") as bar,
            values_checked(),
        ):
            for (i0, i1), (t0, t1), (p0, p1) in plan.blocks:
                sub = sub_job(job, (plan.images[i0:i1], images[i0:i1]), (plan.texts[t0:t1], texts[t0:t1]))
                out = torch.empty(i1 - i0, t1 - t0, dtype=torch.float32, device=job.device)
                self.score_staged(sub, out, budget=budget, progress=False)
                result[pairs[p0:p1]] = out.reshape(-1)[cells[p0:p1]]
                bar.update(p1 - p0)
        return host(result)


@dataclass
class PendingCheck:
    """The finiteness of a job's inputs computed on the device and not read yet (``check_input_values(...,
    defer=True)``): the engine reads ``flag`` together with a value it waits for anyway (one wait, not
    two), before any result leaves the device, and passes what it read to :meth:`settle`."""

    flag: torch.Tensor  # 0-dim bool on the device
    named: list[tuple[torch.Tensor, str]]

    def settle(self, finite: bool) -> None:
        """Raise naming the first non-finite tensor unless ``finite`` (the value read of ``flag``)."""
        if not finite:
            raise_non_finite(self.named)


def check_input_values(
    inputs: ScoringInputs, caption_width: int | None = None, *, defer: bool = False
) -> PendingCheck | None:
    """Check once, before a block loop, the values that the matcher calls of every block would check: the
    lengths fit their token axes (on the host: staged lengths) and the tokens (and the precomputed image
    constants and pruning priors, when given) are finite (one read of the device for all of them). The
    loop then runs under :func:`patchword._validation.values_checked` and waits for the device only for
    its results.

    ``caption_width``: the caption positions the loop reads (trimmed to the widest caption), None: all.
    ``defer``: the tensors' finiteness is returned unread, as a :class:`PendingCheck` (None: nothing left
    to read), when they are on one device that is not the CPU; else it is read here.
    """
    cap_lens, dense_lens = inputs.cap_lens, inputs.dense_lens
    check_lengths(cap_lens, "cap_lens", size=inputs.num_texts, max_len=inputs.cap_tokens.shape[1])
    named = [(inputs.img_tokens, "img_tokens"), (inputs.cap_tokens[:, :caption_width], "cap_tokens")]
    if inputs.dense_tokens is not None:
        dense = inputs.dense_tokens
        check_lengths(dense_lens, "dense_lens", size=dense.shape[0], max_len=dense.shape[1])
        named.append((dense, "dense_tokens"))
    for extra, name in ((inputs.image_constants, "image_constants"), (inputs.patch_prior, "patch_prior")):
        if extra is not None:
            named.append((extra, name))
    devices = {x.device for x, _ in named}
    if defer and len(devices) == 1 and next(iter(devices)).type != "cpu":
        flag = finite_flag(named)
        return None if flag is None else PendingCheck(flag, named)
    check_all_finite(named)
    return None


def check_precision(engine: ScoringEngine, precision: str, device: torch.device) -> str:
    """``precision`` if ``engine`` can compute in it on ``device``, else ValueError naming what fits."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision not in engine.precisions:
        raise ValueError(
            f"precision={precision!r}: the {engine.name} engine of {type(engine.matcher).__name__} computes "
            f"in {', '.join(engine.precisions)} only"
        )
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(f"precision='tf32' uses CUDA tensor cores; the device is {device} (use 'fp32')")
    return precision


@contextlib.contextmanager
def tf32_products(enabled: bool) -> Iterator[None]:
    """CUDA float32 matrix products in TF32 within the block when ``enabled`` (the previous setting is
    restored after). torch has no per-product precision: the flag is process-wide, so an engine turns it
    on around exactly the products that may use it (one thread of control on an accelerator)."""
    if not enabled:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
