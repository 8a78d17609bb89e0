"""``index build --update`` of an index with dense captions: an image whose caption line changed is encoded
again, one whose line was removed leaves the index, and the updated index equals a fresh build. Old code
compared only each file's size and mtime: "0 encoded, 24 kept", the old dense tokens kept, the uncaptioned
image still indexed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from patchword.search.index import build_index
from patchword.search.manifest import MANIFEST_FILE, Manifest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = {"shard_size": 4, "batch_size": 4}


def _folder_and_captions(env, tmp_path: Path, count: int) -> tuple[Path, Path, list[dict]]:
    """``count`` exported images in their own folder and a dense file of their caption lines."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    names = sorted(p.name for p in env.export.files["images"].iterdir())[:count]
    for name in names:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    lines = env.export.files["dense"].read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["metadata"]["file"] in names]
    dense = tmp_path / "dense.jsonl"
    _write(dense, records)
    return folder, dense, records


def _write(dense: Path, records: list[dict]) -> None:
    dense.write_text("".join(json.dumps(r) + "\n" for r in records))


def _by_path(index: SearchIndex) -> dict[str, int]:
    return {e.path: i for i, e in enumerate(index.entries)}


def test_an_update_follows_the_dense_captions_and_equals_a_fresh_build(env, tmp_path):
    folder, dense, records = _folder_and_captions(env, tmp_path, 8)
    build_index(env.run, folder, tmp_path / "updated", dense=dense, **ARGS)
    changed = records[0]["metadata"]["file"]
    records[0]["text"] = "a big green triangle"
    dropped = records.pop(1)["metadata"]["file"]
    _write(dense, records)

    report = build_index(env.run, folder, tmp_path / "updated", dense=dense, update=True, **ARGS)
    # the image whose caption changed is encoded again (changed); the one that lost its caption is removed
    assert (report.added, report.kept, report.changed, report.removed, report.num_images) == (1, 6, 1, 1, 7)
    fresh = build_index(env.run, folder, tmp_path / "fresh", dense=dense, **ARGS)
    assert fresh.num_images == 7

    updated, rebuilt = SearchIndex.open(tmp_path / "updated"), SearchIndex.open(tmp_path / "fresh")
    at_u, at_f = _by_path(updated), _by_path(rebuilt)
    assert dropped not in at_u and sorted(at_u) == sorted(at_f)
    assert [(s.path, s.reason) for s in updated.manifest.skipped] == [
        (s.path, s.reason) for s in rebuilt.manifest.skipped
    ]
    assert [s.path for s in updated.manifest.skipped] == [dropped]
    ids_u = [at_u[p] for p in sorted(at_f)]
    ids_f = [at_f[p] for p in sorted(at_f)]
    (tok_u, len_u), (tok_f, len_f) = updated.dense_tokens(ids_u), rebuilt.dense_tokens(ids_f)
    assert torch.equal(len_u, len_f)
    for row, length in enumerate(len_f.tolist()):  # past its length a row is padding, read by no matcher
        torch.testing.assert_close(tok_u[row, :length], tok_f[row, :length], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(updated.image_tokens(ids_u), rebuilt.image_tokens(ids_f), rtol=1e-5, atol=1e-5)
    # every image scores as in the fresh build, the one whose caption changed included
    captions = env.export.files["caps"].read_text().splitlines()[:5]
    for caption in captions:
        got = {h.path: h.score for h in Searcher(updated, env.run).search(caption, k=7).hits}
        want = {h.path: h.score for h in Searcher(rebuilt, env.run).search(caption, k=7).hits}
        assert got.keys() == want.keys()
        assert got[changed] == pytest.approx(want[changed], abs=1e-5)
        assert all(got[p] == pytest.approx(want[p], abs=1e-5) for p in want), caption

    # a second update with nothing changed keeps everything
    again = build_index(env.run, folder, tmp_path / "updated", dense=dense, update=True, **ARGS)
    assert (again.added, again.kept, again.changed, again.removed) == (0, 7, 0, 0)


def test_an_index_that_does_not_record_its_captions_is_encoded_again(env, tmp_path, caplog):
    """An index written before the caption digests were recorded cannot tell which captions changed: its
    images are encoded again (a warning says why), and the next update keeps them."""
    folder, dense, _ = _folder_and_captions(env, tmp_path, 5)
    out = tmp_path / "idx"
    build_index(env.run, folder, out, dense=dense, **ARGS)
    payload = json.loads((out / MANIFEST_FILE).read_text())
    assert payload["entry_fields"][-1] == "dense_sha" and all(len(row) == 7 for row in payload["entries"])
    payload["entry_fields"] = payload["entry_fields"][:6]
    payload["entries"] = [row[:6] for row in payload["entries"]]
    (out / MANIFEST_FILE).write_text(json.dumps(payload))
    assert all(e.dense_sha is None for e in Manifest.read(out).entries)

    with caplog.at_level(logging.WARNING, logger="patchword.search.index"):
        report = build_index(env.run, folder, out, dense=dense, update=True, **ARGS)
    assert (report.added, report.kept, report.changed, report.removed) == (5, 0, 5, 0)
    assert "does not record the dense captions" in caplog.text
    assert all(e.dense_sha for e in Manifest.read(out).entries)
    again = build_index(env.run, folder, out, dense=dense, update=True, **ARGS)
    assert (again.added, again.kept) == (0, 5)


def test_an_index_without_dense_captions_writes_its_entries_as_before(env, tmp_path):
    folder, _, _ = _folder_and_captions(env, tmp_path, 3)
    build_index(env.run, folder, tmp_path / "idx", **ARGS)
    payload = json.loads((tmp_path / "idx" / MANIFEST_FILE).read_text())
    assert payload["entry_fields"] == ["path", "size", "mtime_ns", "format", "shard", "row"]
    assert all(len(row) == 6 for row in payload["entries"])
