"""``score_matrix``: the exact full similarity matrix of any matcher, fast where an engine exists.

A *scoring engine* (:class:`~patchword.eval.engine.base.ScoringEngine`) computes the (N_img, N_txt)
matrix of one matcher in blocks whose size is chosen from a memory budget. Engines live in this package and
are declared at a matcher's registration (``register_matcher(..., engine="module:Class")``, the one way to
attach one); a matcher without one is scored by
:class:`~patchword.eval.engine.forward.ForwardEngine`, block-wise calls of its own forward.

Every engine must equal the matcher's eval-mode forward pass (to float rounding); ``engine="forward"``
forces the fallback, which is how the fast engines are tested.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from patchword._validation import check_lengths, check_tensor
from patchword.device import checked_device, module_device
from patchword.errors import PatchwordError
from patchword.eval.engine.base import ScoringEngine, ScoringInputs, check_precision
from patchword.eval.engine.forward import ForwardEngine
from patchword.eval.engine.memory import budget_bytes, default_budget_mb
from patchword.eval.metrics import check_txt2img
from patchword.eval.scoring import eval_mode
from patchword.matching.base import Matcher
from patchword.matching.registry import matcher_spec, matcher_spec_for

__all__ = ["EngineImportError", "declared_precisions", "engine_for", "prepare_inputs", "score_matrix"]


class EngineImportError(PatchwordError, ImportError):
    """The engine a matcher's registration names (``register_matcher(..., engine="module:Class")``) cannot
    be imported: the message names the matcher and the engine string (the import's own error is chained)."""


def _declared_engine(matcher: Matcher) -> Callable[[nn.Module], ScoringEngine] | None:
    """The engine declared at the matcher's registration (``register_matcher(..., engine="module:Class")``,
    the one way to attach one; subclasses inherit it), imported now; None without one."""
    return _engine_class(matcher_spec_for(matcher))


def _engine_class(spec) -> Callable[[nn.Module], ScoringEngine] | None:
    """The engine class a registration names (``"module:Class"``), imported now; None without one.

    Raises:
        EngineImportError: the module does not import or has no such class, naming the matcher and the
            engine string (a bare ``ModuleNotFoundError`` named neither the matcher nor its registration).
    """
    if spec is None or spec.engine is None:
        return None
    module, _, name = spec.engine.partition(":")
    where = f"matcher {spec.name!r}: its engine {spec.engine!r} (register_matcher(..., engine=))"
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        raise EngineImportError(f"{where} cannot be imported: {type(err).__name__}: {err}") from err
    engine = getattr(imported, name, None)
    if engine is None:
        raise EngineImportError(f"{where}: module {module!r} has no {name!r}")
    return engine


def declared_precisions(matcher_name: str) -> tuple[str, ...]:
    """The :data:`~patchword.eval.engine.base.PRECISIONS` that the engine declared for the registered
    matcher ``matcher_name`` offers (``("fp32",)`` with the forward fallback): a config can be checked
    before any model is built."""
    return (_engine_class(matcher_spec(matcher_name)) or ForwardEngine).precisions


def engine_for(matcher: Matcher, engine: str | ScoringEngine | None = None) -> ScoringEngine:
    """The engine that will score ``matcher``.

    Args:
        matcher: any matcher module.
        engine: ``None`` / ``"auto"`` (the matcher's declared fast engine if any, else the forward
            fallback), ``"forward"`` (always block-wise forward calls), or a ready engine instance.
    """
    if isinstance(engine, ScoringEngine):
        return engine
    if engine == "forward":
        return ForwardEngine(matcher)
    if engine not in (None, "auto"):
        raise ValueError(f"engine must be None, 'auto', 'forward' or a ScoringEngine, got {engine!r}")
    factory = _declared_engine(matcher)
    return factory(matcher) if factory is not None else ForwardEngine(matcher)


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

    Shapes and lengths are checked here; what the matcher itself requires of its inputs (its image token
    count and width) and the finiteness of every tensor are checked once by the engine that scores them,
    at its entry (:meth:`~patchword.eval.engine.base.ScoringEngine.check_inputs`).

    ``image_constants`` (N_img,): the precomputed per-image part of every score (see
    :meth:`ScoringEngine.image_constants`), given instead of the dense tokens it replaces.
    ``patch_prior`` (N_img, M): images pruned to M patches at index time (see ``ScoringInputs``)."""
    inputs = _prepare_inputs(
        matcher, img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens, txt2img, image_constants
    )
    if txt2img is not None and inputs.dense_index is None:
        # a map the pairing does not read (no dense text, or image-tied) is still a caption -> image map:
        # refused when it is not one (float, bool, wrong length, negative id). No upper bound: the images
        # scored may be one block of a split whose map holds the split's ids (each process of a distributed
        # evaluation scores its block with the whole split's txt2img)
        check_txt2img(txt2img, inputs.num_texts, None)
    if patch_prior is not None:
        factory = _declared_engine(matcher)
        if not getattr(factory, "prunable", False):
            raise ValueError(f"{type(matcher).__name__} cannot score images pruned at index time")
        # finiteness: with the tokens', in one read at the engine's entry (ScoringEngine.check_inputs)
        inputs.patch_prior = check_tensor(
            patch_prior, "patch_prior", shape=(inputs.num_images, None), finite=False
        )
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
    n_img, n_txt = img_tokens.shape[0], cap_tokens.shape[0]
    pairing = _dense_pairing(matcher)
    if image_constants is not None:
        if dense_tokens is not None:
            raise ValueError("give dense_tokens or the image_constants computed from them, not both")
        image_constants = check_tensor(image_constants, "image_constants", shape=(n_img,), finite=False)
        return ScoringInputs(img_tokens, cap_tokens, cap_lens, image_constants=image_constants)
    if dense_tokens is None or pairing == "none":
        return ScoringInputs(img_tokens, cap_tokens, cap_lens)
    dense_tokens = check_tensor(dense_tokens, "dense_tokens", shape=(None, None, dim), finite=False)
    dense_lens = check_lengths(
        dense_lens, "dense_lens", size=dense_tokens.shape[0], max_len=dense_tokens.shape[1]
    )
    n_dense = dense_tokens.shape[0]
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
        # the rows it indexes are the dense rows given, which need not be the images scored (a block of
        # images against the dense rows of every image its captions describe: bench.gallery)
        index = check_txt2img(txt2img, n_txt, n_dense, rows="dense rows", device=torch.device("cpu"))
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
    precision: str = "fp32",
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
        txt2img: (N_txt,) integer ids (tensor, array or sequence). With caption-tied dense text,
            caption j uses dense row ``txt2img[j]`` (rows = images; ids in [0, N_dense)); captions sharing
            a dense row share its dense-branch work. Otherwise not read, but a float, a bool mask, a wrong
            length or a negative id is still refused.
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
        precision: "fp32" (exact) or "tf32" (CUDA, an engine that offers it: SEPS / LAPS): the alignment
            products in TF32, the products that rank patches for the top-K selection in float32. Not exact:
            scores move by ~1e-3 (docs/benchmarks.md has the effect on R@K).

    Returns:
        (N_img, N_txt) float32 CPU tensor (``out`` when given).

    Raises:
        ValueError: malformed inputs (``txt2img`` included), a budget too small for a single image-caption
            block, or a precision the engine or the device does not offer.
    """
    inputs = prepare_inputs(matcher, img_tokens, cap_tokens, cap_lens, dense_tokens, dense_lens, txt2img)
    # by default the matcher's device, else (VSE, SCAN, TGDT's fine stage: no weights) the tokens': CUDA
    # tokens are scored on CUDA, not quietly on the CPU
    device = module_device(matcher, img_tokens.device) if device is None else checked_device(device)
    budget = budget_bytes(default_budget_mb(device) if max_memory_mb is None else max_memory_mb)
    shape = (inputs.num_images, inputs.num_texts)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif out.shape != shape or out.dtype != torch.float32 or out.device.type not in ("cpu", device.type):
        raise ValueError(f"out must be a float32 tensor of shape {shape} on the CPU or on {device}")
    scorer = engine_for(matcher, engine)
    scorer.precision = check_precision(scorer, precision, device)
    with eval_mode(matcher):
        scorer.score(inputs, out, budget=budget, device=device, progress=progress)
    return out
