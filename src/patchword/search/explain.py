"""Why an image matches a query: the patches each selection branch kept, and where each word looked.

For SEPS / LAPS (:class:`~patchword.matching.seps.SEPSMatcher`) the explanation is exact: the matcher
reports its own selection of one (image, query) pair in eval mode (:meth:`SEPSMatcher.selection_trace`):

* **kept patches**: each branch's top-K selection (``sparse``: guided by the query; ``dense``: by the
  image's dense caption when the index has them), the same masks the matcher's forward returns as
  ``MatcherOutput.decisions`` (checked at run time and in the tests);
* **word-to-patch attention**: HRPA scores word ``w`` by its best image token ``m*`` (CLS, an aggregated
  token, or the fusion token), ``a_w = max_m cos(t_m, w)``. Every image token except CLS is a weighted
  sum of raw patches, ``t_m = sum_n Omega_mn P_n`` (aggregation weights over the kept patches; fusion
  weights over the dropped ones), so the cosine splits exactly over patches::

      a_w = cos(t_m*, w) = sum_n  Omega_m*n <P_n, w> / |t_m*|   =: sum_n heat_w[n]

  ``heat_w`` is the word's HRPA term attributed to the patches it came from: its entries sum to ``a_w``,
  they are zero outside the support of ``t_m*``, and negative where a patch pulled the cosine down.
  When ``m*`` is CLS (a global token, not a patch mixture), the heat is zero and ``best_token`` says so.

For other matchers the kept-patch list is empty and ``heat_w[n]`` is the plain cosine between word ``w``
and patch token ``n`` (``method="token_cosine"``), which is what word-region attention starts from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from patchword.device import module_device, read_together
from patchword.matching.base import Matcher
from patchword.matching.ops import l2norm

__all__ = ["BranchMask", "WordAttention", "Explanation", "explain_pair", "SPECIAL_TOKENS"]

logger = logging.getLogger(__name__)

# The API has always called the caption-guided branch "sparse" (the caption is the sparse text).
_BRANCH_NAMES = {"caption": "sparse"}

#: Token texts shown as specials (not words) in an explanation.
SPECIAL_TOKENS = frozenset(
    {"<start>", "<end>", "<pad>", "<unk>", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"}
)


@dataclass
class BranchMask:
    """Patches kept by one selection branch: ``kept`` is (N,) bool over the patch grid (row-major)."""

    name: str
    kept: torch.Tensor

    @property
    def kept_count(self) -> int:
        return int(self.kept.sum())


@dataclass
class WordAttention:
    """One query token: its text, whether it is a special, its (N,) heat over the patches, the image
    token it aligned with best (``cls``, ``aggregated:k`` or ``fusion``; ``patch:n`` for token_cosine)
    and that cosine (its HRPA term before the similarity function)."""

    text: str
    special: bool
    heat: torch.Tensor
    best_token: str
    cosine: float


@dataclass
class Explanation:
    """An explained (query, image) pair.

    Attributes:
        method: ``"seps_selection"`` (exact decomposition, module docstring) or ``"token_cosine"``.
        grid: (rows, cols) of the patch grid; N = rows * cols.
        score: the matcher's similarity of the pair (its eval-mode forward, plus the stored dense score of
            a ``--dense-store scores`` index; ``Searcher.explain`` adds ``alpha * global`` where the search
            does): the score the search ranks with.
        branches: kept patches per selection branch (empty without patch selection).
        words: one entry per query token (specials included: HRPA reads them too).
        num_keep: K, patches each branch keeps (None without patch selection).
        alignment: (M, L) cosines between the M image tokens ([CLS], aggregated..., fusion) and the L
            words, the matrix HRPA scores (SEPS only).
    """

    method: str
    grid: tuple[int, int]
    score: float
    branches: list[BranchMask] = field(default_factory=list)
    words: list[WordAttention] = field(default_factory=list)
    num_keep: int | None = None
    alignment: torch.Tensor | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain lists for the API: masks as 0/1 grids, heats as float grids (rounded to 1e-5)."""
        rows, cols = self.grid

        def grid_of(values: torch.Tensor, cast) -> list[list[Any]]:
            flat = values.reshape(rows, cols).tolist()
            return [[cast(v) for v in row] for row in flat]

        return {
            "method": self.method,
            "grid": [rows, cols],
            "score": float(self.score),
            "num_keep": self.num_keep,
            "branches": [
                {"name": b.name, "kept_count": b.kept_count, "kept": grid_of(b.kept, int)}
                for b in self.branches
            ],
            "words": [
                {
                    "text": w.text,
                    "special": w.special,
                    "best_token": w.best_token,
                    "cosine": round(float(w.cosine), 6),
                    "heat": grid_of(w.heat, lambda v: round(float(v), 5)),
                }
                for w in self.words
            ],
        }


@torch.no_grad()
def explain_pair(
    matcher: Matcher,
    img_tokens: torch.Tensor,
    cap_tokens: torch.Tensor,
    cap_len: int,
    dense_tokens: torch.Tensor | None = None,
    dense_len: int | None = None,
    *,
    token_strings: list[str] | None = None,
    grid: tuple[int, int] | None = None,
    patch_prior: torch.Tensor | None = None,
    patch_ids: torch.Tensor | None = None,
    image_constant: float | None = None,
) -> Explanation:
    """Explain one (image, query) pair.

    Args:
        matcher: the fine matcher, in eval mode.
        img_tokens: (L_v, C) projected image tokens (CLS first when the matcher has one).
        cap_tokens: (L, C) query tokens; ``cap_len`` valid positions (specials included).
        dense_tokens: (L_d, C) the image's dense-caption tokens and ``dense_len``, or None.
        token_strings: the ``cap_len`` token texts (default ``[0]``, ``[1]``...).
        grid: (rows, cols) of the patch grid (default: one row).
        patch_prior, patch_ids: (M,) each, for an image an index pruned to M patches
            (:mod:`patchword.search.pruning`): the kept patches' selection priors and grid positions. The
            explanation is then that of the pruned image, laid out on the whole grid (``grid``): pruned
            patches are never kept and carry no heat.
        image_constant: the part of the pair's score the image decides alone, given in place of its dense
            tokens (a ``--dense-store scores`` index: the dense branch's score); added to the score, as the
            scoring engine adds it, so the explanation's score is the one the search ranks with.

    Returns:
        :class:`Explanation`.
    """
    cap_tokens = cap_tokens[:cap_len]
    names = token_strings or [f"[{i}]" for i in range(cap_len)]
    if len(names) != cap_len:
        raise ValueError(f"token_strings has {len(names)} entries for {cap_len} tokens")
    if dense_tokens is not None:
        dense_tokens = dense_tokens[:dense_len]
    device = module_device(matcher, img_tokens.device)  # a matcher without weights: where the rows are
    # uploads that do not wait for the device (index rows are read on the host)
    img_tokens = img_tokens.to(device, non_blocking=True).float()
    cap_tokens = cap_tokens.to(device, non_blocking=True).float()
    dense_tokens = None if dense_tokens is None else dense_tokens.to(device, non_blocking=True).float()
    pruned = (
        {}
        if patch_prior is None
        else {"patch_prior": patch_prior[None].to(device, non_blocking=True).float()}
    )
    out = matcher(
        img_tokens[None],
        cap_tokens[None],
        _length(cap_len),
        None if dense_tokens is None else dense_tokens[None],
        None if dense_tokens is None else _length(dense_len),
        **pruned,
    )
    sims = out.sims[0, 0]  # read with the explanation's other values (one copy back, below)
    dense_args = (None, None)
    if dense_tokens is not None:
        dense_args = (dense_tokens[None], _length(dense_tokens.shape[0]))
    lens = _length(cap_tokens.shape[0])
    trace = matcher.selection_trace(img_tokens[None], cap_tokens[None], lens, *dense_args, **pruned)
    if trace is not None:
        explanation = _explain_selection(trace, cap_tokens, names, sims)
    else:
        explanation = _explain_token_cosine(matcher, img_tokens, cap_tokens, names, sims)
    explanation.score += 0.0 if image_constant is None else float(image_constant)
    if patch_ids is not None:
        _onto_grid(
            explanation, patch_ids.long().cpu(), grid[0] * grid[1] if grid else int(patch_ids.max()) + 1
        )
    n = explanation.words[0].heat.numel() if explanation.words else 0
    explanation.grid = grid if grid is not None and grid[0] * grid[1] == n else (1, n)
    return explanation


def _length(n: int) -> torch.Tensor:
    """(1,) int64 length ``n`` on the host: the matcher checks host lengths there (no read of the device)
    and uploads them without a wait (``Matcher.validate_text``)."""
    return torch.tensor([n])


def _onto_grid(explanation: Explanation, patch_ids: torch.Tensor, num_patches: int) -> None:
    """Lay an explanation of M kept patches out on the whole grid of ``num_patches``: masks False and
    heat 0 where the index pruned the patch."""

    def spread(values: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(num_patches, dtype=values.dtype)
        full[patch_ids] = values.cpu()
        return full

    for branch in explanation.branches:
        branch.kept = spread(branch.kept)
    for word in explanation.words:
        word.heat = spread(word.heat)


def _word(text: str, heat: torch.Tensor, best: str, cosine: float) -> WordAttention:
    """``heat``: (N,) on the host."""
    return WordAttention(text, text in SPECIAL_TOKENS, heat.float(), best, float(cosine))


def _explain_selection(trace, cap_tokens: torch.Tensor, names: list[str], sims: torch.Tensor) -> Explanation:
    """A matcher's own selection of one pair (:meth:`Matcher.selection_trace`) and the HRPA cosine of every
    word with every image token, split over the patches each token mixes. ``sims``: the pair's 0-dim
    score, wherever the matcher computed it; the per-word loop runs on the host, on one copy of the small
    tensors it reads."""
    omega, raw = trace.mixture, trace.patches  # (N_c + 1, N) aggregated tokens then fusion; (N, C)
    token_norms = torch.linalg.vector_norm(omega @ raw, dim=-1).clamp_min(1e-12)  # (N_c + 1,)
    words = l2norm(cap_tokens)  # (L, C)
    dots = raw @ words.T  # (N, L): <P_n, w>
    mixture_cos = (omega @ dots) / token_norms[:, None]  # (N_c + 1, L)
    token_names = [f"aggregated:{k}" for k in range(omega.shape[0] - 1)] + ["fusion"]
    alignment, has_cls = mixture_cos, trace.cls is not None
    if has_cls:
        cls_cos = (words @ trace.cls) / torch.linalg.vector_norm(trace.cls).clamp_min(1e-12)  # (L,)
        alignment = torch.cat([cls_cos[None], mixture_cos])
        token_names = ["cls", *token_names]
    best = alignment.argmax(dim=0)  # (L,)
    keeps = [keep for _, keep in trace.branches]
    sims, alignment, best, omega, dots, token_norms, *keeps = read_together(
        sims, alignment, best, omega, dots, token_norms, *keeps
    )
    result = []
    for w, name in enumerate(names):
        m = int(best[w])
        if has_cls and m == 0:
            heat = torch.zeros(raw.shape[0], dtype=dots.dtype)
        else:
            k = m - int(has_cls)
            heat = omega[k] * dots[:, w] / token_norms[k]
        result.append(_word(name, heat, token_names[m], alignment[m, w]))
    branches = [
        BranchMask(_BRANCH_NAMES.get(name, name), keep)
        for (name, _), keep in zip(trace.branches, keeps, strict=True)
    ]
    return Explanation(
        method="seps_selection",
        grid=(1, raw.shape[0]),
        score=float(sims),
        branches=branches,
        words=result,
        num_keep=int(keeps[0].sum()) if keeps else None,
        alignment=alignment.float(),
    )


def _explain_token_cosine(
    matcher: Matcher,
    img_tokens: torch.Tensor,
    cap_tokens: torch.Tensor,
    names: list[str],
    sims: torch.Tensor,
) -> Explanation:
    """Matchers without patch selection: cosine of each word with each patch token (``sims``: the pair's
    0-dim score; both read with one copy back, the per-word loop runs on the host)."""
    patches = img_tokens[int(matcher.has_cls) :]
    sims, cosines = read_together(sims, l2norm(patches) @ l2norm(cap_tokens).T)  # cosines: (N, L)
    words = [
        _word(name, cosines[:, w], f"patch:{int(cosines[:, w].argmax())}", cosines[:, w].max())
        for w, name in enumerate(names)
    ]
    return Explanation(method="token_cosine", grid=(1, patches.shape[0]), score=float(sims), words=words)
