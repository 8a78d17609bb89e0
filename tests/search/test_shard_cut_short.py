"""A shard file cut short in place (``truncate``, a ``cp`` over it) under an opened index is an error naming
the file, not the end of the process: the file's size is checked before rows are copied out of its memory
map (without the check, the search that read a row past the new end died of SIGBUS, and with it ``patchword
serve``, every request in flight dropped). A server answers 503, reopens the index (503 while the file is
damaged) and answers again once it opens.

The searches run in a child process, so that a SIGBUS shows as its negative exit status, not as the end of
the test session. Rows are those ``np.load`` maps, in any order and repeated; a shard file deleted or
renamed over under an opened index is still read as it was mapped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from patchword.search.shards import shard_arrays, shard_files
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

# argv: index_dir run_dir query mode ("search" or "serve"); prints one JSON line of what it saw.
_CHILD = r"""
import json, os, sys
from pathlib import Path

import torch

torch.set_num_threads(1)
from patchword.runs import load_run
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex, StaleIndexError

index_dir, run_dir, query, mode = sys.argv[1:5]
searcher = Searcher(SearchIndex.open(index_dir), load_run(run_dir), shortlist=24)  # every row re-ranked
tokens = Path(index_dir) / "shards" / "00000.tokens.npy"
whole = tokens.read_bytes()
seen = {"size": len(whole)}


def cut_short():
    with open(tokens, "r+b") as fh:  # in place: the file the index opened
        fh.truncate(len(whole) // 4)


if mode == "search":
    seen["before"] = [h.id for h in searcher.search(query, k=24).hits]
    cut_short()
    try:
        searcher.search(query, k=24)
    except StaleIndexError as err:
        seen["error"] = [type(err).__name__, str(err)]
else:
    from fastapi.testclient import TestClient

    from patchword.serve.app import create_app

    def ask():
        got = client.get("/api/search", params={"q": query, "k": 24})
        return [got.status_code, got.json()]

    with TestClient(create_app(searcher), raise_server_exceptions=False) as client:
        seen["before"] = ask()
        cut_short()
        seen["cut"] = ask()
        seen["reopened"] = ask()
        seen["health"] = client.get("/healthz").json()
        # restored as docs/search.md says: a complete copy renamed over it, then the manifest touched
        (tokens.parent / "restore.tmp").write_bytes(whole)
        os.replace(tokens.parent / "restore.tmp", tokens)
        manifest = Path(index_dir) / "manifest.json"
        stat = manifest.stat()
        os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        seen["restored"] = ask()
print(json.dumps(seen))
"""


def _run_child(env, tmp_path, mode: str) -> tuple[dict, str]:
    index_dir = shutil.copytree(env.index_dir, tmp_path / "idx")
    query = caption_queries(env)[0][0]
    argv = [sys.executable, "-c", _CHILD, str(index_dir), str(env.run_dir), query, mode]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit status {done.returncode} (SIGBUS is -7): {done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1]), str(index_dir)


def test_a_search_meeting_a_shard_file_cut_short_is_an_error_naming_it(env, tmp_path):
    seen, index_dir = _run_child(env, tmp_path, "search")
    assert sorted(seen["before"]) == list(range(24))
    kind, message = seen["error"]
    tokens = os.path.join(index_dir, "shards", "00000.tokens.npy")
    assert kind == "ChangedShardError"
    assert message.startswith(
        f"{tokens}: cut short in place since the index was opened (truncated: {seen['size'] // 4} bytes, row "
    )
    assert "repair the index with `patchword index build" in message


def test_a_server_answers_503_then_reopens_the_index_once_the_shard_is_restored(env, tmp_path):
    seen, _ = _run_child(env, tmp_path, "serve")
    status, before = seen["before"]
    assert status == 200 and len(before["results"]) == 24
    assert seen["cut"] == [503, {"error": "the index changed while this request was answered; retry"}]
    # reopened: the open finds the file truncated, and says so until the files change
    assert seen["reopened"] == [
        503,
        {"error": "the index changed on disk and cannot be opened as it is now (logged on the server)"},
    ]
    assert seen["health"]["status"] == "ok" and "cannot be opened" in seen["health"]["error"]
    status, restored = seen["restored"]
    assert status == 200
    assert [(r["id"], r["score"]) for r in restored["results"]] == [
        (r["id"], r["score"]) for r in before["results"]
    ]
    assert restored["version"] == before["version"]


def test_rows_read_are_those_np_load_maps(env):
    """Any order, repeated rows, every array of every shard: the bytes ``np.load`` maps."""
    index = SearchIndex.open(env.index_dir)
    rng = np.random.default_rng(0)
    for shard in index.manifest.shards:
        files = shard_files(env.index_dir, shard["id"])
        rows = rng.integers(0, shard["rows"], 2 * shard["rows"])
        for name in shard_arrays(index.manifest):
            mapped = np.load(files[name], mmap_mode="r")
            got = index._read(shard["id"], name, rows)
            assert got.dtype == mapped.dtype and got.tobytes() == np.ascontiguousarray(mapped[rows]).tobytes()
            assert index._read(shard["id"], name, []).shape == (0, *mapped.shape[1:])
    ids = np.concatenate([rng.permutation(len(index)), [3, 3, 0]])  # across shards, in the order given
    for name in ("global", "tokens", "dense_lens"):  # one width in every shard
        want = [
            np.load(shard_files(env.index_dir, e.shard)[name])[e.row]
            for e in map(index.entries.__getitem__, ids)
        ]
        assert index.gather(name, ids).tobytes() == np.stack(want).tobytes()
