"""File and folder names ``index build`` meets under ``--images``: a name that is not UTF-8 (old code: the
build stopped with "'utf-8' codec can't encode character '\\udcff' ... surrogates not allowed", naming no
file, and left the index ``state: building``), a symbolic link to a folder outside (old code: dropped
without a word), a name holding a newline (old code: printed raw, breaking the listing), a symbolic link loop
(old code: a RuntimeError traceback). Each is skipped and listed with its reason, as docs/search.md says."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import one_error_line
from patchword.cli.search import main_index, main_search
from patchword.search.manifest import Manifest
from patchword.search.scan import scan_images

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _write(path: Path | bytes, seed: int) -> None:
    with open(path, "wb") as fh:
        fh.write(_png(seed))


def _build(env, folder: Path, out: Path) -> int:
    return main_index(["build", str(env.run_dir), "--images", str(folder), "--out", str(out)])


def test_a_name_that_is_not_utf8_is_skipped_and_listed_and_the_build_completes(env, tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    _write(folder / "good.png", 0)
    _write(os.path.join(os.fsencode(folder), b"bad\xff.png"), 1)
    os.mkdir(os.path.join(os.fsencode(folder), b"dir\xfe"))
    _write(os.path.join(os.fsencode(folder), b"dir\xfe", b"inner.png"), 2)
    out = tmp_path / "idx"
    assert _build(env, folder, out) == 0
    printed = capsys.readouterr().out
    assert "1 images (1 encoded, 0 kept, 0 removed)" in printed
    assert "  bad\\xff.png: file name is not valid UTF-8: rename it\n" in printed
    assert "  dir\\xfe: folder name is not valid UTF-8: rename it (its files were not scanned)" in printed
    manifest = Manifest.read(out)
    assert manifest.state == "complete" and [e.path for e in manifest.entries] == ["good.png"]
    assert {(s.path, s.reason) for s in manifest.skipped} == {
        ("bad\\xff.png", "file name is not valid UTF-8: rename it"),
        ("dir\\xfe", "folder name is not valid UTF-8: rename it (its files were not scanned)"),
    }
    # an update over the same folder lists them again and keeps the index
    assert (
        main_index(["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--update"]) == 0
    )
    assert "bad\\xff.png: file name is not valid UTF-8" in capsys.readouterr().out


def test_an_image_folder_whose_path_is_not_utf8_is_refused_before_anything_is_written(env, tmp_path, capsys):
    folder = os.path.join(os.fsencode(tmp_path), b"imgs\xff")
    os.mkdir(folder)
    _write(os.path.join(folder, b"a.png"), 0)
    out = tmp_path / "idx"
    assert _build(env, Path(os.fsdecode(folder)), out) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line
        == f"error: --images: the folder's path {tmp_path.resolve()}/imgs\\xff is not valid UTF-8: rename it"
    )
    assert not out.exists()


def test_a_symbolic_link_to_a_folder_outside_is_listed_and_one_inside_is_scanned_under_its_own_path(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _write(outside / "o.png", 0)
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    _write(folder / "sub" / "s.png", 1)
    (folder / "out_link").symlink_to(outside, target_is_directory=True)
    (folder / "in_link").symlink_to("sub", target_is_directory=True)
    scan = scan_images(folder)
    assert [f.path for f in scan.images] == ["sub/s.png"]  # once, under its own path
    assert [(s.path, s.reason) for s in scan.skipped] == [
        ("out_link", "symbolic link to a folder outside the image folder")
    ]


def test_a_symbolic_link_loop_is_passed_over_not_a_traceback(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    _write(folder / "a.png", 0)
    (folder / "x.png").symlink_to("y.png")
    (folder / "y.png").symlink_to("x.png")
    scan = scan_images(folder)
    assert [f.path for f in scan.images] == ["a.png"] and scan.ignored == 2 and scan.skipped == []


def test_printable_escapes_what_would_break_or_disguise_a_line_and_keeps_the_rest():
    from patchword.search.scan import printable  # (new in this change: the other tests run on old code)

    assert printable("new\nline.png") == "new\\nline.png"
    assert printable("a\x1b[31mb\tc\x7f\x85.png") == "a\\x1b[31mb\\tc\\x7f\\x85.png"
    assert printable("ab\u202ecd.png") == "ab\\u202ecd.png"  # a right-to-left override
    assert printable("bad\udcff") == "bad\\udcff"
    assert printable("café 中 🙂 #?% .png") == "café 中 🙂 #?% .png"


def test_paths_with_a_newline_are_printed_escaped_in_text_and_exact_in_json(env, tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    _write(folder / "new\nline.png", 0)
    _write(folder / "good.png", 1)
    (folder / "cut\nshort.png").write_bytes(_png(2)[:50])  # skipped: it does not decode
    out = tmp_path / "idx"
    assert _build(env, folder, out) == 0
    printed = capsys.readouterr().out
    assert "  cut\\nshort.png: cannot decode: " in printed
    assert not any(line.startswith("short.png") for line in printed.splitlines())
    assert main_search([str(out), "a red circle", "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4  # header, two results, timings: the newline does not split a result
    assert sorted(line.split()[-1] for line in lines[1:3]) == ["good.png", "new\\nline.png"]
    assert main_search([str(out), "a red circle", "-k", "2", "--json"]) == 0
    paths = {r["path"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert paths == {"good.png", "new\nline.png"}
