"""Two indexes given one Qdrant collection (by default the --out folder's name): the collection records
which index it holds, and neither index searches the other's points.

Old code: `index build ... --out p1/photos --qdrant S`, then `... --out p2/photos --qdrant S` (same file
names, other pixels) replaced p1's collection without a word, and `search p1/photos --qdrant` exited 0
printing p2's ranking under p1's paths (open checked the point count and each hit's path only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli import main
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")

qdrant = pytest.importorskip("patchword.search.qdrant")
qdrant_client = pytest.importorskip("qdrant_client")


def _two_folders(env, tmp_path: Path) -> tuple[Path, Path]:
    """The exported images, and a folder of the same file names holding other pixels (each name holds the
    next name's image)."""
    imgs, imgs_b = tmp_path / "imgs", tmp_path / "imgsB"
    shutil.copytree(env.export.files["images"], imgs)
    imgs_b.mkdir()
    names = sorted(p.name for p in imgs.iterdir())
    for name, other in zip(names, names[1:] + names[:1], strict=True):
        shutil.copyfile(imgs / other, imgs_b / name)
    return imgs, imgs_b


def _build(env, images: Path, out: Path, *extra: str) -> list[str]:
    return [
        "index", "build", str(env.run_dir), "--images", str(images), "--out", str(out),
        "--dense", str(env.export.files["dense"]), "--shard-size", "10", *extra,
    ]  # fmt: skip


def _hits(searcher: Searcher, caption: str) -> list[tuple[int, str]]:
    return [(h.id, h.path) for h in searcher.search(caption, k=5).hits]


def test_a_build_into_another_index_s_collection_is_refused(env, tmp_path, capsys):
    imgs, imgs_b = _two_folders(env, tmp_path)
    p1, p2, store = tmp_path / "p1" / "photos", tmp_path / "p2" / "photos", tmp_path / "qstore3"
    assert main(_build(env, imgs, p1, "--qdrant", str(store))) == 0
    capsys.readouterr()
    assert main(_build(env, imgs_b, p2, "--qdrant", str(store))) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: --collection: Qdrant collection 'photos' at {store} holds the index {p1} "
    )
    assert "give --collection NAME" in line and "--replace-collection" in line
    assert not (p2 / "manifest.json").exists()  # refused before anything was written
    captions, _ = caption_queries(env)
    assert main(["search", str(p1), captions[0], "--qdrant", "-k", "3"]) == 0  # p1 untouched
    # its own update, and another collection for the second index, are not refused
    assert main(_build(env, imgs, p1, "--update", "--qdrant", str(store))) == 0
    assert main(_build(env, imgs_b, p2, "--qdrant", str(store), "--collection", "photos2")) == 0
    # replacing it on purpose: the CLI's --replace-collection (needs --qdrant), the library's replace=True
    assert main(_build(env, imgs_b, p2, "--update", "--replace-collection")) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --replace-collection: applies to the")
    assert main(_build(env, imgs_b, p2, "--update", "--qdrant", str(store), "--replace-collection")) == 0
    assert json.loads((p2 / qdrant.QDRANT_FILE).read_text())["collection"] == "photos"
    assert main(["search", str(p1), captions[0], "--qdrant", "-k", "3"]) == 2  # p1's collection is gone
    qdrant.upload_index(p1, str(store), "photos", replace=True)
    assert json.loads((p1 / qdrant.QDRANT_FILE).read_text())["collection"] == "photos"


def test_a_collection_another_index_overwrote_is_refused_naming_that_index(env, tmp_path, capsys):
    imgs, imgs_b = _two_folders(env, tmp_path)
    p1, p2, store = tmp_path / "p1" / "photos", tmp_path / "p2" / "photos", tmp_path / "qstore3"
    assert main(_build(env, imgs, p1, "--qdrant", str(store))) == 0
    assert main(_build(env, imgs_b, p2)) == 0
    # p2 written into p1's collection (what `--replace-collection` does, and what old code did)
    client = qdrant.connect(str(store))
    record = qdrant._upload(SearchIndex.open(p2), client, qdrant_client.models, str(store), "photos", 64)
    client.close()
    (p2 / qdrant.QDRANT_FILE).write_text(json.dumps(record))
    captions, _ = caption_queries(env)
    capsys.readouterr()
    assert main(["search", str(p1), captions[0], "--qdrant"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {p1}: Qdrant collection 'photos' at {store} holds the index {p2}, ")
    assert f"--out {p1} --update --qdrant {store} --collection NAME`" in line
    assert main(["search", str(p2), captions[0], "--qdrant", "-k", "3"]) == 0  # the owner is served
    # the fix the error names: p1 in a collection of its own, searched as the local index
    assert main(_build(env, imgs, p1, "--update", "--qdrant", str(store), "--collection", "p1photos")) == 0
    remote = Searcher.open(p1, qdrant=True)
    local = Searcher.open(p1)
    assert _hits(remote, captions[0]) == _hits(local, captions[0])
    remote.index.client.close()


def test_an_upload_without_a_marker_is_read_and_replaced_as_before(env, tmp_path):
    """A collection uploaded before markers were written (no marker point, no ``marked`` in the record):
    open checks its point count as before, and any build may replace it (its owner cannot be told)."""
    imgs, imgs_b = _two_folders(env, tmp_path)
    p1, p2, store = tmp_path / "p1" / "photos", tmp_path / "p2" / "photos", tmp_path / "store"
    assert main(_build(env, imgs, p1, "--qdrant", str(store))) == 0
    record = json.loads((p1 / qdrant.QDRANT_FILE).read_text())
    record.pop("marked")
    (p1 / qdrant.QDRANT_FILE).write_text(json.dumps(record))
    client = qdrant.connect(str(store))
    client.delete("photos", points_selector=qdrant_client.models.PointIdsList(points=[qdrant.MARKER_ID]))
    client.close()
    captions, _ = caption_queries(env)
    remote = Searcher.open(p1, qdrant=True)
    assert _hits(remote, captions[0]) == _hits(Searcher.open(p1), captions[0])
    remote.index.client.close()
    assert main(_build(env, imgs_b, p2, "--qdrant", str(store))) == 0
