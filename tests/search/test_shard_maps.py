"""Shard arrays are read through read-only memory maps, each read checked against its file's size.

- An index too big for the process's limit of open files (Python before 3.13 keeps one descriptor per
  mapped array) is one line naming the index, the number of arrays and the limit (old code: a bare
  ``OSError: [Errno 24] Too many open files`` out of the reader); on Python 3.13+ the maps hold none.
- The size check is of the file mapped: a shard file deleted (an update's compaction) or renamed over (a
  backup restored) under an opened index is still read as it was mapped, no error.
- ``.npy`` files of format 3.0 are checked as 1.0 and 2.0 are (old code: their size was not checked).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from patchword.data.npy import npy_problem
from patchword.search.shards import shard_arrays, shard_files
from patchword.search.store import SearchIndex

# argv: index_dir; lowers the soft limit of open files to a few past the descriptors open now, then opens
# the index; prints one JSON line of what it saw.
_CHILD = r"""
import json, os, resource, sys

from patchword.search.store import SearchIndex

open_fds = lambda: [int(n) for n in os.listdir("/proc/self/fd")]
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_fds()) + 4, hard))
before = len(open_fds())
try:
    SearchIndex.open(sys.argv[1])
    seen = {"held": len(open_fds()) - before}
except Exception as err:
    seen = {"error": [type(err).__name__, str(err)]}
print(json.dumps(seen))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts the descriptors in /proc/self/fd")
def test_an_index_past_the_limit_of_open_files_is_one_line_naming_the_limit(env):
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(env.index_dir)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    if sys.version_info >= (3, 13):  # mmap(trackfd=False): the maps hold no descriptor
        assert seen == {"held": 0}
        return
    manifest = SearchIndex.open(env.index_dir).manifest
    arrays = len(manifest.shards) * len(shard_arrays(manifest))
    kind, message = seen["error"]
    assert kind == "DataError"
    assert message.startswith(
        f"{env.index_dir}: too many open files: the index maps {arrays} shard arrays (this Python's memory "
        "maps hold a descriptor each; 3.13+ hold none) and the limit is "
    )
    assert message.endswith(f": raise it, e.g. `ulimit -n {2 * arrays + 256}` before starting")


def test_a_shard_file_deleted_or_renamed_over_is_read_as_it_was_mapped(env, tmp_path):
    index_dir = shutil.copytree(env.index_dir, tmp_path / "idx")
    index = SearchIndex.open(index_dir)
    ids = np.arange(len(index))
    want = {name: index.gather(name, ids).tobytes() for name in ("global", "tokens")}
    files = shard_files(index_dir, 0)
    # tokens: a shorter file renamed over it (its size is not that of the file mapped); global: deleted
    short = tmp_path / "short.npy"
    np.save(short, np.load(files["tokens"])[:1])
    os.replace(short, files["tokens"])
    files["global"].unlink()
    assert {name: index.gather(name, ids).tobytes() for name in want} == want


def test_a_truncated_npy_file_of_format_3_is_named_truncated(tmp_path):
    path = tmp_path / "v3.npy"
    with open(path, "wb") as fh:
        np.lib.format.write_array(fh, np.arange(12, dtype=np.float32).reshape(3, 4), version=(3, 0))
    assert npy_problem(path) is None
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 16)
    assert npy_problem(path) == f"truncated: {size - 16} bytes, its header ((3, 4) float32) needs {size}"
