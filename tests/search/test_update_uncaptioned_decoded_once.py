"""An index with dense captions leaves out the images the dense file has no line for, after decoding each
(a damaged one is listed as damaged). That verdict used to be recorded without the file's size and mtime,
so every ``--update`` (and resumed build) decoded every uncaptioned image again: on a gallery of 1M images
of which 100k are captioned, 900k decodes that found nothing new."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from patchword.search import build_files
from patchword.search.index import build_index
from patchword.search.manifest import Manifest

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(seed: int, size: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _skipped(index_dir: Path) -> dict[str, tuple[str, bool, bool]]:
    """path -> (reason, uncaptioned, size recorded) of the manifest's skipped files."""
    return {s.path: (s.reason, s.uncaptioned, s.size is not None) for s in Manifest.read(index_dir).skipped}


def _count_decodes(monkeypatch) -> list[str]:
    """The names of the images the file choice decodes, from now on (the list fills as it decodes)."""
    decoded: list[str] = []
    real_load = build_files.load_image
    monkeypatch.setattr(
        build_files, "load_image", lambda path, **kw: decoded.append(Path(path).name) or real_load(path, **kw)
    )
    return decoded


def test_an_update_decodes_only_the_uncaptioned_images_that_changed(env, tmp_path, monkeypatch):
    folder = tmp_path / "imgs"
    folder.mkdir()
    names = sorted(p.name for p in env.export.files["images"].iterdir())[:5]
    for name in names:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    lines = {
        json.loads(line)["metadata"]["file"]: line
        for line in env.export.files["dense"].read_text().splitlines(keepends=True)
    }
    dense = tmp_path / "dense.jsonl"
    dense.write_text(lines[names[0]] + lines[names[1]])  # names[2:]: no dense caption
    out = tmp_path / "idx"
    build_index(env.run, folder, out, dense=dense)
    why = f"no dense caption in {dense.resolve()}"

    decoded = _count_decodes(monkeypatch)

    def update() -> list[str]:
        decoded.clear()
        build_index(env.run, folder, out, update=True)
        return sorted(decoded)

    # nothing changed: no uncaptioned image is decoded again (old code: all three), their verdict is kept
    assert update() == []
    assert _skipped(out) == {name: (why, True, True) for name in names[2:]}
    # one uncaptioned image changed (new bytes): that one is decoded again, and is still uncaptioned
    (folder / names[2]).write_bytes(_png(0, 40))
    assert update() == [names[2]]
    assert _skipped(out)[names[2]] == (why, True, True)
    # one damaged: found so once, then not decoded again until it changes (as any decode failure)
    (folder / names[3]).write_bytes(_png(1, 32)[:60])
    assert update() == [names[3]]
    reason, uncaptioned, recorded = _skipped(out)[names[3]]
    assert reason.startswith("cannot decode: ") and not uncaptioned and recorded
    assert update() == []
    assert _skipped(out)[names[3]][0] == reason
    # an image that gains a caption is indexed on the next update
    dense.write_text(lines[names[0]] + lines[names[1]] + lines[names[4]])
    assert update() == []
    manifest = Manifest.read(out)
    assert sorted(e.path for e in manifest.entries) == sorted([names[0], names[1], names[4]])
    assert sorted(s.path for s in manifest.skipped) == [names[2], names[3]]


def test_an_index_written_before_the_verdict_was_recorded_decodes_its_uncaptioned_images_once(
    env, tmp_path, monkeypatch
):
    """A manifest whose uncaptioned files carry no size, mtime or ``uncaptioned`` (an older patchword) still
    loads: its uncaptioned images are decoded once more, then remembered."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    names = sorted(p.name for p in env.export.files["images"].iterdir())[:3]
    for name in names:
        shutil.copy2(env.export.files["images"] / name, folder / name)
    line = next(
        line
        for line in env.export.files["dense"].read_text().splitlines(keepends=True)
        if json.loads(line)["metadata"]["file"] == names[0]
    )
    dense = tmp_path / "dense.jsonl"
    dense.write_text(line)
    out = tmp_path / "idx"
    build_index(env.run, folder, out, dense=dense)
    path = out / "manifest.json"
    payload = json.loads(path.read_text())
    payload["skipped"] = [{"path": s["path"], "reason": s["reason"]} for s in payload["skipped"]]
    path.write_text(json.dumps(payload))

    decoded = _count_decodes(monkeypatch)
    build_index(env.run, folder, out, update=True)
    assert sorted(decoded) == names[1:]
    decoded.clear()
    build_index(env.run, folder, out, update=True)
    assert decoded == []
    assert _skipped(out) == {
        name: (f"no dense caption in {dense.resolve()}", True, True) for name in names[1:]
    }
