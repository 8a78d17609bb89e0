"""Two-stage search benchmark: global shortlist + exact re-ranking against exhaustive scoring.

On the test split of a trained run (a directory written by ``patchword train`` or ``make demo``,
loaded with :func:`patchword.runs.load_run`) it measures the recall and the time of
:func:`~patchword.eval.two_stage_scores` for several shortlist sizes k (and one hybrid
``alpha * global + fine`` row) against :func:`~patchword.eval.score_matrix` over every pair.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

from patchword._validation import check_finite_number
from patchword.bench.machine import best_time, machine_description
from patchword.errors import ConfigError

__all__ = ["check_run", "run_two_stage"]

_logger = logging.getLogger(__name__)

_REPORTED = ("rsum", "i2t_r1", "t2i_r1")


def check_run(
    run_dir: str | Path, checkpoint: str | None = None, names: tuple[str, str] = ("run_dir", "checkpoint")
) -> None:
    """The run and its checkpoint exist (what :func:`~patchword.runs.load_run` reads first), checked before
    any work: ``bench all`` scores for minutes before its two-stage part loads the run.

    Args:
        names: what the errors call ``run_dir`` and ``checkpoint`` (the command line: its flags).

    Raises:
        MissingFileError: no such run directory, no ``config.yaml`` or no such checkpoint; the message
            starts with the name of the argument.
    """
    from patchword.errors import MissingFileError
    from patchword.runs import read_run_config, resolve_checkpoint

    try:
        read_run_config(run_dir)
    except MissingFileError as err:
        raise MissingFileError(f"{names[0]}: {err}") from None
    try:
        resolve_checkpoint(run_dir, checkpoint)
    except MissingFileError as err:
        raise MissingFileError(f"{names[1]}: {err}") from None


def _check_plan(ks: tuple[int, ...], alpha: float, alpha_k: int, max_memory_mb: float) -> None:
    """The rows asked for and the budget, before the run and its data load (the library checks k only when
    it scores, and the budget once the run is loaded)."""
    for key, k in [*(("ks", k) for k in ks), ("alpha_k", alpha_k)]:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(key, f"a shortlist size is an integer >= 1, got {k!r}")
    if not math.isfinite(alpha):
        raise ConfigError("alpha", f"must be a finite number, got {alpha!r}")
    check_finite_number("max_memory_mb", max_memory_mb, inclusive=False)


def run_two_stage(
    run_dir: str | Path,
    *,
    checkpoint: str | None = None,
    ks: tuple[int, ...] = (16, 64, 128, 256),
    alpha: float = 1.0,
    alpha_k: int = 128,
    repeats: int = 2,
    max_memory_mb: float = 1024,
    backend: str = "exact",
) -> dict[str, Any]:
    """Exhaustive vs two-stage recall and time on the run's test split.

    Args:
        run_dir: the trained run.
        checkpoint: the weights file in ``run_dir`` (default ``best.pt``); a missing one is an error.
        ks: shortlist sizes, each run with ``alpha = 0`` (fine scores only; for a matcher with a two-stage
            plan, such as TGDT's hybrid, its plan's fine matcher: the local scores).
        alpha: weight of the global score in one more row at ``k = alpha_k`` (0 skips it).
        repeats: timing repeats (best kept).
        max_memory_mb: the scoring engine's working-memory budget.
        backend: the shortlist index, ``exact``, ``faiss_flat``, ``faiss_ivf`` or ``faiss_hnsw``.

    Returns:
        A JSON-able dict: ``machine``, ``model`` (the run and its model config), ``backend``, ``rows``
        (one per method: k asked for, ``k_used`` ``{"i2t", "t2i"}``: the shortlist length of each direction,
        k clipped to its candidates, None for the exhaustive row; alpha, pairs scored, seconds, speed-up,
        rSum and R@1 in each direction).

    Raises:
        MissingFileError: no such run directory, config or checkpoint.
        ConfigError: a shortlist size below 1, an ``alpha`` that is not a finite number or a
            ``max_memory_mb`` that is not a finite number > 0 (before any work).
    """
    from patchword.config import config_to_dict
    from patchword.data.prepare import prepare_data
    from patchword.eval import retrieval_metrics, score_matrix, two_stage_scores
    from patchword.eval.scoring import encode_image_tokens, encode_text_tokens
    from patchword.runs import load_run
    from patchword.search.query import fine_matcher

    _check_plan(ks, alpha, alpha_k, max_memory_mb)
    run = load_run(run_dir, checkpoint)
    split = prepare_data(run.config.data, run.tokenizer, roles=("test",)).splits["test"]
    model = run.model
    with torch.no_grad():
        img = encode_image_tokens(model, split.images, progress=False)
        cap = encode_text_tokens(model, split.cap_ids, split.cap_lens, progress=False)
        dense = dense_lens = None
        if split.dense_ids is not None:
            dense = encode_text_tokens(model, split.dense_ids, split.dense_lens, progress=False)
            dense_lens = split.dense_lens
    args = (model.matcher, img, cap, split.cap_lens, dense, dense_lens)
    kw = {"txt2img": split.txt2img, "max_memory_mb": max_memory_mb}
    exhaustive = score_matrix(*args, **kw)
    exhaustive_s = best_time(lambda: score_matrix(*args, **kw), repeats)
    # A matcher with a two-stage plan (TGDT hybrid) scores alpha * global + fine itself: the shortlists
    # are re-scored by its plan's fine matcher, so that alpha weighs the global score once.
    args = (fine_matcher(model.matcher), *args[1:])
    base = retrieval_metrics(exhaustive, split.txt2img)
    rows = [
        {
            "method": "exhaustive",
            "k": None,
            "alpha": 0.0,
            "k_used": None,
            "pairs": exhaustive.numel(),
            "seconds": exhaustive_s,
            **{key: base[key] for key in _REPORTED},
        }
    ]
    for k, a in [(k, 0.0) for k in ks] + ([(alpha_k, alpha)] if alpha else []):
        res = two_stage_scores(*args, k=k, alpha=a, backend=backend, **kw)
        seconds = best_time(
            lambda k=k, a=a: two_stage_scores(*args, k=k, alpha=a, backend=backend, **kw), repeats
        )
        metrics = retrieval_metrics(res.sims, split.txt2img)
        rows.append(
            {
                "method": "two-stage",
                "k": k,
                # the shortlist length each direction ranked: k clipped to its candidates (the test
                # captions for i2t, the test images for t2i), what the table shows
                "k_used": {"i2t": res.i2t_candidates.shape[1], "t2i": res.t2i_candidates.shape[1]},
                "alpha": a,
                "pairs": res.pairs_scored,
                "seconds": seconds,
                "speedup": exhaustive_s / seconds,
                "rsum_delta": metrics["rsum"] - base["rsum"],
                **{key: metrics[key] for key in _REPORTED},
            }
        )
        _logger.info("k=%d alpha=%g: %s", k, a, rows[-1])
    return {
        "machine": machine_description(),
        "model": {
            "run_dir": str(run.run_dir),
            "checkpoint": str(run.checkpoint),
            "config": config_to_dict(run.config.model),
            "image_tokens": list(img.shape[1:]),
            "test_images": img.shape[0],
            "test_captions": cap.shape[0],
        },
        "backend": backend,
        "rows": rows,
    }
