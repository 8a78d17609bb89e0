"""Search your own images: an index of a folder, two-stage text search, and explanations of a match.

- :mod:`.scan`: find the images under a folder by content;
- :mod:`.manifest`: the on-disk index format and its manifest; :mod:`.shards`: the shard files
  (memory-mappable ``.npy`` arrays);
- :mod:`.store`: :class:`SearchIndex`, the reader of an index;
- :mod:`.checks`: what the readers can use of a manifest's fields and of the shard arrays;
- :mod:`.index`: :func:`build_index` (build, ``update``, resume) and the model-identity check; its parts
  :mod:`.build_open` (``--out`` and the manifest a build starts from), :mod:`.build_checks` (the settings),
  :mod:`.build_files` (which files are encoded), :mod:`.build_lock` (one build at a time), :mod:`.build_plan`;
- :mod:`.query`: :class:`Searcher` (global shortlist, fine re-ranking); :mod:`.query_encode`: the query as
  the model reads it; :mod:`.first_stage`: a local index's shortlist; :mod:`.results`: the query's checks
  and what a search answers;
- :mod:`.explain`: kept patches and word-to-patch attention of one (query, image) pair;
- :mod:`.cli`: ``patchword index build`` and ``patchword search``.
"""

from patchword.search.entries import ImageIdError
from patchword.search.explain import Explanation, explain_pair
from patchword.search.index import (
    BuildPlan,
    BuildReport,
    IndexMismatchError,
    build_index,
    plan_build,
    write_build,
)
from patchword.search.query import Searcher
from patchword.search.results import QueryError, SearchHit, SearchResult
from patchword.search.scan import ScanResult, scan_images
from patchword.search.store import SearchIndex

__all__ = [
    "BuildReport",
    "BuildPlan",
    "Explanation",
    "ImageIdError",
    "IndexMismatchError",
    "QueryError",
    "ScanResult",
    "SearchHit",
    "SearchIndex",
    "SearchResult",
    "Searcher",
    "build_index",
    "explain_pair",
    "plan_build",
    "scan_images",
    "write_build",
]
