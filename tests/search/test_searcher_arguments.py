"""The Searcher's numbers: ``alpha`` a finite number, every count an integer of any kind.

Old code: ``Searcher(alpha=nan)`` was accepted and every search then failed with "the index is damaged ...
build a new one", blaming a healthy index; ``search(k=np.int64(2))`` was refused as "k must be a positive
int" while ``explain`` takes numpy ids; ``shortlist=2.5`` silently became 2 and ``shortlist=True`` 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from patchword.search.query import Searcher
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")

BAD_ALPHAS = [float("nan"), float("inf"), "1", True]
BAD_COUNTS = [2.5, 2.0, True, 0, -3, "2", None]


@pytest.mark.parametrize("alpha", BAD_ALPHAS)
def test_an_alpha_that_is_not_a_finite_number_is_refused_before_anything_is_opened(tmp_path, alpha):
    with pytest.raises(ValueError, match="^alpha must be a finite number"):
        Searcher.open(tmp_path / "no_index", alpha=alpha)


@pytest.mark.parametrize("shortlist", [2.5, True, 0, "2"])
def test_a_shortlist_that_is_not_a_positive_integer_is_refused_before_anything_is_opened(tmp_path, shortlist):
    with pytest.raises(ValueError, match=f"^shortlist must be a positive int, got {shortlist!r}"):
        Searcher.open(tmp_path / "no_index", shortlist=shortlist)


@pytest.mark.parametrize("alpha", BAD_ALPHAS)
def test_a_searcher_refuses_an_alpha_that_is_not_a_finite_number(env, alpha):
    with pytest.raises(ValueError, match="^alpha must be a finite number"):
        Searcher(SearchIndex.open(env.index_dir), env.run, alpha=alpha)


@pytest.mark.parametrize("shortlist", [2.5, 2.0, True, 0])
def test_a_searcher_refuses_a_shortlist_that_is_not_a_positive_integer(env, shortlist):
    with pytest.raises(ValueError, match=f"^shortlist must be a positive int, got {shortlist!r}$"):
        Searcher(SearchIndex.open(env.index_dir), env.run, shortlist=shortlist)


@pytest.mark.parametrize("k", [k for k in BAD_COUNTS if k is not None])
def test_search_refuses_a_k_that_is_not_a_positive_integer(searcher, k):
    with pytest.raises(ValueError, match=f"^k must be a positive int, got {k!r}$"):
        searcher.search("a red circle", k)


def test_numpy_integers_are_counts_like_ints(env, searcher):
    want = searcher.search("a red circle", 2)
    got = searcher.search("a red circle", np.int64(2))
    assert [(h.id, h.score) for h in got.hits] == [(h.id, h.score) for h in want.hits] and len(want.hits) == 2
    index = SearchIndex.open(env.index_dir)
    assert Searcher(index, env.run, shortlist=np.int32(3)).shortlist == 3
    mixed = Searcher(index, env.run, shortlist=3, alpha=np.float32(0.5))
    assert mixed.alpha == 0.5 and isinstance(mixed.alpha, float)
    hybrid = mixed.search("a red circle", 3)
    fine = Searcher(index, env.run, shortlist=3).search("a red circle", 3)
    by_id = {h.id: h for h in fine.hits}
    for hit in hybrid.hits:  # the same shortlist: alpha only adds half the global score
        assert hit.score == pytest.approx(by_id[hit.id].score + 0.5 * hit.global_score, abs=1e-5)
