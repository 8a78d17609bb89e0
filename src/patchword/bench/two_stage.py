"""Two-stage search benchmark: global shortlist + exact re-ranking against exhaustive scoring.

On the test split of a trained run (a directory written by ``patchword train`` or ``make demo``,
loaded with :func:`patchword.runs.load_run`) it measures the recall and the time of
:func:`~patchword.eval.two_stage_scores` for several shortlist sizes k (and one hybrid
``alpha * global + fine`` row) against :func:`~patchword.eval.score_matrix` over every pair.

Each two-stage row is compared with an exhaustive pass of the score it ranks: the rows of ``alpha = 0``
with the fine matcher's, the ``alpha`` row with the model's own where that is ``alpha * global + fine``
(TGDT's hybrid, ``alpha = hybrid_alpha``), else with the fine matcher's too. A matcher with a two-stage
plan (TGDT hybrid) has two exhaustive rows: its own score (labelled with the plan's ``alpha``) and its fine
matcher's (``alpha = 0``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from patchword._validation import check_finite_number
from patchword.bench.machine import best_time, machine_description
from patchword.errors import ConfigError, DataError, MissingExtraError, MissingFileError

if TYPE_CHECKING:
    from patchword.runs import LoadedRun

__all__ = ["BACKENDS", "check_backend", "check_run", "load_checked_run", "run_two_stage"]

_logger = logging.getLogger(__name__)

_REPORTED = ("rsum", "i2t_r1", "t2i_r1")
#: The first stage's shortlist indexes (:class:`~patchword.eval.GlobalIndex`); faiss_* need the ann extra.
BACKENDS = ("exact", "faiss_flat", "faiss_ivf", "faiss_hnsw")


def check_backend(backend: str, name: str = "backend") -> None:
    """``backend`` is one of :data:`BACKENDS` and what it needs is installed, before any work: a missing
    FAISS was found only when the first shortlist was built (a traceback, after ``bench all``'s scoring).

    Raises:
        ConfigError: an unknown backend; MissingExtraError: a FAISS backend without FAISS (naming the
            extra). Both start with ``name``.
    """
    if backend not in BACKENDS:
        raise ConfigError(name, f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend != "exact":
        from patchword.eval.two_stage import faiss_available

        if not faiss_available():
            raise MissingExtraError(
                f"{name} {backend} needs the faiss package: pip install 'patchword[ann]' (or {name} exact)"
            )


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
    from patchword.runs import read_run_config, resolve_checkpoint

    try:
        read_run_config(run_dir)
    except MissingFileError as err:
        raise MissingFileError(f"{names[0]}: {err}") from None
    try:
        resolve_checkpoint(run_dir, checkpoint)
    except MissingFileError as err:
        raise MissingFileError(f"{names[1]}: {err}") from None


def load_checked_run(
    run_dir: str | Path, checkpoint: str | None = None, names: tuple[str, str] = ("run_dir", "checkpoint")
) -> LoadedRun:
    """:func:`check_run`, then the run loaded (:func:`~patchword.runs.load_run`), before any work: a
    checkpoint that is not one (a text file) or does not fit the run's model (another run's) was found
    only once ``bench all``'s scoring part had run. Pass the result to :func:`run_two_stage` (``run=``).

    Raises:
        MissingFileError: as :func:`check_run`.
        DataError, ConfigError: the checkpoint cannot be read or does not fit the model (starting with
            ``names[1]``), or the run's own files cannot be used (naming the file).
    """
    from patchword.runs import load_run, read_run_config, resolve_checkpoint

    check_run(run_dir, checkpoint, names)
    path = resolve_checkpoint(run_dir, checkpoint)
    try:
        return load_run(run_dir, path, config=read_run_config(run_dir))
    except (DataError, ConfigError) as err:
        if str(path) not in str(err):  # the run's own files (config, vocabulary): their messages name them
            raise
        # the weights file: unreadable, or shapes or names the run's model does not have
        if isinstance(err, ConfigError):
            raise ConfigError(names[1], err.detail) from None
        raise DataError(f"{names[1]}: {err}") from None


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
    run_dir: str | Path | None = None,
    *,
    checkpoint: str | None = None,
    ks: tuple[int, ...] = (16, 64, 128, 256),
    alpha: float = 1.0,
    alpha_k: int = 128,
    repeats: int = 2,
    max_memory_mb: float = 1024,
    backend: str = "exact",
    run: LoadedRun | None = None,
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
        backend: the shortlist index, one of :data:`BACKENDS`.
        run: the run already loaded (:func:`load_checked_run`, as the command line does before any work);
            then ``run_dir`` and ``checkpoint`` are not read.

    Returns:
        A JSON-able dict: ``machine``, ``model`` (the run and its model config), ``backend``, ``repeats``,
        ``rows`` (one per method: k asked for, ``k_used`` ``{"i2t", "t2i"}``: the shortlist length of each
        direction, k clipped to its candidates, None for an exhaustive row; the alpha of the score ranked,
        pairs scored, seconds, rSum and R@1 in each direction; a two-stage row's speed-up and
        ``rsum_delta`` are against the exhaustive row of ``baseline_alpha``: see the module docstring).

    Raises:
        MissingFileError: no such run directory, config or checkpoint.
        ConfigError: a shortlist size below 1, an ``alpha`` that is not a finite number, a
            ``max_memory_mb`` that is not a finite number > 0 or an unknown backend (before any work).
        MissingExtraError: a FAISS backend without FAISS (before any work).
    """
    from patchword.config import config_to_dict
    from patchword.data.prepare import prepare_data
    from patchword.eval import retrieval_metrics, score_matrix, two_stage_scores
    from patchword.eval.scoring import encode_image_tokens, encode_text_tokens
    from patchword.runs import load_run
    from patchword.search.query import fine_matcher

    _check_plan(ks, alpha, alpha_k, max_memory_mb)
    check_backend(backend)
    if run is None:
        if run_dir is None:
            raise ConfigError("run_dir", "the two-stage benchmark needs a trained run")
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
    inputs = (img, cap, split.cap_lens, dense, dense_lens)
    kw = {"txt2img": split.txt2img, "max_memory_mb": max_memory_mb}
    # A matcher with a two-stage plan (TGDT hybrid) scores plan.alpha * global + fine itself: the
    # shortlists are re-scored by its plan's fine matcher, so that alpha weighs the global score once.
    plan = model.matcher.two_stage_plan()
    fine = fine_matcher(model.matcher)
    exhaustive = {}  # the alpha of the score ranked -> its exhaustive row
    passes = [(model.matcher, plan.alpha if plan is not None else 0.0)]
    if plan is not None and plan.alpha != 0:  # the alpha-0 rows rank the fine score: compared with its own
        passes.append((fine, 0.0))
    rows = []
    for matcher, own_alpha in passes:
        sims = score_matrix(matcher, *inputs, **kw)
        seconds = best_time(lambda m=matcher: score_matrix(m, *inputs, **kw), repeats)
        base = retrieval_metrics(sims, split.txt2img)
        row = {"method": "exhaustive", "k": None, "alpha": own_alpha, "k_used": None, "pairs": sims.numel()}
        rows.append({**row, "seconds": seconds, **{key: base[key] for key in _REPORTED}})
        exhaustive[own_alpha] = rows[-1]
    for k, a in [(k, 0.0) for k in ks] + ([(alpha_k, alpha)] if alpha else []):
        res = two_stage_scores(fine, *inputs, k=k, alpha=a, backend=backend, **kw)
        seconds = best_time(
            lambda k=k, a=a: two_stage_scores(fine, *inputs, k=k, alpha=a, backend=backend, **kw), repeats
        )
        metrics = retrieval_metrics(res.sims, split.txt2img)
        # the exhaustive ranking of the same score; an alpha row of a matcher whose own score is not
        # alpha * global + fine: the fine matcher's (what adding the global score changes)
        baseline = exhaustive.get(a, exhaustive[0.0])
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
                "speedup": baseline["seconds"] / seconds,
                "rsum_delta": metrics["rsum"] - baseline["rsum"],
                "baseline_alpha": baseline["alpha"],
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
        "repeats": repeats,
        "rows": rows,
    }
