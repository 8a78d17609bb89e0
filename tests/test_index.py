"""Index build / update / resume: images found by content, bad files skipped and listed, atomic shards,
an interrupted build finishing as an uninterrupted one, and an index refused to another model."""

from __future__ import annotations

import filecmp
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from patchword.errors import DataError, RunExistsError
from patchword.runs import load_run
from patchword.search import encode as encode_module
from patchword.search.cli import main_index
from patchword.search.index import IndexMismatchError, build_index
from patchword.search.query import Searcher
from patchword.search.scan import scan_images
from patchword.search.store import Manifest, SearchIndex
from search_support import killed_after_shards

pytestmark = pytest.mark.usefixtures("one_thread")


def _png_bytes(seed: int, size: int = 32) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _copy_images(env, dest: Path, count: int) -> list[str]:
    dest.mkdir(parents=True)
    names = sorted(p.name for p in env.export.files["images"].iterdir())[:count]
    for name in names:
        shutil.copy2(env.export.files["images"] / name, dest / name)
    return names


def _encoded_direct(run, path: Path) -> torch.Tensor:
    """(L_v, C) tokens of one file through the run's own preprocessing and encoder."""
    with torch.no_grad():
        return run.model.encode_images(run.preprocess_images([Image.open(path)]))[0]


@pytest.fixture
def messy_folder(tmp_path):
    """Good images in nested folders and without an extension, plus every kind of file to leave out."""
    root = tmp_path / "photos"
    (root / "trips" / "2024").mkdir(parents=True)
    (root / ".cache").mkdir()
    (root / "a.png").write_bytes(_png_bytes(0))
    (root / "trips" / "2024" / "b.PNG").write_bytes(_png_bytes(1))
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 24, 3), 90, dtype=np.uint8)).save(buf, format="JPEG")
    (root / "trips" / "no_extension").write_bytes(buf.getvalue())  # an image by content, not by name
    (root / "fake.jpg").write_text("this is not an image")  # looks like one by name: skipped and listed
    (root / "cut.jpg").write_bytes(buf.getvalue()[:40])  # a JPEG header cut short: skipped and listed
    (root / "notes.txt").write_text("holiday notes")  # not an image at all: ignored
    (root / ".hidden.png").write_bytes(_png_bytes(2))  # hidden: not scanned
    (root / ".cache" / "c.png").write_bytes(_png_bytes(3))
    outside = tmp_path / "secret.png"
    outside.write_bytes(_png_bytes(4))
    (root / "link.png").symlink_to(outside)  # leaves the folder: skipped and listed
    (root / "inside_link.png").symlink_to(root / "a.png")  # stays inside: indexed
    return root


def test_scan_finds_images_by_content_and_lists_what_it_leaves_out(messy_folder):
    scan = scan_images(messy_folder)
    assert [(f.path, f.format) for f in scan.images] == [
        ("a.png", "PNG"),
        ("inside_link.png", "PNG"),
        ("trips/2024/b.PNG", "PNG"),
        ("trips/no_extension", "JPEG"),
    ]
    skipped = {s.path: s.reason for s in scan.skipped}
    assert set(skipped) == {"fake.jpg", "cut.jpg", "link.png"}
    assert "unrecognised" in skipped["fake.jpg"] and "outside" in skipped["link.png"]
    assert scan.ignored == 1  # notes.txt
    stat = os.stat(messy_folder / "a.png")
    assert (scan.images[0].size, scan.images[0].mtime_ns) == (stat.st_size, stat.st_mtime_ns)


def test_build_stores_the_model_vectors_and_never_fails_on_bad_files(
    env, messy_folder, tmp_path, monkeypatch
):
    # A decompression bomb (here: any image above a lowered pixel limit) is refused at the header.
    big = messy_folder / "big.png"
    big.write_bytes(_png_bytes(5, size=64))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1500)
    # A file that passes the header check but fails to decode (read error, vanished file...).
    real_load = encode_module.load_image

    def flaky_load(path):
        if Path(path).name == "no_extension":
            raise ValueError(f"cannot read image {path}: broken data stream")
        return real_load(path)

    monkeypatch.setattr(encode_module, "load_image", flaky_load)
    report = build_index(env.run, messy_folder, tmp_path / "idx", batch_size=2)
    assert report.num_images == 3 and report.added == 3
    reasons = {s.path: s.reason for s in report.skipped}
    assert set(reasons) == {"fake.jpg", "cut.jpg", "link.png", "big.png", "trips/no_extension"}
    assert "broken data stream" in reasons["trips/no_extension"]
    assert "decompression bomb" in reasons["big.png"].lower()
    index = SearchIndex.open(tmp_path / "idx")
    assert [e.path for e in index.entries] == ["a.png", "inside_link.png", "trips/2024/b.PNG"]
    for i, entry in enumerate(index.entries):
        direct = _encoded_direct(env.run, messy_folder / entry.path)
        torch.testing.assert_close(index.image_tokens([i])[0], direct, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            index.global_embeddings()[i],
            env.run.model.matcher.global_image(direct[None])[0],
            rtol=1e-5,
            atol=1e-5,
        )
        stat = os.stat(messy_folder / entry.path)
        assert (entry.size, entry.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    # A file that failed to decode is not retried until it changes.
    calls = []
    monkeypatch.setattr(encode_module, "load_image", lambda path: calls.append(path) or real_load(path))
    again = build_index(env.run, messy_folder, tmp_path / "idx", update=True)
    assert calls == [] and again.added == 0 and again.kept == 3
    assert "trips/no_extension" in {s.path for s in again.skipped}


def test_an_interrupted_build_resumes_to_the_same_index(env, tmp_path, monkeypatch):
    images = env.export.files["images"]
    dense = env.export.files["dense"]
    build_index(env.run, images, tmp_path / "whole", dense=dense, shard_size=5, batch_size=4)

    # killed while writing the third shard
    with killed_after_shards(monkeypatch, 2), pytest.raises(KeyboardInterrupt):
        build_index(env.run, images, tmp_path / "cut", dense=dense, shard_size=5, batch_size=4)
    partial = Manifest.read(tmp_path / "cut")
    assert partial.state == "building" and len(partial.entries) == 10
    with pytest.raises(DataError, match="did not finish"):
        SearchIndex.open(tmp_path / "cut")
    report = build_index(env.run, images, tmp_path / "cut", dense=dense, shard_size=5, batch_size=4)
    assert report.resumed and (report.kept, report.added) == (10, env.export.num_images - 10)
    assert Manifest.read(tmp_path / "cut") == Manifest.read(tmp_path / "whole")
    whole_shards = sorted(p.name for p in (tmp_path / "whole" / "shards").iterdir())
    assert whole_shards == sorted(p.name for p in (tmp_path / "cut" / "shards").iterdir())
    for name in whole_shards:
        assert filecmp.cmp(
            tmp_path / "whole" / "shards" / name, tmp_path / "cut" / "shards" / name, shallow=False
        ), name


def test_update_encodes_only_new_and_changed_files_and_drops_deleted_ones(env, tmp_path, monkeypatch):
    folder = tmp_path / "imgs"
    names = _copy_images(env, folder, 10)
    index_dir = tmp_path / "idx"
    build_index(env.run, folder, index_dir, shard_size=4, batch_size=4)
    before = SearchIndex.open(index_dir)
    before_tokens = {e.path: before.image_tokens([i])[0].clone() for i, e in enumerate(before.entries)}
    del before

    (folder / names[0]).unlink()  # deleted
    (folder / names[1]).write_bytes(_png_bytes(7))  # changed (new content and size)
    (folder / "sub").mkdir()
    (folder / "sub" / "new.png").write_bytes(_png_bytes(8))  # new
    encoded = []
    real_encode = env.run.model.encode_images
    monkeypatch.setattr(
        env.run.model, "encode_images", lambda x: encoded.append(x.shape[0]) or real_encode(x)
    )
    with pytest.raises(RunExistsError, match="--update"):
        build_index(env.run, folder, index_dir)
    report = build_index(env.run, folder, index_dir, update=True, shard_size=4, batch_size=4)
    assert sum(encoded) == 2
    assert (report.added, report.kept, report.removed, report.num_images) == (2, 8, 2, 10)
    after = SearchIndex.open(index_dir)
    paths = [e.path for e in after.entries]
    assert sorted(paths) == sorted([*names[1:], "sub/new.png"])
    for i, path in enumerate(paths):
        if path in (names[1], "sub/new.png"):
            expected = _encoded_direct(env.run, folder / path)
            torch.testing.assert_close(after.image_tokens([i])[0], expected, rtol=1e-5, atol=1e-5)
        else:  # kept rows are the stored ones, bit for bit
            assert torch.equal(after.image_tokens([i])[0], before_tokens[path])

    # Deleting most files leaves mostly dead rows: the shards are compacted, vectors unchanged.
    for name in names[2:8]:
        (folder / name).unlink()
    kept_tokens = {e.path: after.image_tokens([i])[0].clone() for i, e in enumerate(after.entries)}
    del after
    report = build_index(env.run, folder, index_dir, update=True, shard_size=4)
    assert report.compacted and report.removed == 6 and report.num_images == 4
    compact = SearchIndex.open(index_dir)
    assert sum(s["rows"] for s in compact.manifest.shards) == 4
    assert len(list((index_dir / "shards").glob("*.tokens.npy"))) == len(compact.manifest.shards)
    for i, entry in enumerate(compact.entries):
        assert torch.equal(compact.image_tokens([i])[0], kept_tokens[entry.path])


def test_an_index_built_by_another_model_is_refused(env, tmp_path):
    folder = tmp_path / "imgs"
    _copy_images(env, folder, 3)
    build_index(env.run, folder, tmp_path / "idx")
    other = load_run(env.run_dir)
    with torch.no_grad():
        next(other.model.matcher.parameters()).add_(0.01)
    with pytest.raises(IndexMismatchError, match="built by another model"):
        build_index(other, folder, tmp_path / "idx", update=True)
    with pytest.raises(IndexMismatchError, match="built by another model"):
        Searcher(SearchIndex.open(tmp_path / "idx"), other)
    # The same weights loaded again are accepted.
    Searcher(SearchIndex.open(tmp_path / "idx"), load_run(env.run_dir))


def test_fp16_index_halves_the_tokens_and_keeps_the_ranking(env, tmp_path):
    images = env.export.files["images"]
    build_index(env.run, images, tmp_path / "f32", dense=env.export.files["dense"])
    build_index(env.run, images, tmp_path / "f16", dense=env.export.files["dense"], dtype="float16")
    f32 = np.load(tmp_path / "f32" / "shards" / "00000.tokens.npy", mmap_mode="r")
    f16 = np.load(tmp_path / "f16" / "shards" / "00000.tokens.npy", mmap_mode="r")
    assert f32.dtype == np.float32 and f16.dtype == np.float16
    assert np.allclose(f16.astype(np.float32), f32, atol=2e-3, rtol=2e-3)
    s32, s16 = Searcher.open(tmp_path / "f32"), Searcher.open(tmp_path / "f16")
    query = env.export.files["caps"].read_text().splitlines()[0]
    a, b = s32.search(query, k=len(s32)), s16.search(query, k=5)
    # float16 tokens move scores by up to ~1e-3: the top image may trade places with one scoring that close
    # (the trained weights, hence the near ties, depend on the CPU), never with a clearly worse one
    f32_scores = {h.id: h.score for h in a.hits}
    assert f32_scores[b.hits[0].id] >= a.hits[0].score - 1e-2
    assert np.allclose([f32_scores[h.id] for h in b.hits], [h.score for h in b.hits], atol=1e-2)


def test_index_cli_builds_updates_and_reports_errors(env, tmp_path, capsys):
    folder = tmp_path / "imgs"
    _copy_images(env, folder, 3)
    out = tmp_path / "idx"
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--batch-size", "2"]
    assert main_index(args) == 0
    assert "3 images (3 encoded, 0 kept, 0 removed)" in capsys.readouterr().out
    assert main_index(args) == 2
    assert "error:" in capsys.readouterr().err
    assert main_index([*args, "--update"]) == 0
    assert "3 images (0 encoded, 3 kept, 0 removed)" in capsys.readouterr().out
    (tmp_path / "notindex").mkdir()
    (tmp_path / "notindex" / "x.txt").write_text("mine")
    assert (
        main_index(["build", str(env.run_dir), "--images", str(folder), "--out", str(tmp_path / "notindex")])
        == 2
    )
    assert "not a search index" in capsys.readouterr().err


def test_truncated_images_are_skipped_and_listed_with_the_reason(env, tmp_path):
    """A file cut after its header used to be indexed half-decoded (grey-padded), with a log warning."""
    folder = tmp_path / "imgs"
    names = _copy_images(env, folder, 4)
    data = (folder / names[1]).read_bytes()
    (folder / names[1]).write_bytes(data[: int(len(data) * 0.6)])
    report = build_index(env.run, folder, tmp_path / "idx", batch_size=2)
    assert report.num_images == 3 and report.added == 3
    reasons = {s.path: s.reason for s in report.skipped}
    assert list(reasons) == [names[1]] and "truncated file" in reasons[names[1]]
    assert [(s.path, s.reason) for s in Manifest.read(tmp_path / "idx").skipped] == list(reasons.items())
    assert f"  {names[1]}: cannot decode: " in report.summary()
    assert [e.path for e in SearchIndex.open(tmp_path / "idx").entries] == [names[0], *names[2:]]


def test_a_folder_without_images_is_an_error_and_nothing_is_written(env, tmp_path, capsys):
    """It used to exit 0 with an empty index."""
    from conftest import one_error_line

    folder = tmp_path / "imgs"
    folder.mkdir()
    out = tmp_path / "idx"
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out)]
    assert main_index(args) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --images: no image to index under {folder.resolve()}: it holds no files (hidden ones are "
        "not scanned); nothing was written"
    )
    (folder / "notes.txt").write_text("not an image")
    (folder / "fake.jpg").write_text("not an image either")
    assert main_index(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "1 unreadable image files (fake.jpg: not a readable image" in line and "1 other files" in line
    assert not out.exists()
    # --update of an index whose folder lost every image refuses too, and keeps the index as it was.
    _copy_images(env, tmp_path / "some", 2)
    build_index(env.run, tmp_path / "some", out)
    before = (out / "manifest.json").read_bytes()
    for path in (tmp_path / "some").iterdir():
        path.unlink()
    assert (
        main_index(
            ["build", str(env.run_dir), "--images", str(tmp_path / "some"), "--out", str(out), "--update"]
        )
        == 2
    )
    assert "no image to index" in one_error_line(capsys.readouterr().err)
    assert (out / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_a_damaged_shard_names_the_file_and_update_repairs_it(env, tmp_path, capsys, damage):
    """A truncated shard said only "mmap length is greater than file size"."""
    from conftest import one_error_line
    from patchword.search.cli import main_search

    folder = tmp_path / "imgs"
    _copy_images(env, folder, 5)
    index_dir = tmp_path / "idx"
    build_index(env.run, folder, index_dir, shard_size=3, batch_size=3)
    before = SearchIndex.open(index_dir)
    tokens = before.image_tokens(np.arange(5)).clone()
    del before
    shard = index_dir / "shards" / "00001.tokens.npy"
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-100])
        problem = "truncated: "
    else:
        shard.write_text("0.1 0.2 0.3\n")
        problem = "not a .npy array file: it holds text"
    with pytest.raises(DataError) as err:
        SearchIndex.open(index_dir)
    assert str(err.value).startswith(f"{shard}: {problem}") and "--update" in str(err.value)
    assert "pickled" not in str(err.value)
    assert main_search([str(index_dir), "a red circle"]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"
    report = build_index(env.run, folder, index_dir, update=True, shard_size=3, batch_size=3)
    assert (report.kept, report.added, report.num_images) == (3, 2, 5)
    repaired = SearchIndex.open(index_dir)
    order = np.argsort([e.path for e in repaired.entries])
    torch.testing.assert_close(repaired.image_tokens(order), tokens, rtol=1e-5, atol=1e-5)
