"""``densify merge --force`` over an existing output, stopped at every step (a full disk, a kill): the
output and its sidecar never disagree, and a rerun of the merge or of densify ends with the right text.

The reviewer's case: the old merge wrote the new sidecar (prompt B) and was killed before the new lines;
the old lines (prompt A) then passed for prompt B's finished output ("nothing left to generate").
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from densify_support import TOKENS, tiny_vlm, twelve_images  # noqa: F401 - fixtures
from kill_support import Killed, kept, stopping
from patchword.densify import GenerationSettings, Shard, densify, images_from_folder, merge_shards
from patchword.densify import shards as shards_module
from patchword.densify.store import read_sidecar
from patchword.errors import RunExistsError

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT_A = GenerationSettings(max_new_tokens=TOKENS)
PROMPT_B = GenerationSettings(prompt="Describe.", max_new_tokens=TOKENS)
NAMES = [f"img{i:02d}.png" for i in range(12)]  # two shards at batch size 8: 8 and 4 images


@pytest.fixture(scope="module")
def jobs(image_dir, vlm, tmp_path_factory) -> dict[str, list[Path]]:
    """The two shard files of a prompt-A job and of a prompt-B job."""
    root = tmp_path_factory.mktemp("shards")
    images = images_from_folder(image_dir)
    parts: dict[str, list[Path]] = {}
    for tag, settings in (("A", PROMPT_A), ("B", PROMPT_B)):
        parts[tag] = [root / f"{tag}{i}.jsonl" for i in range(2)]
        for i, part in enumerate(parts[tag]):
            densify(images, vlm, part, settings, batch_size=8, shard=Shard(i, 2))
    return parts


@pytest.fixture(scope="module")
def merged(jobs, tmp_path_factory) -> dict[str, tuple[bytes, dict]]:
    """Each job's merged output and sidecar, as an uninterrupted merge writes them."""
    root = tmp_path_factory.mktemp("merged")
    result = {}
    for tag, parts in jobs.items():
        merge_shards(parts, root / f"{tag}.jsonl")
        result[tag] = ((root / f"{tag}.jsonl").read_bytes(), read_sidecar(root / f"{tag}.jsonl"))
    assert result["A"][0] != result["B"][0]  # the prompts give other text: a mix would show
    return result


def _state(out: Path, merged) -> str:
    """Which consistent state ``out`` is in; fails on an output and a sidecar of two different jobs."""
    if not out.exists():
        return "no output"  # a sidecar alone is harmless: densify starts afresh, merge needs no --force
    pair = (out.read_bytes(), read_sidecar(out))
    for tag, expected in merged.items():
        if pair == expected:
            return tag
    sidecar = pair[1] and pair[1]["generation"]["prompt"]
    raise AssertionError(f"{out} holds lines that its sidecar (prompt {sidecar!r}) does not describe")


def _rerun_densify_b(image_dir, vlm, out: Path, merged) -> None:
    """The user's next command, densify with prompt B: it refuses the old output or writes B's text."""
    try:
        densify(images_from_folder(image_dir), vlm, out, PROMPT_B, batch_size=8)
    except RunExistsError as err:
        assert "started with other settings" in str(err)
        assert _state(out, merged) == "A"
        return
    assert out.read_bytes() == merged["B"][0]


@pytest.mark.parametrize("failing", ["write_records_atomic", "write_sidecar"])
def test_a_failed_write_leaves_the_old_output_with_its_own_sidecar(
    failing, image_dir, vlm, jobs, merged, tmp_path, monkeypatch
):
    out = tmp_path / "old.jsonl"
    merge_shards(jobs["A"], out)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(shards_module, failing, full_disk)
        with pytest.raises(OSError, match="No space left"):
            merge_shards(jobs["B"], out, force=True)
    assert _state(out, merged) == "A"  # the old output is kept whole, with its own sidecar
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "old.jsonl",
        "old.jsonl.densify.json",
        "old.jsonl.lock",
    ]
    _rerun_densify_b(image_dir, vlm, out, merged)
    assert merge_shards(jobs["B"], out, force=True) == len(NAMES)
    assert _state(out, merged) == "B"


def test_a_merge_killed_at_any_step_never_pairs_a_sidecar_with_other_lines(
    image_dir, vlm, jobs, merged, tmp_path, monkeypatch
):
    """Stop the merge before each file-system change it makes (replace, unlink) in turn, until one runs
    to the end: every stop leaves a consistent state, and both reruns finish it."""
    steps = 0
    for stop_at in range(1, 20):
        out = tmp_path / f"run{stop_at}" / "old.jsonl"
        out.parent.mkdir()
        merge_shards(jobs["A"], out)
        calls = {"n": 0, "stop_at": stop_at}
        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", stopping(os.replace, calls))
            patch.setattr(os, "unlink", stopping(os.unlink, calls))
            # and nothing cleans up after a kill: the merge's staging folder stays
            patch.setattr(shards_module, "shutil", SimpleNamespace(rmtree=kept), raising=False)
            try:
                merge_shards(jobs["B"], out, force=True)
            except Killed:
                pass
            else:
                steps = stop_at
                break
        assert _state(out, merged) in ("A", "no output"), f"stopped before change {stop_at}"
        if stop_at % 2:  # the user reruns densify with the new prompt...
            _rerun_densify_b(image_dir, vlm, out, merged)
        else:  # ... or the merge (no --force needed once the old output is gone)
            merge_shards(jobs["B"], out, force=out.exists())
            assert _state(out, merged) == "B"
            # the rerun removed what the killed merge left beside the output
            assert sorted(p.name for p in out.parent.iterdir()) == [
                "old.jsonl",
                "old.jsonl.densify.json",
                "old.jsonl.lock",
            ]
    assert steps > 1, "the merge never ran to its end"
    assert _state(out, merged) == "B"
