"""A file that is not finished says so in ``densify stats``; shards of other batch sizes are named when their
ranges do not meet, and a shard continued with another ``--batch-size`` keeps the images it took."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from densify_support import TOKENS, tiny_vlm, twelve_images  # noqa: F401 - fixtures
from patchword.cli.densify import main
from patchword.densify import (
    GenerationSettings,
    Shard,
    densify,
    images_from_folder,
    merge_shards,
    read_records,
)
from patchword.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = GenerationSettings(max_new_tokens=TOKENS)


def _cut(out: Path, lines: int) -> None:
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:lines]))


def test_stats_of_a_partial_file_says_how_far_it_got(image_dir, vlm, tmp_path, capsys):
    """Old code: `4 descriptions` and nothing else, of a file its sidecar gives 12 images."""
    out = tmp_path / "d.jsonl"
    densify(images_from_folder(image_dir), vlm, out, SETTINGS, batch_size=4)
    assert main(["stats", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(out)]["partial"] is None
    _cut(out, 4)
    assert main(["stats", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == [f"{out}: 4 descriptions", "  partial: 4 of 12 images (rerun densify to finish)"]
    assert main(["stats", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(out)]["partial"] == {"done": 4, "expected": 12}


def test_stats_of_a_partial_shard_counts_the_shard_s_images(image_dir, vlm, tmp_path, capsys):
    out = tmp_path / "s1.jsonl"
    densify(images_from_folder(image_dir), vlm, out, SETTINGS, batch_size=4, shard=Shard(1, 3))
    _cut(out, 1)
    assert main(["stats", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(out)]["partial"] == {"done": 1, "expected": 4}


def test_shards_of_other_batch_sizes_that_leave_a_gap_are_named(image_dir, vlm, tmp_path):
    """Old code: `gap: images 4..7 of 12 are in none of the shards given`, naming no batch size."""
    images = images_from_folder(image_dir)
    first, second = tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"
    densify(images, vlm, first, SETTINGS, batch_size=4, shard=Shard(0, 2))  # images 0..3
    densify(images, vlm, second, SETTINGS, batch_size=8, shard=Shard(1, 2))  # images 8..11
    with pytest.raises(DataError) as err:
        merge_shards([first, second], tmp_path / "m.jsonl")
    assert str(err.value) == (
        f"gap: images 4..7 of 12 are in none of the shards given (the shards were made with different "
        f"--batch-size: 4 in {first}, 8 in {second}; a shard's image range is cut at batch boundaries, so "
        "every shard of a job needs the same --batch-size)"
    )


def test_a_shard_continued_with_another_batch_size_keeps_its_images(image_dir, vlm, tmp_path):
    """Old code: refused (`the shard's image range differs ... use the first run's --batch-size`)."""
    images = images_from_folder(image_dir)
    parts = [tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"]
    densify(images, vlm, parts[0], SETTINGS, batch_size=8, shard=Shard(0, 2))  # images 0..7
    _cut(parts[0], 3)  # stopped after 3 images
    resumed = densify(images, vlm, parts[0], SETTINGS, batch_size=4, shard=Shard(0, 2))  # 4 cuts 0..3
    assert resumed.complete and (resumed.expected, resumed.generated) == (8, 5)
    densify(images, vlm, parts[1], SETTINGS, batch_size=8, shard=Shard(1, 2))
    assert merge_shards(parts, tmp_path / "m.jsonl") == 12
    assert [r.image_id for r in read_records(tmp_path / "m.jsonl")[0]] == images.image_ids
