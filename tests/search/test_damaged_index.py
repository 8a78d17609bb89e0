"""A damaged or hand-edited index, and builds that would leave an index of no image: each is one line naming
the manifest field, the shard file or the flag, never a traceback, a 500 or a ``NaN`` result."""

from __future__ import annotations

import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import one_error_line
from patchword.cli.search import main_index, main_search
from patchword.errors import DataError
from patchword.search.index import build_index
from patchword.search.manifest import Manifest
from patchword.search.query import Searcher
from patchword.search.store import SearchIndex
from search_support import caption_queries

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _index_copy(env, tmp_path: Path) -> Path:
    """A copy of the shared index (24 images in shards of 10, 10 and 4, dense tokens) to damage."""
    return Path(shutil.copytree(env.index_dir, tmp_path / "idx"))


def _edit_manifest(index_dir: Path, edit) -> None:
    path = index_dir / "manifest.json"
    payload = json.loads(path.read_text())
    edit(payload)
    path.write_text(json.dumps(payload))


def _update_args(env, index_dir: Path) -> list[str]:
    images = str(env.export.files["images"])
    return ["build", str(env.run_dir), "--images", images, "--out", str(index_dir), "--update"]


MANIFEST_EDITS = {
    "dtype": lambda p: p.update(dtype="float64"),
    "state": lambda p: p.update(state="done"),
    "shards[1]": lambda p: p["shards"][1].update(rows="10"),
    "entries[3]": lambda p: p["entries"][3].__setitem__(5, 99),  # a row its shard does not hold
    "model.embed_dim": lambda p: p["model"].pop("embed_dim"),
    "dense": lambda p: p["dense"].update(store="bytes"),
}


@pytest.mark.parametrize("field", list(MANIFEST_EDITS))
def test_a_manifest_field_the_readers_cannot_use_is_one_line_naming_it(env, tmp_path, capsys, field):
    """``"dtype": "float64"`` was an AttributeError traceback in every search (a 500 in the server), and an
    ``--update`` kept it; a row past its shard's end an IndexError."""
    index_dir = _index_copy(env, tmp_path)
    _edit_manifest(index_dir, MANIFEST_EDITS[field])
    manifest = index_dir / "manifest.json"
    with pytest.raises(DataError) as err:
        Manifest.read(index_dir)
    assert str(err.value).startswith(f"{manifest}: malformed index manifest: field '{field}' ")
    assert main_search([str(index_dir), "a red circle"]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"
    before = manifest.read_bytes()
    assert main_index(_update_args(env, index_dir)) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"
    assert manifest.read_bytes() == before


SHARD_DAMAGE = {
    "global rows": ("00001.global.npy", lambda a: a[:3]),
    "token rows": ("00001.tokens.npy", lambda a: a[:7]),
    "dense lengths rows": ("00001.dense_lens.npy", lambda a: a[:9]),
    "token width": ("00001.tokens.npy", lambda a: a[..., :-1]),
}


@pytest.mark.parametrize("damage", list(SHARD_DAMAGE))
def test_a_shard_array_of_another_shape_than_the_manifest_says_is_one_line_and_update_repairs_it(
    env, tmp_path, capsys, damage
):
    """A shard saved with fewer rows than the manifest lists was an IndexError traceback in search and
    serve, and ``--update`` kept it."""
    index_dir = _index_copy(env, tmp_path)
    tokens = SearchIndex.open(index_dir).image_tokens(np.arange(24)).clone()
    name, cut = SHARD_DAMAGE[damage]
    shard = index_dir / "shards" / name
    np.save(shard, cut(np.load(shard)))
    with pytest.raises(DataError) as err:
        SearchIndex.open(index_dir)
    assert str(err.value).startswith(f"{shard}: has shape ") and "--update" in str(err.value)
    assert "in the manifest needs (10," in str(err.value)
    captions, _ = caption_queries(env)
    assert main_search([str(index_dir), captions[0]]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {err.value}"
    assert main_index(_update_args(env, index_dir)) == 0
    assert "24 images (10 encoded, 14 kept, 0 removed)" in capsys.readouterr().out
    repaired = SearchIndex.open(index_dir)
    order = {e.path: i for i, e in enumerate(repaired.entries)}
    same = [order[e.path] for e in SearchIndex.open(env.index_dir).entries]
    torch.testing.assert_close(repaired.image_tokens(same), tokens, rtol=1e-5, atol=1e-5)
    assert main_search([str(index_dir), captions[0]]) == 0


def test_a_folder_whose_every_image_fails_to_decode_writes_no_index(env, tmp_path, capsys):
    """It wrote an index of no image and exited 0; every search of it then failed."""
    folder = tmp_path / "allbad"
    folder.mkdir()
    (folder / "b.png").write_bytes(_png(0)[:50])  # a PNG header the scan accepts, cut short
    out = tmp_path / "idx"
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out)]
    assert main_index(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: --images: no image under {folder.resolve()} can be indexed: 1 files were "
    )
    assert "(b.png: cannot decode: " in line and line.endswith("; nothing was written")
    assert not out.exists()
    # an empty --out directory is left empty: the corrected command builds there
    out.mkdir()
    assert main_index(args) == 2
    capsys.readouterr()
    assert [p.name for p in out.iterdir() if p.name != "shards"] == []
    (folder / "b.png").write_bytes(_png(0))
    assert main_index(args) == 0
    assert "1 images (1 encoded" in capsys.readouterr().out


def test_an_update_whose_every_new_image_fails_to_decode_keeps_the_index(env, tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(2):
        (folder / f"good{i}.png").write_bytes(_png(i))
    out = tmp_path / "idx"
    build_index(env.run, folder, out)
    before = (out / "manifest.json").read_bytes()
    for i in range(2):
        (folder / f"good{i}.png").unlink()
    (folder / "bad.png").write_bytes(_png(5)[:50])
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--update"]
    assert main_index(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "(bad.png: cannot decode: " in line and line.endswith(f"; {out} was left as it was")
    assert (out / "manifest.json").read_bytes() == before
    assert len(SearchIndex.open(out)) == 2


def test_dense_captions_of_no_indexed_image_are_refused_before_anything_is_written(env, tmp_path, capsys):
    """``--dense`` naming none of the folder's images wrote an empty index and exited 0."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(2):
        (folder / f"other{i}.png").write_bytes(_png(i))
    out = tmp_path / "idx"
    dense = env.export.files["dense"]
    args = ["build", str(env.run_dir), "--images", str(folder), "--out", str(out), "--dense", str(dense)]
    assert main_index(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --dense: no image under {folder.resolve()} can be indexed: 2 files were ")
    assert f"other0.png: no dense caption in {dense.resolve()}" in line
    assert not out.exists()


@pytest.mark.parametrize("array", ["tokens", "global"])
def test_stored_vectors_with_nan_are_refused_not_ranked_first(env, tmp_path, capsys, caplog, array):
    """A token shard whose last bytes were overwritten with 0xff ranked its image first with score nan,
    and ``--json`` printed ``"score": NaN`` (not JSON); a global row of NaN left its image out of every
    result without a word."""
    from fastapi.testclient import TestClient

    from patchword.serve.app import create_app

    index_dir = _index_copy(env, tmp_path)
    shard = index_dir / "shards" / f"00002.{array}.npy"
    data = bytearray(shard.read_bytes())
    data[-20:] = b"\xff" * 20
    shard.write_bytes(bytes(data))
    damaged = SearchIndex.open(index_dir).entries[23].path  # the last row of the last shard
    message = f"{shard}: holds non-finite values (image {damaged} cannot be scored): delete it and repair"
    captions, _ = caption_queries(env)
    for extra in (["--json"], []):
        assert main_search([str(index_dir), captions[0], *extra]) == 2
        captured = capsys.readouterr()
        assert one_error_line(captured.err).startswith(f"error: {message}")
        assert "NaN" not in captured.out
    if array == "global":  # found when the first stage is built: the server does not start
        with pytest.raises(DataError, match=str(shard)):
            Searcher(SearchIndex.open(index_dir), env.run)
        return
    searcher = Searcher(SearchIndex.open(index_dir), env.run)
    with pytest.raises(DataError, match=str(shard)):
        searcher.explain(captions[0], 23)
    caplog.clear()
    with (
        caplog.at_level(logging.ERROR, logger="patchword.serve.app"),
        TestClient(create_app(searcher), raise_server_exceptions=False) as client,
    ):
        response = client.get("/api/search", params={"q": captions[0]})
        explained = client.get("/api/explain", params={"q": captions[0], "id": 23})
    for answer in (response, explained):
        assert answer.status_code == 500 and "index is damaged" in answer.json()["error"]
        assert str(shard) not in answer.text  # the server's paths stay in its log
    logged = [r for r in caplog.records if str(shard) in r.getMessage()]
    assert len(logged) == 2 and all(r.exc_info is None for r in logged)
    # the file deleted, --update encodes its images again
    shard.unlink()
    assert main_index(_update_args(env, index_dir)) == 0
    assert "24 images (4 encoded, 20 kept, 0 removed)" in capsys.readouterr().out
    assert main_search([str(index_dir), captions[0], "--json"]) == 0


def test_nan_in_an_array_the_engine_checks_names_the_file_too(env, tmp_path, capsys):
    """The engines that check their inputs' values (here the patch priors of a pruned index) refused a
    damaged row with a ValueError naming no file ("patch_prior contains 1 non-finite value(s)")."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        (folder / f"im{i}.png").write_bytes(_png(i))
    out = tmp_path / "pruned"
    build_index(env.run, folder, out, keep_patches=0.75)
    prior = out / "shards" / "00000.patch_prior.npy"
    values = np.load(prior)
    values[2, 0] = np.nan
    np.save(prior, values)
    captions, _ = caption_queries(env)
    assert main_search([str(out), captions[0]]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: {prior}: holds non-finite values (image im2.png cannot be scored): delete it and repair"
    )


def test_collection_without_qdrant_is_refused(env, tmp_path, capsys):
    """``--collection`` was silently ignored without ``--qdrant``: no upload, exit 0."""
    out = tmp_path / "idx"
    images = str(env.export.files["images"])
    args = ["build", str(env.run_dir), "--images", images, "--out", str(out), "--collection", "foo"]
    assert main_index(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --collection: ") and "--qdrant" in line
    assert not out.exists()


def test_opening_an_index_maps_each_shard_array_once_and_names_a_damaged_one(env, tmp_path, monkeypatch):
    """Defect: every shard array was opened and checked twice when an index opened (npy_problem's header
    and size check, then the map's same check). npy_problem now only words the refusal of the map, the
    texts unchanged; a file deleted before it reads one still reads as missing."""
    import patchword.search.store as store
    from patchword.search.store import MissingShardError

    checked: list[Path] = []
    problem = store.npy_problem
    monkeypatch.setattr(store, "npy_problem", lambda file: checked.append(file) or problem(file))
    SearchIndex.open(env.index_dir)
    assert checked == []
    index_dir = _index_copy(env, tmp_path)
    shard = index_dir / "shards" / "00001.tokens.npy"
    shard.write_bytes(b"\x80\x04K\x01.")  # a pickle
    with pytest.raises(DataError) as err:
        SearchIndex.open(index_dir)
    assert str(err.value).startswith(f"{shard}: not a .npy array file: it holds a Python pickle; repair ")
    assert checked == [shard]
    shard.write_bytes(np.lib.format.magic(1, 0) + b"\x00")  # cut short in its header
    with pytest.raises(DataError, match=r": unreadable \.npy header \("):
        SearchIndex.open(index_dir)

    mapped = store.ShardArray

    def deleted_then_refused(file):
        if file != shard:
            return mapped(file)
        file.unlink()  # after the map refused it (it was there), before npy_problem reads it
        raise ValueError("gone")

    monkeypatch.setattr(store, "ShardArray", deleted_then_refused)
    with pytest.raises(MissingShardError, match=f"shard file {shard.name} is missing"):
        SearchIndex.open(index_dir)
