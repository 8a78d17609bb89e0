"""Text-to-image search over an index: a global shortlist, then fine re-ranking of the shortlist only.

1. the query is tokenised and encoded once; ``matcher.global_text`` gives its global embedding;
2. :class:`~patchword.eval.two_stage.GlobalIndex` returns the ``shortlist`` images with the highest
   global similarity (exact torch matmul + top-k; FAISS ``IndexFlatIP`` when faiss is installed, the same
   result up to ties);
3. the fine matcher scores the (shortlist, 1) matrix of the shortlisted images against the query with
   the run's scoring engine (``engine_for(matcher).score``, the exact engine of
   :func:`~patchword.eval.score_matrix`), reading each image's tokens (and dense tokens) from the index's
   memory maps;
4. the final score is ``fine + alpha * global`` (``alpha = 0`` unless the matcher's own two-stage plan,
   TGDT's hybrid, says otherwise); ties rank by index id, whatever the first stage.

This is :func:`~patchword.eval.two_stage.two_stage_scores` for one caption query, so a query's ranking is
the one the library computes for the same tokens (tested). A :class:`Searcher` is safe to call from several
threads at once: it keeps no per-query state, and each call builds its own scoring engine.

What a search is asked and answers (the query's text checks, the hits) is :mod:`patchword.search.results`,
the query's encoding :mod:`patchword.search.query_encode`, a local index's first stage
:mod:`patchword.search.first_stage`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from patchword._validation import check_positive_int
from patchword.encoders.base import EncoderBase
from patchword.errors import ConfigError, MissingFileError
from patchword.eval.engine.core import engine_for, prepare_inputs
from patchword.eval.engine.memory import budget_bytes
from patchword.eval.two_stage import check_alpha, faiss_available
from patchword.matching.base import Matcher
from patchword.runs import LoadedRun, load_run
from patchword.search.explain import explain_pair
from patchword.search.fidelity import dense_problem, describe_index, reads_index_dense, search_kind
from patchword.search.first_stage import local_first_stage
from patchword.search.identity import check_index_model, model_identity
from patchword.search.query_encode import encode_query, token_namer
from patchword.search.results import Query, SearchHit, SearchResult
from patchword.search.scan import printable
from patchword.search.store import REPAIR_HINT, DamagedIndexError, SearchIndex

if TYPE_CHECKING:
    from patchword.search.explain import Explanation

__all__ = ["APPROXIMATE_ABOVE", "fine_matcher", "DEFAULT_SHORTLIST", "Searcher"]

logger = logging.getLogger(__name__)

#: Images re-ranked by the fine matcher per query when the matcher has no plan of its own (TGDT's
#: official value for caption queries).
DEFAULT_SHORTLIST = 100
#: Above this many images the first stage is approximate by default (FAISS IVF lists, kept with the
#: index): exact search costs O(N) per query, IVF scans 1/8 of its lists at a small loss of the exact
#: top-100 (measured: docs/benchmarks.md, "Numbers behind code choices"; benchmarks/ann_recall.py).
APPROXIMATE_ABOVE = 200_000


def fine_matcher(matcher: Matcher) -> Matcher:
    """The matcher a search re-ranks with: the fine stage of the matcher's two-stage plan, or itself."""
    plan = matcher.two_stage_plan()
    return plan.fine if plan is not None else matcher


class Searcher:
    """Search one index with the model that built it.

    Args:
        index: an opened :class:`SearchIndex`.
        run: the loaded run; its weights must be those the index was built with.
        shortlist: images re-ranked per query, a positive integer (default: the matcher's two-stage
            plan, else :data:`DEFAULT_SHORTLIST`); clipped to the index size.
        alpha: weight of the global score in the final score, a finite number (default: the plan's,
            else 0).
        backend: first-stage backend: ``"auto"`` (exact below :data:`APPROXIMATE_ABOVE` images: FAISS flat
            when installed, else torch; above it FAISS IVF, approximate), ``"exact"``, ``"faiss_flat"``,
            ``"faiss_ivf"`` or ``"faiss_hnsw"``.
        max_memory_mb: working-memory budget of the re-ranking engine.

    ``kind`` says how the search departs from the exact float32 one (store, pruning, first stage:
    :func:`~patchword.search.fidelity.search_kind`); ``warnings``: what makes every ranking differ from the
    model's evaluated one (logged when the searcher is made); ``index_info``: both, with a one-line
    ``summary``, the ``index`` object of ``/healthz``, ``/api/search`` and ``search --json``
    (:func:`~patchword.search.fidelity.describe_index`).

    Raises:
        ValueError: ``shortlist`` not a positive integer, ``alpha`` not a finite number.
        IndexMismatchError: the run's weights or vocabulary are not the index's.
    """

    def __init__(
        self,
        index: SearchIndex,
        run: LoadedRun,
        *,
        shortlist: int | None = None,
        alpha: float | None = None,
        backend: str = "auto",
        max_memory_mb: float = 256,
    ) -> None:
        check_index_model(index.manifest.model, model_identity(run), index.index_dir)
        self.index, self.run = index, run
        self._options = {"shortlist": shortlist, "alpha": alpha, "backend": backend}
        self._options["max_memory_mb"] = max_memory_mb
        matcher = run.model.matcher
        plan = matcher.two_stage_plan()
        self.matcher = matcher
        self.fine = fine_matcher(matcher)
        self.alpha = check_alpha(alpha if alpha is not None else (plan.alpha if plan is not None else 0.0))
        wanted = (
            shortlist if shortlist is not None else (plan.k_t2i if plan is not None else DEFAULT_SHORTLIST)
        )
        self.shortlist = min(check_positive_int("shortlist", wanted), len(index))
        if hasattr(index, "shortlist"):  # a store that ranks the first stage itself (Qdrant)
            backend = "store"
        elif backend == "auto":
            large = len(index) > APPROXIMATE_ABOVE and faiss_available()
            backend = "faiss_ivf" if large else ("faiss_flat" if faiss_available() else "exact")
        self.backend = backend
        self.global_index = index if backend == "store" else local_first_stage(index, backend, max_memory_mb)
        self.budget = budget_bytes(max_memory_mb)
        self._token_name = token_namer(run.tokenizer)
        self.use_dense = index.has_dense and reads_index_dense(self.fine)
        self.kind = search_kind(index, backend)
        problem = dense_problem(index, run, self.fine)
        problems = [] if problem is None else [problem]
        self.warnings = [sentence for _, sentence in problems]
        # once per opened index: /api/search sends it with every answer (never changed after this)
        self.index_info = describe_index(self.kind, problems)
        for warning in self.warnings:  # every open: a server's log says it too
            logger.warning("%s", warning)

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike[str],
        *,
        run_dir: str | os.PathLike[str] | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        device: str | torch.device = "cpu",
        qdrant: bool = False,
        exact: bool = False,
        **options: Any,
    ) -> Searcher:
        """Open ``index_dir`` with the run recorded in its manifest (or ``run_dir``, e.g. after moving it);
        ``qdrant``: its vectors from the Qdrant collection it was uploaded to (``qdrant.json``); ``exact``
        (with ``qdrant``): Qdrant searches exactly, never through a server's HNSW index
        (:meth:`~patchword.search.qdrant.QdrantIndex.open`; an embedded store always does).

        Raises:
            ValueError: ``shortlist`` or ``alpha`` as :class:`Searcher` refuses them (before anything is
                opened).
            MissingFileError: no index, or the run that built it is not where the manifest says.
            IndexMismatchError: ``run_dir`` holds another model.
            ConfigError: ``exact`` without ``qdrant``.
        """
        if options.get("shortlist") is not None:  # before the run is loaded
            check_positive_int("shortlist", options["shortlist"])
        if options.get("alpha") is not None:
            check_alpha(options["alpha"])
        if exact and not qdrant:
            raise ConfigError(
                "--exact",
                "makes Qdrant search exactly: give --qdrant too (a local index's first stage is exact up to "
                f"{APPROXIMATE_ABOVE} images; above, --first-stage faiss_flat or exact keeps it exact: "
                "backend= of Searcher)",
            )
        if qdrant:
            # the qdrant extra, only when asked; qdrant builds on this module (through the package)
            from patchword.search.qdrant import QdrantIndex

            index = QdrantIndex.open(index_dir, exact=exact)
        else:
            index = SearchIndex.open(index_dir)
        recorded = index.manifest.model
        if run_dir is None:
            run_dir = Path(recorded["run_dir"])
            if not run_dir.is_dir():
                raise MissingFileError(
                    f"the run that built {index_dir} is not at {run_dir} any more; pass --run RUN_DIR"
                )
            if checkpoint is None and Path(recorded["checkpoint"]).is_file():
                checkpoint = recorded["checkpoint"]
        run = load_run(run_dir, checkpoint, device=device)
        return cls(index, run, **options)

    def reopen(self) -> Searcher:
        """A searcher of this index as it is on disk now (after an update), with this one's run and options
        (a Qdrant index shares this one's client).

        Raises:
            what :meth:`open` raises for the index (not the run: the loaded one is kept).
        """
        if self.backend == "store":
            # a Qdrant index was opened, so the extra is there; qdrant builds on this module (the package)
            from patchword.search.qdrant import QdrantIndex

            index = QdrantIndex.open(self.index.index_dir, reuse=self.index, exact=self.index.exact)
        else:
            index = SearchIndex.open(self.index.index_dir)
        return Searcher(index, self.run, **self._options)

    def __len__(self) -> int:
        return len(self.index)

    # ------------------------------------------------------------------ queries
    @torch.no_grad()
    def encode_query(self, text: str) -> Query:
        """Tokenise and encode ``text`` with the run's model (truncated to its ``data.max_caption_len``
        tokens; a query of no word it knows refused): :func:`~patchword.search.query_encode.encode_query`.

        Raises:
            QueryError: empty, control characters, no word at all, or no word the model knows among those it
                reads (naming the words).
        """
        return encode_query(self.run, text)

    @torch.no_grad()
    def rerank(self, query: Query, ids: torch.Tensor) -> torch.Tensor:
        """Fine scores of the images ``ids`` (k,) for ``query``: (k,) float32 (no global term)."""
        self.index.prefetch(ids)  # shards on disk: the shortlisted rows are read together
        img = self.index.image_tokens(ids)
        dense = self.index.dense_tokens(ids) if self.use_dense else None
        scores = self.index.dense_scores(ids) if self.use_dense else None  # --dense-store scores
        inputs = prepare_inputs(
            self.fine,
            img,
            query.tokens,
            query.lens,
            None if dense is None else dense[0],
            None if dense is None else dense[1],
            None,
            image_constants=scores,
            patch_prior=self.index.patch_priors(ids),  # --keep-patches
        )
        # One caption against k images is a (k, 1) matrix: the engine's matrix path batches the images,
        # where its pair path (built for images with many captions) takes them one at a time; same
        # scores, ~4x lower query latency at k=100 (docs/benchmarks.md, "Search at scale").
        out = torch.empty(img.shape[0], 1, dtype=torch.float32)
        engine = engine_for(self.fine)
        # A query is too small a job for worker threads: starting them costs more than they save
        # (docs/benchmarks.md, "Numbers behind code choices")
        engine.workers = 1
        engine.score(inputs, out, budget=self.budget, device=self.run.device, progress=False)
        return out[:, 0]

    @torch.no_grad()
    def search(self, text: str, k: int = 10) -> SearchResult:
        """The ``k`` best images for ``text`` (a ``k`` above the shortlist length widens the shortlist).

        Raises:
            QueryError: the query cannot be read.
            ValueError: ``k`` is not a positive integer (``int``, ``np.int64``...; not a float or a bool).
        """
        k = check_positive_int("k", k)
        t0 = time.perf_counter()
        query = self.encode_query(text)
        t1 = time.perf_counter()
        wanted = max(self.shortlist, min(k, len(self)))
        if self.backend == "store":  # Qdrant ranks the first stage and returns the hits' tokens
            global_scores, ids = self.index.shortlist(query.global_embedding, wanted)
        else:
            global_scores, ids = self.global_index.search(query.global_embedding, wanted)
        # an approximate first stage may find fewer than asked (IVF: the lists scanned hold fewer): its
        # empty slots (id -1) are no image, and the shortlist is shorter
        found = ids[0] >= 0
        global_scores, ids = global_scores[0][found], ids[0][found]
        t2 = time.perf_counter()
        if not ids.numel():
            scores = global_scores.clone()  # nothing found: no hit
        else:
            try:
                scores = self.rerank(query, ids)
            except ValueError as err:  # an engine that checks its inputs' values: stored rows of nan?
                damaged = self._non_finite(query, ids, known=False)
                if damaged is None:
                    raise
                raise damaged from err
        if self.alpha:
            scores = scores + self.alpha * global_scores
        finite = torch.isfinite(scores) & torch.isfinite(global_scores)
        if not bool(finite.all()):  # a nan would rank first (and is not JSON): no result is better
            raise self._non_finite(query, ids[~finite])
        # ties (duplicate images) by id: not in the shortlist's order, nor by global scores, whose rounding
        # differs between backends (FAISS gives two copies of an image global scores 1e-8 apart)
        by_id = torch.argsort(ids, stable=True)
        order = by_id[torch.sort(scores[by_id], descending=True, stable=True).indices]
        t3 = time.perf_counter()
        hits = [
            SearchHit(
                rank=rank + 1,
                id=int(ids[i]),
                path=self.index.path(int(ids[i])),
                score=float(scores[i]),
                global_score=float(global_scores[i]),
            )
            for rank, i in enumerate(order[:k].tolist())
        ]
        timings = {"encode": t1 - t0, "shortlist": t2 - t1, "rerank": t3 - t2, "total": t3 - t0}
        return SearchResult(
            text,
            hits,
            int(ids.numel()),
            timings,
            query.unknown_words,
            query.dropped_words,
            query.max_tokens,
            query.cut_word,
        )

    def explain(self, text: str, image_id: int) -> Explanation:
        """Why image ``image_id`` (any integer: ``int``, ``np.int64``...) matches ``text``: see
        :func:`patchword.search.explain.explain_pair`.

        Raises:
            ImageIdError: ``image_id`` is not an integer, or not an id of the index
                (:meth:`~patchword.search.entries.IndexEntries.check_id`).
        """
        image_id = self.index.check_id(image_id)
        query = self.encode_query(text)
        ids = torch.tensor([image_id])
        damaged = self._non_finite(query, ids, known=False)
        if damaged is not None:  # found before the matcher refuses the tokens with a ValueError
            raise damaged
        dense = self.index.dense_tokens(ids) if self.use_dense else None
        dense_score = self.index.dense_scores(ids) if self.use_dense else None  # --dense-store scores
        explanation = explain_pair(
            self.fine,
            self.index.image_tokens(ids)[0],
            query.tokens[0],
            int(query.lens[0]),
            None if dense is None else dense[0][0],
            None if dense is None else int(dense[1][0]),
            token_strings=[self._token_name(i) for i in query.ids[0, : int(query.lens[0])].tolist()],
            grid=patch_grid(self.run.model.image_encoder, int(self.index.manifest.model["num_patches"])),
            image_constant=None if dense_score is None else float(dense_score[0]),
            **self._pruned(ids),
        )
        if self.alpha:  # the score the search ranks with: fine + alpha * global (a TGDT hybrid plan)
            image_global = self.index.global_rows(ids)[0]  # that row only (a Qdrant index included)
            global_score = float(query.global_embedding[0].float().cpu() @ image_global)
            explanation.score += self.alpha * global_score
        if not math.isfinite(explanation.score):  # a store without shard files (Qdrant)
            raise self._non_finite(query, ids)
        return explanation

    def _non_finite(self, query: Query, ids: torch.Tensor, *, known: bool = True) -> DamagedIndexError | None:
        """The error of scoring the images ``ids`` for ``query`` when their scores are (``known``), or may be,
        non-finite: naming the model when the query's encoding is not finite, else the shard file holding
        non-finite values in those images' rows, else (``known`` only; otherwise None) the index."""
        query_finite = bool(
            torch.isfinite(query.tokens).all() and torch.isfinite(query.global_embedding).all()
        )
        damaged = {}
        if query_finite and isinstance(self.index, SearchIndex):
            damaged = self.index.non_finite_files(ids)
        if query_finite and not damaged and not known:
            return None
        bad = list(damaged) or [int(i) for i in ids.reshape(-1)]
        more = f" and {len(bad) - 1} more images" if len(bad) > 1 else ""
        what = f"image {printable(self.index.path(bad[0]))}{more} cannot be scored"
        if not query_finite:
            return DamagedIndexError(
                f"{self.run.checkpoint}: the model encodes the query to non-finite values ({what}); its "
                "weights are damaged: train or restore the run"
            )
        if damaged:
            return DamagedIndexError(
                f"{damaged[bad[0]]}: holds non-finite values ({what}): delete it and {REPAIR_HINT}"
            )
        return DamagedIndexError(f"{self.index.index_dir}: the index is damaged ({what}); build a new one")

    def _pruned(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """``explain_pair``'s arguments for one image of an index pruned at build time, else none."""
        prior = self.index.patch_priors(ids)
        if prior is None:
            return {}
        return {"patch_prior": prior[0], "patch_ids": self.index.patch_ids(ids)[0]}


def patch_grid(image_encoder: EncoderBase, num_patches: int) -> tuple[int, int]:
    """(rows, cols) of the patch grid: ``image_size // patch_size`` when the encoder says, else the square
    root of the patch count, else one row."""
    size, patch = image_encoder.image_size, image_encoder.patch_size
    if size and patch and (size // patch) ** 2 == num_patches:
        return size // patch, size // patch
    side = int(round(num_patches**0.5))
    if side * side == num_patches:
        return side, side
    return 1, num_patches
