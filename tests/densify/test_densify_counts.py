"""densify's counts say what they cover: a shard holding extra lines, the rate after a partial-batch
resume, the stats counts of fields only some lines record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from densify_support import RUN, TOKENS, tiny_vlm, twelve_images  # noqa: F401 - fixtures
from patchword.cli.densify import main
from patchword.densify import GenerationSettings, Shard, densify, images_from_folder, merge_shards
from patchword.densify.stats import dense_stats, format_stats, read_texts
from patchword.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = GenerationSettings(max_new_tokens=TOKENS)


def test_merge_of_a_shard_with_an_extra_line_says_so_not_incomplete(image_dir, vlm, tmp_path):
    """Defect: a shard of 8 images holding 9 lines was "incomplete: 9 of 8 images done; rerun its densify
    command", advice that changes nothing."""
    images = images_from_folder(image_dir)
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, part in enumerate(parts):  # 12 images, batches of 8: shard 0 holds images 0..7, shard 1 8..11
        densify(images, vlm, part, SETTINGS, batch_size=8, shard=Shard(i, 2))
    foreign = parts[1].read_bytes().splitlines(keepends=True)[0]
    parts[0].write_bytes(parts[0].read_bytes() + foreign)
    with pytest.raises(DataError) as err:
        merge_shards(parts, tmp_path / "m.jsonl")
    message = str(err.value)
    assert "holds 9 lines but its range has 8 images: extra or foreign lines" in message
    assert "incomplete" not in message and "remove them" in message
    assert not (tmp_path / "m.jsonl").exists()


def test_rate_after_a_partial_batch_resume_counts_the_regenerated_images(image_dir, tmp_path, capsys):
    """Defect: a resume that regenerated a batch of 4 to append its 2 missing images printed "2 generated
    now ... images/s" over the time of all 4."""
    out = tmp_path / "dense.jsonl"
    assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 0
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:10]))  # batch 1 (images 8..11) cut short after 2 of its 4
    capsys.readouterr()
    assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 0
    printed = capsys.readouterr().err
    assert "12 of 12 images (2 generated now + 2 regenerated to finish a partly written batch: " in printed
    assert out.read_bytes() == b"".join(lines)


def test_library_result_counts_the_regenerated_images(image_dir, vlm, tmp_path):
    out = tmp_path / "dense.jsonl"
    images = images_from_folder(image_dir)
    densify(images, vlm, out, SETTINGS, batch_size=8)
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:9]))
    result = densify(images, vlm, out, SETTINGS, batch_size=8)
    assert (result.generated, result.regenerated, result.done) == (3, 1, 12)


def _write(path: Path, metas: list[object]) -> Path:
    lines = [
        json.dumps({"text": f"text {k}", **({} if m is None else {"metadata": m})})
        for k, m in enumerate(metas)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_stats_counts_name_the_lines_that_record_their_field(tmp_path):
    """Defect: 'stopped by max-new-tokens 1' counted 2 of 4 lines (the others do not say) as if of all 4."""
    metas = [
        {"image_id": "a", "truncated": True},
        {"image_id": "a", "truncated": False},
        {"image_id": "b"},
        None,
    ]
    report = dense_stats(read_texts(_write(tmp_path / "d.jsonl", metas)))
    assert (report["duplicate_image_ids"], report["image_ids_recorded"]) == (1, 3)
    assert (report["truncated"], report["truncated_recorded"]) == (1, 2)
    text = format_stats("d.jsonl", report)
    assert "duplicate image ids 1 of 3 lines that record it" in text
    assert "stopped by max-new-tokens 1 of 2 lines that record it" in text
    # a file whose lines record neither still says n/a
    bare = format_stats("e.jsonl", dense_stats(read_texts(_write(tmp_path / "e.jsonl", [None, None]))))
    assert "duplicate image ids n/a, stopped by max-new-tokens n/a" in bare


def test_stats_names_a_metadata_that_is_not_an_object(tmp_path, capsys):
    """Defect: ``"metadata": ["a", true]`` was read as no metadata, its fields uncounted without a word."""
    path = _write(tmp_path / "d.jsonl", [{"image_id": "a"}, ["a", True]])
    with pytest.raises(DataError, match=r"d\.jsonl:2: 'metadata' must be an object .*got list"):
        read_texts(path)
    assert main(["stats", str(path)]) == 2
    assert "d.jsonl:2: 'metadata' must be an object" in capsys.readouterr().err
