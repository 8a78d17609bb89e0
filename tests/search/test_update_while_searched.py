"""An index being updated stays searchable as it was (docs/search.md: "searching or serving it meanwhile is
fine"), an update stopped part-way leaves it so and resumes, and one build or update of an index runs at a
time. Old code marked the complete index ``building`` for the whole update: every search and server start
meanwhile failed, advising to "rerun the same `patchword index build` command", a second build beside the
running one."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli.search import main_index
from patchword.errors import DataError, RunExistsError
from patchword.search import index as index_module
from patchword.search import store as store_module
from patchword.search.index import build_index
from patchword.search.manifest import MANIFEST_FILE, Manifest
from patchword.search.query import Searcher
from patchword.search.store import REPAIR_HINT, SearchIndex
from search_support import killed_after_shards

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = {"shard_size": 4, "batch_size": 4}
# manifest.PENDING_FILE and manifest.LOCK_FILE, spelt out: what a user sees in the index directory
PENDING_FILE, LOCK_FILE = "manifest.pending.json", ".build.lock"


def _half_then_all(env, tmp_path: Path, out: Path) -> tuple[Path, list[str]]:
    """An index of the first 12 exported images at ``out``, then the other 12 added to its folder."""
    folder = tmp_path / "imgs"
    folder.mkdir(exist_ok=True)
    names = sorted(p.name for p in env.export.files["images"].iterdir())
    for name in names[:12]:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    build_index(env.run, folder, out, dense=env.export.files["dense"], **ARGS)
    for name in names[12:]:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    return folder, names


def _during_shard_writes(monkeypatch, action) -> list:
    """Run ``action()`` each time ``build_index`` is about to write a shard; -> what each call returned."""
    real_write, seen = index_module.write_shard, []

    def write_after_action(*args, **kwargs):
        seen.append(action())
        return real_write(*args, **kwargs)

    monkeypatch.setattr(index_module, "write_shard", write_after_action)
    return seen


def test_an_index_being_updated_is_searched_as_it_was(env, tmp_path, monkeypatch):
    out = tmp_path / "idx"
    folder, names = _half_then_all(env, tmp_path, out)
    caption = env.export.files["caps"].read_text().splitlines()[0]
    before = [h.path for h in Searcher(SearchIndex.open(out), env.run).search(caption, k=12).hits]

    def search_now():
        return [h.path for h in Searcher.open(out).search(caption, k=12).hits]

    seen = _during_shard_writes(monkeypatch, search_now)
    report = build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, **ARGS)
    monkeypatch.undo()
    assert len(seen) == 3 and all(hits == before for hits in seen)  # before each of the 3 new shards
    assert (report.added, report.kept) == (12, 12)
    assert len(SearchIndex.open(out)) == 24 and not (out / PENDING_FILE).exists()
    assert not (out / LOCK_FILE).exists()


def test_an_update_stopped_part_way_leaves_the_index_searchable_and_resumes(env, tmp_path, monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    folder, _ = _half_then_all(env, tmp_path, whole)
    shutil.copytree(whole, cut)
    build_index(env.run, folder, whole, dense=env.export.files["dense"], update=True, **ARGS)

    with killed_after_shards(monkeypatch, 2), pytest.raises(KeyboardInterrupt):
        build_index(env.run, folder, cut, dense=env.export.files["dense"], update=True, **ARGS)
    assert Manifest.read(cut).state == "complete" and len(SearchIndex.open(cut)) == 12
    assert len(Manifest.read(cut, PENDING_FILE).entries) == 12 + 8
    assert not (cut / LOCK_FILE).exists()

    # the same command resumes the update (so does the build without --update, as for a first build)
    report = build_index(env.run, folder, cut, dense=env.export.files["dense"], **ARGS)
    # counted as the uninterrupted update's (12 kept, 12 encoded), 8 of them before the stop
    assert report.resumed and (report.kept, report.added, report.encoded_before) == (12, 12, 8)
    assert not (cut / PENDING_FILE).exists()
    assert Manifest.read(cut) == Manifest.read(whole)
    shards = sorted(p.name for p in (whole / "shards").iterdir())
    assert shards == sorted(p.name for p in (cut / "shards").iterdir())
    for name in shards:
        assert filecmp.cmp(whole / "shards" / name, cut / "shards" / name, shallow=False), name


def test_a_second_build_of_an_index_being_written_is_refused(env, tmp_path, monkeypatch, capsys):
    out = tmp_path / "idx"
    folder, _ = _half_then_all(env, tmp_path, out)
    argv = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--update"]
    argv += ["--dense", str(env.export.files["dense"]), "--shard-size", "4"]

    def second_build():
        with pytest.raises(RunExistsError, match="being built or updated by another") as err:
            build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, **ARGS)
        assert main_index(argv) == 2
        return str(err.value), one_error_line(capsys.readouterr().err)

    seen = _during_shard_writes(monkeypatch, second_build)
    build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, **ARGS)
    monkeypatch.undo()
    message, line = seen[0]
    assert message.startswith(f"{out} is being built or updated by another `patchword index build`")
    assert "rerun" not in message and line == f"error: {message}"
    assert len(SearchIndex.open(out)) == 24


def test_a_first_build_in_progress_is_not_opened_and_the_error_says_why(env, tmp_path, monkeypatch):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for path in sorted(env.export.files["images"].iterdir())[:8]:
        shutil.copy2(path, folder / path.name)
    out = tmp_path / "idx"

    def open_now():
        with pytest.raises(DataError) as err:
            SearchIndex.open(out)
        return str(err.value)

    seen = _during_shard_writes(monkeypatch, open_now)
    build_index(env.run, folder, out, **ARGS)
    monkeypatch.undo()
    assert seen[1] == (
        f"{out}: the index build did not finish: it is still running (search the index when it ends), or it "
        "was stopped (then rerun the same `patchword index build` command: it resumes the build)"
    )


def test_a_build_that_wrote_the_index_while_this_one_checked_it_refuses_this_one(env, tmp_path, monkeypatch):
    """Two commands read the index, the first writes it and ends, the second must not write on what it
    read before: it is refused, and the index is the first one's."""
    out = tmp_path / "idx"
    folder, _ = _half_then_all(env, tmp_path, out)
    real_scan = index_module.scan_images

    def scan_while_another_updates(*args, **kwargs):
        monkeypatch.setattr(index_module, "scan_images", real_scan)
        build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, **ARGS)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(index_module, "scan_images", scan_while_another_updates)
    with pytest.raises(RunExistsError, match="was written by another `patchword index build` while this"):
        build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, **ARGS)
    assert len(SearchIndex.open(out)) == 24 and not (out / LOCK_FILE).exists()


def test_a_lock_file_left_by_a_killed_first_build_does_not_refuse_the_rerun(env, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for path in sorted(env.export.files["images"].iterdir())[:3]:
        shutil.copy2(path, folder / path.name)
    out = tmp_path / "idx"
    out.mkdir()
    (out / LOCK_FILE).touch()  # a kill -9 takes the lock away, not its file
    report = build_index(env.run, folder, out, **ARGS)
    assert report.added == 3 and sorted(p.name for p in out.iterdir()) == [MANIFEST_FILE, "shards"]


def test_an_open_that_read_the_manifest_an_update_then_replaced_opens_the_new_index(
    env, tmp_path, monkeypatch
):
    """The race of a search (or a server start) with the end of an update: the search reads manifest.json,
    the update replaces it and deletes the shards it compacted away, the search opens a shard file the
    manifest it read names. Old code failed the search: "shard file 00000.global.npy is missing". Here the
    whole update runs at that instant: when the reader asks for its first shard's files."""
    out = tmp_path / "idx"
    folder, names = _half_then_all(env, tmp_path, out)  # 12 images indexed in shards 0-2, 12 more added
    for name in names[:8]:  # 8 of the 12 indexed images deleted: 8 dead rows of 24, the update compacts
        (folder / name).unlink()
    old_shards = [s["id"] for s in Manifest.read(out).shards]
    real_files, updates = store_module.shard_files, []

    def update_then_files(index_dir, shard_id):
        monkeypatch.setattr(store_module, "shard_files", real_files)  # the update's own reads are plain
        updates.append(
            build_index(env.run, folder, out, dense=env.export.files["dense"], update=True, **ARGS)
        )
        return real_files(index_dir, shard_id)

    monkeypatch.setattr(store_module, "shard_files", update_then_files)
    searcher = Searcher.open(out)
    assert len(updates) == 1 and updates[0].compacted
    assert not any((out / "shards" / f"{i:05d}.global.npy").exists() for i in old_shards)
    fresh = Searcher(SearchIndex.open(out), env.run)
    assert searcher.index.manifest == fresh.index.manifest and len(searcher) == 16
    for caption in env.export.files["caps"].read_text().splitlines()[:3]:
        assert searcher.search(caption, k=16).hits == fresh.search(caption, k=16).hits


def test_a_shard_missing_under_an_unchanged_manifest_is_still_the_clear_error(env, tmp_path, monkeypatch):
    out = Path(shutil.copytree(env.index_dir, tmp_path / "idx"))
    (out / "shards" / "00001.tokens.npy").unlink()
    with pytest.raises(DataError) as err:
        SearchIndex.open(out)
    assert str(err.value) == f"{out}: shard file 00001.tokens.npy is missing; {REPAIR_HINT}"
    # deleted between the manifest's read and the shard's: the manifest unchanged, no second try helps
    real_files, calls = store_module.shard_files, []

    def files_then_delete(index_dir, shard_id):
        calls.append(shard_id)
        files = real_files(index_dir, shard_id)
        if shard_id == 0:
            files["global"].unlink()
        return files

    shutil.copy2(env.index_dir / "shards" / "00001.tokens.npy", out / "shards")
    monkeypatch.setattr(store_module, "shard_files", files_then_delete)
    with pytest.raises(DataError) as err:
        SearchIndex.open(out)
    assert str(err.value) == f"{out}: shard file 00000.global.npy is missing; {REPAIR_HINT}"
    assert calls == [0]  # no second try
