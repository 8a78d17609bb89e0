"""Two copies of one image score alike: they ranked in the first stage's order, which differs between backends
(exact torch and Qdrant put the lower id first, FAISS flat / IVF / HNSW the higher, their global scores of
the two differing by rounding). The final ranking breaks ties of the score by id, whatever ranked the
shortlist."""

from __future__ import annotations

import shutil

import pytest

from patchword.eval.two_stage import faiss_available
from patchword.search.index import build_index
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


class _Reversed:
    """A first stage returning its shortlist in the reverse order (ties in another order)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def search(self, queries, k):
        scores, ids = self.inner.search(queries, k)
        return scores.flip(-1), ids.flip(-1)


def test_duplicate_images_rank_by_id_whatever_the_first_stage(env, tmp_path):
    images = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], images)
    names = sorted(p.name for p in images.iterdir())
    shutil.copy2(images / names[3], images / "zz-copy.png")  # the last id
    build_index(env.run, images, tmp_path / "idx", shard_size=10)
    index = SearchIndex.open(tmp_path / "idx")
    twins = sorted(i for i, e in enumerate(index.entries) if e.path in (names[3], "zz-copy.png"))
    backends = ["exact"] + (["faiss_flat", "faiss_ivf", "faiss_hnsw"] if faiss_available() else [])
    searchers = [Searcher(index, env.run, backend=b, shortlist=len(index)) for b in backends]
    reversed_ = Searcher(index, env.run, backend="exact", shortlist=len(index))
    reversed_.global_index = _Reversed(reversed_.global_index)
    for caption in caption_queries(env)[0][:3]:
        for searcher in [*searchers, reversed_]:
            hits = searcher.search(caption, k=len(index)).hits
            pair = [h for h in hits if h.id in twins]
            assert pair[0].score == pair[1].score  # (FAISS's global scores of the two differ by rounding)
            assert [h.id for h in pair] == twins, searcher.backend
            assert pair[1].rank == pair[0].rank + 1
