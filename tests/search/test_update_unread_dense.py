"""``index build --update`` of an index that keeps dense text its model's searches never read.

A build now refuses ``--dense`` for such a model (VSE ignores dense text, caption-tied SEPS pairs it with
captions: :func:`~patchword.search.fidelity.reads_index_dense`), but an index an older patchword built keeps
it in its manifest. Old code: every update without ``--dense`` went on encoding dense tokens into each new
shard (the index growing by data no search reads), skipped new images without a line in the dense file, and
failed when that file was gone. Now the update stops keeping it (one log line): the manifest drops it, new
shards hold none, the old shards' dense files are deleted once the updated manifest is in place, and the
stored images' scores do not change.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.runs import load_run
from patchword.search import index as index_module
from patchword.search.index import build_index
from patchword.search.manifest import Manifest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex

pytestmark = pytest.mark.usefixtures("one_thread")

RUNS = {
    "vse": ["model.matcher=vse"],
    "seps_caption": ["model.matcher=seps", "model.seps.dense_pairing=caption"],
}
ARGS = {"shard_size": 4, "batch_size": 4}
QUERIES = ["a red circle", "a blue square on the left", "green triangle"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """One-step tiny runs of :data:`RUNS` and the synthetic test split exported (8 images, dense file)."""
    root = tmp_path_factory.mktemp("unread_dense")
    paths = {}
    for name, extra in RUNS.items():
        argv = [
            "train",
            *TINY_RUN_32,
            *extra,
            "train.max_steps=1",
            f"output_dir={root / 'runs'}",
            f"name={name}",
        ]
        assert main(argv) == 0, name
        paths[name] = root / "runs" / name
    scenes = root / "scenes"
    argv = [
        "data",
        "export",
        "synthetic",
        "--split",
        "test",
        "--out",
        str(scenes),
        "--run",
        str(paths["vse"]),
    ]
    assert main(argv) == 0
    paths["images"], paths["dense"] = scenes / "images", scenes / "test.jsonl"
    return paths


def _old_index(setup, run, tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path, list[str]]:
    """An index of 6 of the 8 images with dense tokens, as a patchword that did not refuse ``--dense`` for
    this model built it (the refusal bypassed); the folder, the dense file and the 2 images left out."""
    folder, dense = tmp_path / "imgs", tmp_path / "dense.jsonl"
    folder.mkdir()
    names = sorted(p.name for p in setup["images"].iterdir())
    for name in names[:6]:
        shutil.copy2(setup["images"] / name, folder / name)
    shutil.copy2(setup["dense"], dense)
    with monkeypatch.context() as patch:
        patch.setattr(index_module, "check_dense_read", lambda *args: None)
        build_index(run, folder, tmp_path / "idx", dense=dense, **ARGS)
    assert Manifest.read(tmp_path / "idx").dense_store == "tokens"
    assert sorted(p.name for p in (tmp_path / "idx" / "shards").glob("*.dense.npy")) == [
        "00000.dense.npy",
        "00001.dense.npy",
    ]
    return folder, dense, tmp_path / "idx", names[6:]


def _scores(run, index_dir: Path) -> dict[tuple[str, str], float]:
    """(query, image path) -> final score, every image ranked."""
    searcher = Searcher(SearchIndex.open(index_dir), run)
    assert not searcher.use_dense
    return {
        (query, hit.path): hit.score
        for query in QUERIES
        for hit in searcher.search(query, k=len(searcher)).hits
    }


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_update_stops_keeping_dense_text_the_matcher_never_reads(
    setup, tmp_path, monkeypatch, caplog, name
):
    run = load_run(setup[name])
    folder, dense, index_dir, rest = _old_index(setup, run, tmp_path, monkeypatch)
    before = _scores(run, index_dir)
    for image in rest:  # two new images, and a third the dense file has no line for
        shutil.copy2(setup["images"] / image, folder / image)
    shutil.copy2(setup["images"] / rest[0], folder / "uncaptioned.png")

    with caplog.at_level(logging.INFO, logger="patchword.search.build_open"):
        report = build_index(run, folder, index_dir, update=True, **ARGS)
    # old code: the manifest kept the dense file, shard 00002 held dense tokens, uncaptioned.png was skipped
    assert (report.kept, report.added, report.num_images, report.skipped) == (6, 3, 9, [])
    manifest = Manifest.read(index_dir)
    assert manifest.dense is None and manifest.state == "complete"
    assert "dense_sha" not in json.loads((index_dir / "manifest.json").read_text())["entry_fields"]
    assert not list((index_dir / "shards").glob("*dense*"))  # the kept shards' dense files deleted too
    assert sorted(p.name for p in (index_dir / "shards").iterdir()) == [
        f"{shard:05d}.{array}.npy" for shard in range(3) for array in ("global", "tokens")
    ]
    lines = [r.getMessage() for r in caplog.records if "never reads at search time" in r.getMessage()]
    assert lines == [
        f"{index_dir} keeps the dense tokens of {dense.resolve()}, which the matcher ({RUNS[name][0][14:]}) "
        "never reads at search time: this update stops keeping it (the search results do not change)"
    ]
    after = _scores(run, index_dir)
    assert set(after) == set(before) | {(q, p) for q in QUERIES for p in [*rest, "uncaptioned.png"]}
    assert {key: after[key] for key in before} == pytest.approx(before, abs=1e-6)
    # a further update has nothing to drop and nothing to encode
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="patchword.search.build_open"):
        again = build_index(run, folder, index_dir, update=True, **ARGS)
    assert (again.kept, again.added) == (9, 0)
    assert not [r for r in caplog.records if "never reads at search time" in r.getMessage()]


def test_the_update_needs_no_dense_file_any_more(setup, tmp_path, monkeypatch, capsys):
    """Old code: ``index build --update`` failed ("was built with the dense captions of ..., which is
    missing: put it back, or build a new index") for a file no search reads."""
    run_dir = setup["vse"]
    folder, dense, index_dir, rest = _old_index(setup, load_run(run_dir), tmp_path, monkeypatch)
    dense.unlink()
    shutil.copy2(setup["images"] / rest[0], folder / rest[0])
    argv = ["index", "build", str(run_dir), "--images", str(folder), "--out", str(index_dir), "--update"]
    assert main(argv) == 0, capsys.readouterr().err
    manifest = Manifest.read(index_dir)
    assert manifest.dense is None and len(manifest.entries) == 7


def test_a_model_that_reads_the_index_dense_text_keeps_it(tmp_path, env):
    """Image-tied SEPS (the shared search run) reads the index's dense tokens: an update keeps them."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    names = sorted(p.name for p in env.export.files["images"].iterdir())
    for name in names[:4]:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    build_index(env.run, folder, tmp_path / "idx", dense=env.export.files["dense"], **ARGS)
    shutil.copy2(env.export.files["images"] / names[4], folder / names[4])
    report = build_index(env.run, folder, tmp_path / "idx", update=True, **ARGS)
    assert (report.kept, report.added) == (4, 1)
    assert Manifest.read(tmp_path / "idx").dense_store == "tokens"
    assert sorted(p.name for p in (tmp_path / "idx" / "shards").glob("*.dense.npy")) == [
        "00000.dense.npy",
        "00001.dense.npy",
    ]
