"""One tiny trained SEPS run, its exported test split and its search index, shared by the search tests.

Training, exporting and indexing happen once per test session (the module-level cache below), whichever of
``test_export``, ``test_index``, ``test_search``, ``test_serve`` or ``test_browser`` asks first; a test that
changes files works on its own copy. Everything lives under pytest's session temporary directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL_32
from patchword.config import apply_overrides
from patchword.data.export import ExportSummary, export_synthetic_split
from patchword.runs import LoadedRun, load_run
from patchword.runs.config import RunConfig
from stall_support import HANG_GUARD_S

# A paper-variant SEPS that reads image-tied dense captions (the demo's model), at toy size: 32-pixel
# scenes, 8-pixel patches (a 4 x 4 grid, K = 8 kept patches), 32-wide encoders.
TINY = [
    "name=tiny",
    "data.num_train=48",
    "data.num_dev=8",
    "data.num_test=24",
    "model.matcher=seps",
    "model.seps.variant=paper",
    "model.seps.dense_pairing=image",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.epochs=2",
    "train.lr=1e-3",
    "train.log_every=100",
    "eval.max_memory_mb=8",
]


@dataclass
class SearchEnv:
    """The shared artefacts: run directory and its config, the export, the index built from it."""

    root: Path
    run_dir: Path
    config: RunConfig
    export: ExportSummary
    index_dir: Path
    _run: LoadedRun | None = None

    @property
    def run(self) -> LoadedRun:
        """The run loaded once (eval mode, CPU)."""
        if self._run is None:
            self._run = load_run(self.run_dir)
        return self._run


_ENV: dict[str, SearchEnv] = {}


def search_env(tmp_path_factory: pytest.TempPathFactory) -> SearchEnv:
    """Train, export and index once per session; later calls return the same :class:`SearchEnv`."""
    if "env" in _ENV:
        return _ENV["env"]
    from patchword.search.index import build_index
    from patchword.train.runner import train_run

    root = tmp_path_factory.mktemp("search_env")
    cfg = apply_overrides(
        RunConfig(), [f"output_dir={root / 'runs'}", f"data.cache_dir={root / 'cache'}", *TINY]
    )
    # Tiny tensors: one thread avoids OpenMP barrier costs on a loaded 2-core machine (see one_thread).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_run(cfg)
        run_dir = root / "runs" / "tiny"
        export = export_synthetic_split(root / "export", "test", config=cfg.data.synthetic_config())
        env = SearchEnv(root, run_dir, cfg, export, root / "index")
        build_index(
            env.run,
            export.files["images"],
            env.index_dir,
            dense=export.files["dense"],
            shard_size=10,
            batch_size=8,
        )
    finally:
        torch.set_num_threads(threads)
    _ENV["env"] = env
    return env


def caption_queries(env: SearchEnv) -> tuple[list[str], list[int]]:
    """The exported test captions and the index id of each one's ground-truth image."""
    from patchword.search.store import SearchIndex

    captions = env.export.files["caps"].read_text().splitlines()
    image_ids = env.export.files["ids"].read_text().splitlines()
    position = {entry.path: i for i, entry in enumerate(SearchIndex.open(env.index_dir).entries)}
    return captions, [position[f"{image_id}.png"] for image_id in image_ids]


def library_t2i_scores(env: SearchEnv, shortlist: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Caption-query scores of the library's two-stage search on the index's own tokens: (N_img, N_txt)
    ``fine`` on each caption's ``shortlist`` globally nearest images, ``-inf`` elsewhere, and the (N_img,
    N_txt) global similarities the shortlist was taken from."""
    from patchword.eval import encode_text_tokens, global_embeddings, two_stage_scores
    from patchword.search.store import SearchIndex

    index = SearchIndex.open(env.index_dir)
    ids = torch.arange(len(index))
    dense, dense_lens = index.dense_tokens(ids)
    captions, _ = caption_queries(env)
    cap_ids, cap_lens = env.run.tokenize(captions)
    cap = encode_text_tokens(env.run.model, cap_ids, cap_lens)
    img = index.image_tokens(ids)
    matcher = env.run.model.matcher
    result = two_stage_scores(matcher, img, cap, cap_lens, dense, dense_lens, k=(1, shortlist))
    g_img, g_txt = global_embeddings(matcher, img, cap, cap_lens)
    return result.sims_t2i, g_img @ g_txt.T


# Scores of one (image, caption) pair computed by two paths (a query encoded alone or in a batch, scored in
# a column or a matrix) differ by float rounding, which depends on the CPU's kernels: two images whose
# scores lie closer than this may rank either way (seen: 2e-7 apart under ATEN_CPU_CAPABILITY=avx2).
RANK_TOLERANCE = 1e-5


def assert_ranked_as(
    hit_ids: list[int],
    column: torch.Tensor,
    global_column: torch.Tensor | None = None,
    shortlist: int | None = None,
    tol: float = RANK_TOLERANCE,
) -> None:
    """``hit_ids`` (best first) rank the images as the library's scores ``column`` (N_img,) do, up to pairs
    closer than ``tol``: the same images, each scoring at least the next one's score less ``tol``.

    With a ``shortlist`` of the globally nearest images, only an image whose ``global_column`` score lies
    within ``tol`` of the shortlist's boundary may be in one shortlist and not the other.
    """
    finite = torch.isfinite(column)
    if shortlist is None:
        assert sorted(hit_ids) == finite.nonzero().flatten().tolist()
    else:
        assert len(hit_ids) == len(set(hit_ids)) == shortlist
        boundary = float(global_column.sort(descending=True).values[shortlist - 1])
        must = set((global_column > boundary + tol).nonzero().flatten().tolist())
        may = set((global_column >= boundary - tol).nonzero().flatten().tolist())
        assert must <= set(hit_ids) <= may, (sorted(hit_ids), sorted(must), sorted(may))
        hit_ids = [i for i in hit_ids if finite[i]]  # both shortlists hold these
    scores = column[hit_ids]
    assert bool((scores[:-1] >= scores[1:] - tol).all()), list(zip(hit_ids, scores.tolist(), strict=True))


def rank_bounds(column: torch.Tensor, target: int, tol: float = RANK_TOLERANCE) -> tuple[int, int]:
    """The 1-based ranks image ``target`` may take under ``column`` when scores closer than ``tol`` may
    rank either way."""
    score = column[target]
    return int((column > score + tol).sum()) + 1, int((column >= score - tol).sum())


@contextmanager
def live_server(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free local port in a thread; yields the base URL."""
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG_GUARD_S
    while not server.started:
        if not thread.is_alive():
            pytest.fail("uvicorn ended before it started serving (its log is in the captured output)")
        if time.monotonic() > deadline:
            server.should_exit = True
            pytest.fail(f"hang guard: uvicorn did not start serving in {HANG_GUARD_S:g} s")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def killed_after_shards(monkeypatch: pytest.MonkeyPatch, shards: int) -> Iterator[None]:
    """Within the block, ``build_index`` is interrupted (``KeyboardInterrupt``, as by Ctrl-C) when it is
    about to write shard number ``shards + 1``; the real shard writer is back afterwards."""
    from patchword.search import index as index_module

    real_write = index_module.write_shard
    written = []

    def dying_write(*args, **kwargs):
        if len(written) == shards:
            raise KeyboardInterrupt
        written.append(args[1])
        return real_write(*args, **kwargs)

    monkeypatch.setattr(index_module, "write_shard", dying_write)
    try:
        yield
    finally:
        monkeypatch.setattr(index_module, "write_shard", real_write)


def stalled_searcher(env: SearchEnv):
    """A searcher of the shared index whose ``search`` sets ``entered`` and then waits for ``release``
    (at most :data:`HANG_GUARD_S`, a hang guard: a test sets it, in a ``finally``) before answering: what a
    server looks like while one request holds its only worker. Returns ``(searcher, entered, release)``."""
    from patchword.search.query import Searcher
    from patchword.search.store import SearchIndex

    searcher = Searcher(SearchIndex.open(env.index_dir), env.run)
    entered, release = threading.Event(), threading.Event()
    real_search = searcher.search

    def slow_search(query, k):
        entered.set()
        release.wait(timeout=HANG_GUARD_S)
        return real_search(query, k)

    searcher.search = slow_search
    return searcher, entered, release


def train_code_variant(env: SearchEnv, root: Path) -> LoadedRun:
    """A run of the search environment's recipe with SEPS's code variant (its dense branch is one score per
    image: what ``--dense-store scores`` keeps), trained under ``root / "runs" / "code"``; loaded."""
    from patchword.train.runner import train_run

    overrides = [o for o in TINY if not o.startswith(("model.seps.variant", "train.epochs", "name="))]
    cfg = apply_overrides(
        RunConfig(),
        [
            f"output_dir={root / 'runs'}",
            f"data.cache_dir={env.root / 'cache'}",
            *overrides,
            "name=code",
            "model.seps.variant=code",
            "train.epochs=1",
        ],
    )
    train_run(cfg)
    return load_run(root / "runs" / "code")


#: The 409 answer's error when a search's index version is no longer the one served.
STALE_VERSION = "the index was updated since this search: search again"


def served_copy(env, tmp_path: Path):
    """A copy of ``env``'s exported images, indexed (10 images a shard) and served in process: ``(image
    folder, index folder, TestClient)``; the tests change the copies under the running app."""
    import shutil

    from fastapi.testclient import TestClient

    from patchword.search.index import build_index
    from patchword.search.query import Searcher
    from patchword.search.store import SearchIndex
    from patchword.serve.app import create_app

    folder = tmp_path / "imgs"
    shutil.copytree(env.export.files["images"], folder)
    out = tmp_path / "idx"
    build_index(env.run, folder, out, shard_size=10)
    searcher = Searcher(SearchIndex.open(out), env.run)
    return folder, out, TestClient(create_app(searcher), raise_server_exceptions=False)
