"""``score_matrix``: the exact full similarity matrix of any matcher, fast where an engine exists.

A *scoring engine* computes the (N_img, N_txt) matrix of one matcher in blocks whose size is chosen from
a memory budget. Engines live in this package and are registered for a matcher class
(``register_matcher(..., engine=...)``); a matcher without one is scored by
:class:`~patchword.eval.engine.forward.ForwardEngine`, block-wise calls of its own forward.

Every engine must equal the matcher's eval-mode forward pass (to float rounding); ``engine="forward"``
forces the fallback, which is how the fast engines are tested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from patchword._validation import check_lengths, check_tensor
from patchword.eval.engine.memory import CPU_BUDGET_MB, budget_bytes, default_budget_mb
from patchword.matching.base import Matcher
from patchword.progress import progress_bar

__all__ = [
    "DEFAULT_MAX_MEMORY_MB",
    "ScoringEngine",
    "ScoringInputs",
    "engine_for",
    "prepare_inputs",
    "register_engine",
    "score_matrix",
]

#: Working-memory budget on the CPU when none is given (MiB): the default of the engines' callers that
#: take a number (two-stage search, the compositional suite); ``score_matrix`` picks one per device.
DEFAULT_MAX_MEMORY_MB = CPU_BUDGET_MB

# matcher class -> engine factory; looked up along the MRO, so subclasses inherit their base's engine.
_ENGINES: dict[type, Callable[[nn.Module], ScoringEngine]] = {}


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

    def subset(self, images: torch.Tensor, texts: torch.Tensor) -> ScoringInputs:
        """The inputs restricted to some images and texts (index tensors on any device: each tensor is
        indexed with a copy on its own device; dense rows follow)."""

        def take(tensor: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
            return None if tensor is None else tensor[index.to(tensor.device)]

        dense, dense_lens, index = self.dense_tokens, self.dense_lens, self.dense_index
        if dense is not None and index is None:  # image-tied: row v belongs to image v
            dense, dense_lens = take(dense, images), take(dense_lens, images)
        elif dense is not None:
            index = take(index, texts)
        constants = take(self.image_constants, images)
        prior = take(self.patch_prior, images)
        return ScoringInputs(
            take(self.img_tokens, images),
            take(self.cap_tokens, texts),
            take(self.cap_lens, texts),
            dense,
            dense_lens,
            index,
            constants,
            prior,
        )

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

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher
        self.last_plan: BlockPlan | None = None

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

        The default groups the pairs by image and scores each image against its own captions with
        :meth:`score`; engines may override it with something faster.
        """
        # the grouping is planned on the host (one copy of each index when they are on a device)
        img_index, txt_index = img_index.cpu(), txt_index.cpu()
        result = torch.empty(img_index.shape[0], dtype=torch.float32)
        order = torch.argsort(img_index, stable=True)
        images, counts = torch.unique_consecutive(img_index[order], return_counts=True)
        with progress_bar(int(img_index.shape[0]), "re-rank pairs", progress, unit="pair") as bar:
            start = 0
            for v, count in zip(images.tolist(), counts.tolist(), strict=True):
                sel = order[start : start + count]
                start += count
                texts = txt_index[sel]
                sub = inputs.subset(torch.tensor([v]), texts)
                out = torch.empty(1, count, dtype=torch.float32)
                self.score(sub, out, budget=budget, device=device, progress=False)
                result[sel] = out[0]
                bar.update(count)
        return result


def register_engine(matcher_cls: type) -> Callable[[Callable[[nn.Module], ScoringEngine]], Any]:
    """Decorator attaching an engine factory (usually the engine class) to a matcher class that was not
    registered with one (``register_matcher(..., engine="module:Class")`` is the usual way)."""

    def decorator(factory: Callable[[nn.Module], ScoringEngine]) -> Any:
        _ENGINES[matcher_cls] = factory
        return factory

    return decorator


def _declared_engine(matcher: Matcher) -> Callable[[nn.Module], ScoringEngine] | None:
    """The engine a matcher's class was given: attached with :func:`register_engine`, or declared at its
    registration (imported now)."""
    import importlib

    from patchword.matching.registry import matcher_spec_for

    for cls in type(matcher).__mro__:
        if cls in _ENGINES:
            return _ENGINES[cls]
    spec = matcher_spec_for(matcher)
    if spec is None or spec.engine is None:
        return None
    module, _, name = spec.engine.partition(":")
    return getattr(importlib.import_module(module), name)


def engine_for(matcher: Matcher, engine: str | ScoringEngine | None = None) -> ScoringEngine:
    """The engine that will score ``matcher``.

    Args:
        matcher: any matcher module.
        engine: ``None`` / ``"auto"`` (the matcher's declared fast engine if any, else the forward
            fallback), ``"forward"`` (always block-wise forward calls), or a ready engine instance.
    """
    from patchword.eval.engine.forward import ForwardEngine

    if isinstance(engine, ScoringEngine):
        return engine
    if engine == "forward":
        return ForwardEngine(matcher)
    if engine not in (None, "auto"):
        raise ValueError(f"engine must be None, 'auto', 'forward' or a ScoringEngine, got {engine!r}")
    factory = _declared_engine(matcher)
    return factory(matcher) if factory is not None else ForwardEngine(matcher)


def _matcher_device(matcher: Matcher) -> torch.device:
    for tensor in list(matcher.parameters()) + list(matcher.buffers()):
        return tensor.device
    return torch.device("cpu")


def _dense_pairing(matcher: Matcher) -> str:
    return matcher.dense_pairing if matcher.consumes_dense else "none"


def prepare_inputs(
    matcher: Matcher,
    img_tokens: torch.Tensor,
    cap_tokens: torch.Tensor,
    cap_lens: object,
    dense_tokens: torch.Tensor | None,
    dense_lens: object,
    txt2img: object,
    image_constants: torch.Tensor | None = None,
    patch_prior: torch.Tensor | None = None,
) -> ScoringInputs:
    """Validate ``score_matrix``'s arguments and resolve the dense pairing into :class:`ScoringInputs`.

    ``image_constants`` (N_img,): the precomputed per-image part of every score (see
    :meth:`ScoringEngine.image_constants`), given instead of the dense tokens it replaces.
    ``patch_prior`` (N_img, M): images pruned to M patches at index time (see ``ScoringInputs``)."""
    inputs = _prepare_inputs(
        matcher, img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens, txt2img, image_constants
    )
    if patch_prior is not None:
        factory = _declared_engine(matcher)
        if not getattr(factory, "prunable", False):
            raise ValueError(f"{type(matcher).__name__} cannot score images pruned at index time")
        inputs.patch_prior = check_tensor(patch_prior, "patch_prior", shape=(inputs.num_images, None))
    return inputs


def _prepare_inputs(
    matcher, img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens, txt2img, image_constants
) -> ScoringInputs:
    img_tokens = check_tensor(img_tokens, "img_tokens", ndim=3, finite=False)
    dim = img_tokens.shape[2]
    cap_tokens = check_tensor(cap_tokens, "cap_tokens", shape=(None, None, dim), finite=False)
    if img_tokens.shape[0] == 0 or cap_tokens.shape[0] == 0:
        raise ValueError("score_matrix needs at least one image and one caption")
    cap_lens = check_lengths(cap_lens, "cap_lens", size=cap_tokens.shape[0], max_len=cap_tokens.shape[1])
    pairing = _dense_pairing(matcher)
    if image_constants is not None:
        if dense_tokens is not None:
            raise ValueError("give dense_tokens or the image_constants computed from them, not both")
        image_constants = check_tensor(image_constants, "image_constants", shape=(img_tokens.shape[0],))
        return ScoringInputs(img_tokens, cap_tokens, cap_lens, image_constants=image_constants)
    if dense_tokens is None or pairing == "none":
        return ScoringInputs(img_tokens, cap_tokens, cap_lens)
    dense_tokens = check_tensor(dense_tokens, "dense_tokens", shape=(None, None, dim), finite=False)
    dense_lens = check_lengths(
        dense_lens, "dense_lens", size=dense_tokens.shape[0], max_len=dense_tokens.shape[1]
    )
    n_img, n_txt, n_dense = img_tokens.shape[0], cap_tokens.shape[0], dense_tokens.shape[0]
    if pairing != "caption":
        if n_dense != n_img:
            raise ValueError(f"dense_tokens tied to images need one row per image ({n_img}), got {n_dense}")
        return ScoringInputs(img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens)
    if txt2img is None:
        if n_dense != n_txt:
            raise ValueError(
                f"dense_pairing='caption' needs one dense row per caption ({n_txt}), got {n_dense}; or pass "
                "txt2img to pair caption j with dense row txt2img[j] (rows = images)"
            )
        index = torch.arange(n_txt)
    else:
        index = torch.as_tensor(txt2img).long().cpu()
        if index.shape != (n_txt,):
            raise ValueError(f"txt2img must have shape ({n_txt},), got {tuple(index.shape)}")
        if int(index.min()) < 0 or int(index.max()) >= n_dense:
            raise ValueError(f"txt2img values must index the {n_dense} dense rows")
    return ScoringInputs(img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens, index)


@torch.no_grad()
def score_matrix(
    matcher: Matcher,
    img_tokens: torch.Tensor,
    cap_tokens: torch.Tensor,
    cap_lens: object,
    dense_tokens: torch.Tensor | None = None,
    dense_lens: object = None,
    *,
    txt2img: object = None,
    max_memory_mb: float | None = None,
    device: torch.device | str | None = None,
    progress: bool | None = None,
    engine: str | ScoringEngine | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The exact (N_img, N_txt) similarity matrix of ``matcher`` in bounded memory.

    Equal (to float rounding, <= 1e-5) to calling the matcher's forward in eval mode on every pair, but
    per-image and per-caption work is done once and the pair work is reformulated (see
    ``patchword.eval.engine.seps``). The matcher is put in eval mode for the call and restored after.

    Args:
        matcher: a matcher module (``build_matcher(...)``) on ``device``.
        img_tokens: (N_img, L_v, C) projected image tokens (CLS first when the matcher has one).
        cap_tokens: (N_txt, L_t, C) caption tokens, ``cap_lens`` (N_txt,) valid counts incl. specials.
        dense_tokens: dense (MLLM) caption tokens, ``dense_lens`` their lengths. With the matcher's
            ``dense_pairing="image"``: (N_img, L_d, C), row v describes image v. With ``"caption"``:
            (N_txt, L_d, C), one per caption, or any (N_dense, L_d, C) plus ``txt2img``.
        txt2img: (N_txt,) with caption-tied dense text, caption j uses dense row ``txt2img[j]`` (rows =
            images); captions sharing a dense row share its dense-branch work.
        max_memory_mb: budget for the engine's working tensors in MiB (inputs and the result excluded);
            block sizes are chosen so that the peak stays below it, whatever N_img x N_txt is. None:
            :func:`~patchword.eval.engine.memory.default_budget_mb` of ``device`` (1024 MiB on the CPU;
            on an accelerator half its free memory, at most 32 GiB: blocks of thousands of pairs).
        device: where to compute (default: the matcher's device). On an accelerator the inputs are moved
            there once and each image block's rows come back once.
        progress: progress bar (default: only on a terminal).
        engine: None/"auto", "forward" (block-wise forward fallback) or a :class:`ScoringEngine`.
        out: optional preallocated (N_img, N_txt) float32 tensor to fill, on the CPU (e.g. over a memory
            map) or on ``device`` (then nothing comes back to the host).

    Returns:
        (N_img, N_txt) float32 CPU tensor (``out`` when given).

    Raises:
        ValueError: malformed inputs, or a budget too small for a single image-caption block.
    """
    inputs = prepare_inputs(matcher, img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens, txt2img)
    device = _matcher_device(matcher) if device is None else torch.device(device)
    budget = budget_bytes(default_budget_mb(device) if max_memory_mb is None else max_memory_mb)
    shape = (inputs.num_images, inputs.num_texts)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif out.shape != shape or out.dtype != torch.float32 or out.device.type not in ("cpu", device.type):
        raise ValueError(f"out must be a float32 tensor of shape {shape} on the CPU or on {device}")
    scorer = engine_for(matcher, engine)
    was_training = matcher.training
    matcher.eval()
    try:
        scorer.score(inputs, out, budget=budget, device=device, progress=progress)
    finally:
        matcher.train(was_training)
    return out
