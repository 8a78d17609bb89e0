"""Index build / update / resume: images found by content, bad files skipped and listed, atomic shards,
an interrupted build finishing as an uninterrupted one, and an index refused to another model."""

from __future__ import annotations

import filecmp
import io
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from patchword.cli.search import main_index
from patchword.errors import DataError, RunExistsError
from patchword.runs import load_run
from patchword.search import encode as encode_module
from patchword.search.index import IndexMismatchError, build_index
from patchword.search.manifest import Manifest
from patchword.search.query import Searcher
from patchword.search.scan import scan_images
from patchword.search.store import SearchIndex
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

    def flaky_load(path, **options):
        if Path(path).name == "no_extension":
            raise ValueError(f"cannot read image {path}: broken data stream")
        return real_load(path, **options)

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
    monkeypatch.setattr(
        encode_module, "load_image", lambda path, **options: calls.append(path) or real_load(path, **options)
    )
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
    resumed, whole = Manifest.read(tmp_path / "cut"), Manifest.read(tmp_path / "whole")
    assert resumed == whole and resumed.build_id == partial.build_id != whole.build_id  # its own, kept
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
    # the changed file is encoded again, not removed: removed counts the deleted one only
    assert (report.added, report.kept, report.changed, report.removed, report.num_images) == (2, 8, 1, 1, 10)
    assert "10 images (2 encoded (1 new, 1 changed), 8 kept, 1 removed) in " in report.summary()
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
    # IEEE round-to-nearest into float16 (11 significant bits) moves a value by at most 2^-11 of itself
    # (2^-25 absolute below float16's normal range): the same bound on every CPU.
    assert np.allclose(f16.astype(np.float32), f32, atol=2**-24, rtol=2**-11)
    s32, s16 = Searcher.open(tmp_path / "f32"), Searcher.open(tmp_path / "f16")
    query = env.export.files["caps"].read_text().splitlines()[0]
    a, b = s32.search(query, k=len(s32)), s16.search(query, k=5)
    # float16 tokens (each within 2^-11 of itself, checked above) move most scores by ~1e-5, but a patch at
    # the edge of SEPS's top-K selection can swap in or out, and the score then jumps. Measured on an AMD
    # EPYC (AVX-512), 2 cores: the TINY run of search_support.py trained with seed=0..11, each with torch's
    # default and with AVX2 kernels (ATEN_CPU_CAPABILITY=avx2: other weights), both indexes built and every
    # one of the 120 test captions searched with k=len(index). Over the 24 models' 14,400 top-5 hits the
    # largest |float32 score - float16 score| was 3.9e-3 (median per model ~1e-5; 0.04% of all 69,120
    # scores above 1e-3, the largest 6.5e-3). The trained weights, hence those near-ties, depend on the CPU,
    # so the tolerance is 3x the largest top-5 error: 1.2e-2. The top image may then trade places only
    # with one scoring within 2 x 1.2e-2 in float32 (each of the two scores moved by at most that much).
    score_tolerance = 1.2e-2
    f32_scores = {h.id: h.score for h in a.hits}
    assert f32_scores[b.hits[0].id] >= a.hits[0].score - 2 * score_tolerance
    assert np.allclose(
        [f32_scores[h.id] for h in b.hits], [h.score for h in b.hits], atol=score_tolerance, rtol=0
    )


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
    from patchword.cli.search import main_search

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


# ------------------------------------------------------------------------ checks before anything is written


def _refused_then_corrected(capsys, out: Path, bad: list[tuple[list[str], str, tuple[str, ...]]], good):
    """Each bad command (argv, the start of its error line, modules made unimportable) exits with 2 and one
    line, leaving ``out`` as it was (absent, or the same bytes); then the corrected command ``good``
    builds the index."""
    from conftest import one_error_line

    before = out.read_bytes() if out.is_file() else None
    for argv, expected, blocked in bad:
        with pytest.MonkeyPatch.context() as patch:
            for module in blocked:
                patch.setitem(sys.modules, module, None)  # what `import module` does when it is not installed
            assert main_index(argv) == 2, argv
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {expected}"), (argv, line)
        if before is None:
            assert not out.exists(), (argv, sorted(out.rglob("*")))
        else:
            assert out.read_bytes() == before, argv
    assert main_index(good) == 0, good
    capsys.readouterr()


@pytest.mark.parametrize("kind", ["files", "numbers", "stores and extras"])
def test_index_build_checks_every_flag_and_file_before_writing_and_the_corrected_command_works(
    env, tmp_path, capsys, kind
):
    """A bad flag or file used to be found after the manifest was written (``--dense nope.jsonl``,
    ``--workers -1``, ``--store pq`` without FAISS: the manifest pinned the typo and the corrected command
    was refused), or after the whole build (``--qdrant`` without qdrant-client), or named another flag
    (``--shard-size 0`` blamed ``--batch-size``). Now each one is refused with one line naming its flag or
    file before anything is written, and the corrected command then builds the index."""
    folder = tmp_path / "imgs"
    _copy_images(env, folder, 3)
    out = tmp_path / "idx"
    dense = env.export.files["dense"]

    def build(*extra, run=env.run_dir, to=out) -> list[str]:
        return ["build", str(run), "--images", str(folder), "--out", str(to), *map(str, extra)]

    if kind == "files":
        (tmp_path / "bad.jsonl").write_text(
            '{"text": "a circle", "metadata": {"file": "x.png"}}\n{not json\n'
        )
        (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "caf\xe9", "metadata": {"file": "x.png"}}\n')
        (tmp_path / "a_file").write_text("not a folder")
        run = shutil.copytree(env.run_dir, tmp_path / "run")
        (run / "cut.pt").write_bytes((run / "best.pt").read_bytes()[:300])
        nope, cut = tmp_path / "nope.jsonl", run / "cut.pt"
        bad = [
            (build("--dense", nope), f"--dense: dense caption file not found: {nope}", ()),
            (build("--dense", folder), f"--dense: {folder} is a directory, not a dense caption file", ()),
            (
                build("--dense", tmp_path / "bad.jsonl"),
                f"--dense: {tmp_path / 'bad.jsonl'}:2: malformed JSON",
                (),
            ),
            (
                build("--dense", tmp_path / "latin1.jsonl"),
                f"--dense: {tmp_path / 'latin1.jsonl'}:1: not UTF-8",
                (),
            ),
            (
                build("--images", tmp_path / "missing"),
                f"--images: image folder not found: {tmp_path / 'missing'}",
                (),
            ),
            (
                build("--images", tmp_path / "a_file"),
                f"--images: {tmp_path / 'a_file'} is a file, not a folder",
                (),
            ),
            (
                build(to=tmp_path / "a_file" / "idx"),
                f"--out: {tmp_path / 'a_file'} is a file: {tmp_path / 'a_file' / 'idx'} cannot be created",
                (),
            ),
            (build(run=tmp_path / "no_run"), f"run directory {tmp_path / 'no_run'} does not exist", ()),
            (build("--checkpoint", cut, run=run), f"{cut}: not a readable patchword checkpoint", ()),
        ]
        _refused_then_corrected(capsys, out, bad, build("--dense", dense))
        # --out naming a file: refused, the file kept as it was
        bad = [
            (
                build(to=tmp_path / "a_file"),
                f"--out {tmp_path / 'a_file'} exists and is not a search index",
                (),
            )
        ]
        _refused_then_corrected(capsys, tmp_path / "a_file", bad, build(to=tmp_path / "idx2"))
        assert Manifest.read(out).dense["file"] == str(dense.resolve())
    elif kind == "numbers":
        bad = [
            (build("--workers", -1), "--workers: must be 0 (the default: min(4, CPUs)) or more, got -1", ()),
            (build("--batch-size", 0), "--batch-size: must be at least 1, got 0", ()),
            (build("--shard-size", 0), "--shard-size: must be at least 1, got 0", ()),
            (build("--pq-bytes", 4), "--pq-bytes: sets the pq store's bytes per token: give --store pq", ()),
            (build("--store", "pq", "--pq-bytes", 5), "--pq-bytes: 5 sub-quantisers do not divide", ()),
            (build("--keep-patches", 0), "--keep-patches: must be a fraction in (0, 1], got 0.0", ()),
            (build("--keep-patches", 1.5), "--keep-patches: must be a fraction in (0, 1], got 1.5", ()),
        ]
        _refused_then_corrected(
            capsys, out, bad, build("--workers", 1, "--shard-size", 2, "--keep-patches", 0.75)
        )
        manifest = Manifest.read(out)
        assert [s["rows"] for s in manifest.shards] == [2, 1] and manifest.pruning["kept"] == 12
    else:
        bad = [
            (build("--store", "pq"), "--store pq trains FAISS's product quantiser: pip install", ("faiss",)),
            # 3 images of 17 tokens cannot train 256 centroids: refused before the first shard, not after
            (
                build("--store", "pq"),
                "--store: pq trains its quantiser on the first shard's tokens and needs",
                (),
            ),
            (build("--dense-store", "scores"), "--dense-store: scores are computed from dense captions", ()),
            (
                build("--qdrant", tmp_path / "q"),
                "--qdrant: the Qdrant backend needs qdrant-client",
                ("qdrant_client",),
            ),
            (build("--device", "tpu"), "--device: must be auto, cpu, cuda, cuda:N or mps, got 'tpu'", ()),
        ]
        _refused_then_corrected(capsys, out, bad, build("--store", "int8"))
        assert Manifest.read(out).dtype == "int8" and not (tmp_path / "q").exists()
    index = SearchIndex.open(out)
    assert sorted(e.path for e in index.entries) == sorted(p.name for p in folder.iterdir())


def test_a_refused_update_leaves_the_index_as_it_was(env, tmp_path, capsys):
    """``--update --workers -1``, or an update whose dense caption file was moved away, used to write the
    manifest as ``building`` before failing: the complete index could no longer be searched."""
    from conftest import one_error_line

    folder = tmp_path / "imgs"
    _copy_images(env, folder, 3)
    dense = tmp_path / "dense.jsonl"
    shutil.copy(env.export.files["dense"], dense)
    out = tmp_path / "idx"
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--dense", str(dense)]
    assert main_index(args) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    fourth = sorted(env.export.files["images"].iterdir())[3]  # a new image, with a dense caption
    shutil.copy2(fourth, folder / fourth.name)
    assert main_index([*args, "--update", "--workers", "-1"]) == 2
    assert one_error_line(capsys.readouterr().err).startswith("error: --workers: must be 0")
    dense.rename(tmp_path / "moved.jsonl")
    assert main_index(args[:-2] + ["--update"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {out} was built with the dense captions of {dense}, which is missing: put it back, or build "
        "a new index"
    )
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert len(SearchIndex.open(out)) == 3  # still complete: searchable
    (tmp_path / "moved.jsonl").rename(dense)
    assert main_index(args[:-2] + ["--update"]) == 0
    assert "4 images (1 encoded, 3 kept, 0 removed)" in capsys.readouterr().out


def test_a_build_stopped_before_its_first_shard_does_not_pin_its_settings(env, tmp_path, monkeypatch):
    """A first build that stored no image yet (killed, or failed on its first shard) left a manifest whose
    settings refused the next command ("stores float16 tokens; build a new index to change it")."""
    folder = tmp_path / "imgs"
    _copy_images(env, folder, 3)
    with killed_after_shards(monkeypatch, 0), pytest.raises(KeyboardInterrupt):
        build_index(env.run, folder, tmp_path / "idx", dtype="float16", dense=env.export.files["dense"])
    partial = Manifest.read(tmp_path / "idx")
    assert (partial.state, partial.shards, partial.dtype) == ("building", [], "float16")
    report = build_index(env.run, folder, tmp_path / "idx", dtype="int8")
    assert (report.resumed, report.added) == (False, 3)
    manifest = Manifest.read(tmp_path / "idx")
    assert (manifest.state, manifest.dtype, manifest.dense) == ("complete", "int8", None)
