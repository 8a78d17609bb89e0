"""Opening an index's shards, as a search, a server or an update does (review S):

- the dense caption lengths, whose values are checked when a shard is opened, are read with the file's size
  checked first: a file cut short in place between its mapping and that read was a SIGBUS (the end of the
  process), now one line naming the file;
- too many open files met by an update's scan for damaged shards (``broken_shards``) was a bare
  ``OSError: [Errno 24]``; it is the line an open gives, naming the limit and ``ulimit -n``.

The cut is made in a child process, so that a SIGBUS shows as its negative exit status, not as the end of
the test session.
"""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys

import pytest

from patchword.errors import DataError
from patchword.search.manifest import Manifest
from patchword.search.shards import shard_arrays, shard_files, too_many_open_files
from patchword.search.store import broken_shards

pytestmark = pytest.mark.usefixtures("one_thread")

# argv: index_dir, then "open" or "broken"; cuts shard 0's dense_lens.npy to nothing in place once it is
# mapped, before its values are read; prints one JSON line of what it saw.
_CHILD = r"""
import json, os, sys

import patchword.search.store as store
from patchword.search.manifest import Manifest

index_dir, mode = sys.argv[1:3]
shape_problem = store.shape_problem


def cut_once_mapped(name, shapes, rows, manifest, width):
    problem = shape_problem(name, shapes, rows, manifest, width)
    lens = os.path.join(index_dir, "shards", "00000.dense_lens.npy")
    if name == "dense_lens" and os.path.getsize(lens):
        os.truncate(lens, 0)  # in place: the file just mapped
    return problem


store.shape_problem = cut_once_mapped
try:
    if mode == "open":
        store.SearchIndex.open(index_dir)
        seen = {"opened": True}
    else:
        seen = {"broken": store.broken_shards(index_dir, Manifest.read(index_dir))}
except Exception as err:
    seen = {"error": [type(err).__name__, str(err)]}
print(json.dumps(seen))
"""


@pytest.mark.parametrize("mode", ["open", "broken"])
def test_dense_lengths_cut_short_once_mapped_are_one_line_not_sigbus(env, tmp_path, mode):
    index_dir = shutil.copytree(env.index_dir, tmp_path / "idx")
    lens = shard_files(index_dir, 0)["dense_lens"]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(index_dir), mode], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stderr[-3000:]}"
    seen = json.loads(done.stdout.splitlines()[-1])
    assert lens.stat().st_size == 0  # the cut was made
    problem = "truncated: 0 bytes, row 9 needs "  # shard 0 holds 10 rows
    if mode == "open":
        kind, message = seen["error"]
        assert kind == "DataError"
        assert message.startswith(f"{lens}: {problem}") and "--update" in message
    else:
        assert list(seen["broken"]) == ["0"]
        assert seen["broken"]["0"].startswith(f"00000.dense_lens.npy: {problem}")


def test_too_many_open_files_in_an_updates_scan_is_one_line_naming_the_limit(env, monkeypatch):
    manifest = Manifest.read(env.index_dir)
    assert broken_shards(env.index_dir, manifest) == {}

    def no_descriptor_left(file):
        raise OSError(errno.EMFILE, "Too many open files", str(file))

    monkeypatch.setattr("patchword.search.store.ShardArray", no_descriptor_left)
    with pytest.raises(DataError) as err:
        broken_shards(env.index_dir, manifest)
    arrays = len(manifest.shards) * len(shard_arrays(manifest))
    assert str(err.value) == too_many_open_files(env.index_dir, arrays)
    assert f"`ulimit -n {2 * arrays + 256}`" in str(err.value)
