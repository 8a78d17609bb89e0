"""``patchword bench gallery``: the memory-mapped matrix scored block by block equals one ``score_matrix``
call, a shape past the time budget is extrapolated and says so, the JSON has the shape ``patchword report``
reads, and bad flags are one error line before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import one_error_line
from patchword.bench import format_gallery, run_gallery
from patchword.bench.gallery import (
    CAPTIONS_PER_IMAGE,
    GALLERY_SHAPES,
    GalleryTokens,
    matrix_path,
    partial_path,
)
from patchword.bench.inputs import SCORING_CONFIGS, build_bench_matcher
from patchword.cli.bench import main as bench_main
from patchword.eval import score_matrix

TOP_KEYS = {"kind", "config", "device", "machine", "max_memory_mb", "rows", "command", "time"}
ROW_KEYS = {
    "shape",
    "images",
    "captions",
    "pairs",
    "pairs_scored",
    "seconds",
    "pairs_per_s",
    "peak_host_mb",
    "peak_host_scope",
    "peak_device_mb",
    "extrapolated",
    "matrix_file",
}
# Blocks that do not divide the quick shape (20 x 100): ragged last blocks in both directions.
BLOCKS = {"block_images": 8, "block_captions": 35}


def _one_call(config: str, n_img: int) -> torch.Tensor:
    """The quick gallery's matrix from one score_matrix call over all of its inputs."""
    tokens = GalleryTokens(n_img)
    spec = SCORING_CONFIGS[config]
    caps, lens = tokens.captions(0, tokens.n_captions)
    dense, dlens = tokens.dense(0, n_img) if spec["dense"] else (None, None)
    caption_tied = spec["dense_pairing"] == "caption"
    t2i = torch.arange(tokens.n_captions) // CAPTIONS_PER_IMAGE if caption_tied else None
    matcher = build_bench_matcher(config)
    return score_matrix(matcher, tokens.images(0, n_img), caps, lens, dense, dlens, txt2img=t2i)


def _read_matrix(folder, shape: str, path=matrix_path) -> np.ndarray:
    n_img = GALLERY_SHAPES[shape]
    return np.fromfile(path(folder, shape), dtype=np.float32).reshape(n_img, -1)


def test_gallery_tokens_do_not_depend_on_the_tiling():
    tokens = GalleryTokens(150)  # units of 64 rows: ranges that cut through them
    whole, lens = tokens.captions(0, 750)
    part, part_lens = tokens.captions(70, 200)
    assert torch.equal(part_lens, lens[70:200])
    for row, length in enumerate(part_lens.tolist()):
        assert torch.equal(part[row, :length], whole[70 + row, :length])
    assert torch.equal(tokens.images(100, 130), tokens.images(0, 150)[100:130])
    dense, dlens = tokens.dense(60, 70)
    assert dense.shape[1] == int(dlens.max()) and dense.shape[0] == 10


# Image-tied dense text (the default), caption-tied (dense rows of the caption block's images), none.
@pytest.mark.parametrize("config", ["seps-code-image", "seps-code-caption", "laps"])
def test_memory_mapped_matrix_equals_one_score_matrix_call(tmp_path, config):
    result = run_gallery(shapes=["quick"], config=config, workdir=tmp_path, keep=True, **BLOCKS)
    (row,) = result["rows"]
    assert not row["extrapolated"] and row["pairs_scored"] == row["pairs"] == 20 * 100
    assert (
        row["matrix_file"] == str(matrix_path(tmp_path, "quick"))
        and not partial_path(tmp_path, "quick").exists()
    )
    matrix = _read_matrix(tmp_path, "quick")
    assert matrix.shape == (20, 100)
    np.testing.assert_allclose(matrix, _one_call(config, 20).numpy(), rtol=0, atol=1e-5)


def test_a_shape_past_the_time_budget_is_extrapolated_from_its_first_block(tmp_path):
    result = run_gallery(shapes=["quick"], workdir=tmp_path, keep=True, max_seconds=1e-6, **BLOCKS)
    (row,) = result["rows"]
    first_block = BLOCKS["block_images"] * BLOCKS["block_captions"]
    assert row["extrapolated"] and row["pairs_scored"] == first_block < row["pairs"]
    assert row["seconds"] == pytest.approx(row["pairs"] / row["pairs_per_s"])
    table = format_gallery(result)
    assert f"extrapolated from {first_block:,} pairs" in table
    # the file kept is named as partial (the complete matrix's name was on a file 2000 - 280 entries zero),
    # and the output says it is incomplete
    partial = partial_path(tmp_path, "quick")
    assert sorted(tmp_path.iterdir()) == [partial] and row["matrix_file"] == str(partial)
    assert table.endswith(f"Kept: {partial} (incomplete: 280 of 2,000 pairs scored, the rest zero)")
    # the block it scored is real, the rest of the file was never written
    matrix = _read_matrix(tmp_path, "quick", partial_path)
    expected = _one_call("seps-code-image", 20).numpy()
    np.testing.assert_allclose(matrix[:8, :35], expected[:8, :35], rtol=0, atol=1e-5)
    assert not matrix[8:].any() and not matrix[:, 35:].any()


def test_the_clock_decides_when_to_stop(tmp_path):
    """Every reading of a fake clock is 5 s later: after the first of the quick shape's 9 blocks (15 s
    from the start of the shape), the 8 blocks left are predicted to end far past a 35 s budget."""
    ticks = iter(range(0, 10_000, 5))
    result = run_gallery(
        shapes=["quick"], workdir=tmp_path, max_seconds=35, clock=lambda: next(ticks), **BLOCKS
    )
    (row,) = result["rows"]
    assert row["extrapolated"] and 0 < row["pairs_scored"] < row["pairs"]
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


def test_json_has_the_report_shape_and_round_trips(tmp_path):
    result = run_gallery(shapes=["quick", "quick"], workdir=tmp_path, command="patchword bench gallery x")
    assert set(result) == TOP_KEYS and result["kind"] == "gallery"
    assert result["config"] == "seps-code-image" and result["device"] == "cpu"
    assert result["max_memory_mb"] == 1024 and result["command"] == "patchword bench gallery x"
    assert {"cpu", "torch", "torch_threads"} <= set(result["machine"])
    for row in result["rows"]:
        assert set(row) == ROW_KEYS
        assert (row["images"], row["captions"], row["pairs"]) == (20, 100, 2000)
        assert row["seconds"] > 0 and row["pairs_per_s"] > 0 and row["peak_host_mb"] > 0
        assert row["peak_device_mb"] is None and row["extrapolated"] is False
        assert row["matrix_file"] is None  # not kept
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_cli_smoke_writes_the_table_and_the_json(tmp_path, capsys):
    from patchword.cli import main

    out = tmp_path / "gallery.json"
    assert main(["bench", "gallery", "--quick", "--threads", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result) == TOP_KEYS and [r["shape"] for r in result["rows"]] == ["quick"]
    assert set(result["rows"][0]) == ROW_KEYS and not result["rows"][0]["extrapolated"]
    assert result["command"].startswith("patchword bench gallery --quick")
    assert "| quick | 20 | 100 | 2,000 |" in table and "extrapolated" not in table and "Kept" not in table


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--shapes", "1k,2k"], "--shapes: unknown shape(s) ['2k']"),
        (["--max-seconds", "0"], "--max-seconds: must be > 0"),
        (["--max-seconds", "-5"], "--max-seconds: must be > 0"),
        (["--device", "cuda:99"], "--device: cuda:99 requested"),
        (["--config", "seps-nope"], "--config: unknown config 'seps-nope'"),
        (["--keep"], "--keep: needs --workdir"),
        (["--workdir", "{tmp}/missing"], "does not exist"),
        (["--json", "{tmp}/exists.json"], "exists; pass --force"),
        (["--json", "{tmp}/missing/out.json"], "does not exist"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, flags, expected):
    import patchword.bench.gallery as gallery

    def no_work(*args, **kwargs):
        raise AssertionError("scoring started")

    monkeypatch.setattr(gallery, "build_bench_matcher", no_work)
    (tmp_path / "exists.json").write_text("{}")
    before = sorted(tmp_path.rglob("*"))
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    assert bench_main(["gallery", "--quick", *flags]) == 2
    assert expected in one_error_line(capsys.readouterr().err)
    assert sorted(tmp_path.rglob("*")) == before and (tmp_path / "exists.json").read_text() == "{}"


def test_a_shape_cut_short_never_has_the_name_of_a_complete_matrix(tmp_path, monkeypatch):
    """A kill mid-shape (here: an error after the first block) left ``gallery-quick-20x100.f32`` with most
    of it zero; the file is ``.partial`` until every block is scored."""
    import patchword.bench.gallery as gallery

    real, blocks = gallery._score_block, []

    def killed_after_one_block(job, images, captions, out):
        if len(blocks) == 2:  # the warm-up call, then the first block of the shape
            raise KeyboardInterrupt
        blocks.append(out.shape)
        real(job, images, captions, out)

    monkeypatch.setattr(gallery, "_score_block", killed_after_one_block)
    with pytest.raises(KeyboardInterrupt):
        run_gallery(shapes=["quick"], workdir=tmp_path, keep=True, **BLOCKS)
    assert sorted(tmp_path.iterdir()) == [partial_path(tmp_path, "quick")]


def test_force_replaces_a_complete_matrix_only_with_a_complete_one(tmp_path):
    """An extrapolated shape with --force used to overwrite a complete matrix with a mostly-zero one."""
    run_gallery(shapes=["quick"], workdir=tmp_path, keep=True, **BLOCKS)
    complete = matrix_path(tmp_path, "quick").read_bytes()
    result = run_gallery(
        shapes=["quick"], workdir=tmp_path, keep=True, overwrite=True, max_seconds=1e-6, **BLOCKS
    )
    assert result["rows"][0]["extrapolated"]
    assert matrix_path(tmp_path, "quick").read_bytes() == complete
    assert partial_path(tmp_path, "quick").is_file()


def test_the_table_marks_a_process_peak_and_shows_a_missing_one_as_a_dash(tmp_path):
    """The header always claimed each shape's own peak, and a peak that could not be read (None) raised a
    TypeError after the whole benchmark had run."""
    result = run_gallery(shapes=["quick"], workdir=tmp_path, max_seconds=1e-6, **BLOCKS)
    (row,) = result["rows"]
    own = dict(row, peak_host_mb=900.0, peak_host_scope="shape")
    process = dict(row, shape="process", peak_host_mb=1200.0, peak_host_scope="process")
    unread = dict(row, shape="unread", peak_host_mb=None, peak_host_scope="process")
    lines = format_gallery({**result, "rows": [own, process, unread]}).splitlines()
    cells = {
        line.split(" | ")[0].strip("| "): line.split(" | ")[6] for line in lines if line.startswith("| ")
    }
    assert (cells["quick"], cells["process"], cells["unread"]) == ("900", "1,200 (process)", "-")
