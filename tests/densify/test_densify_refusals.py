"""densify commands that are refused: a merge while another command holds --out's lock (under torchrun
too), a refused run or merge leaves nothing it created behind, and the --synthetic-* flags are named in
the errors of the generator config they set."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from conftest import one_error_line
from densify_support import (  # noqa: F401 - fixtures
    RUN,
    TOKENS,
    laps_split_args,
    reference_file,
    tiny_vlm,
    twelve_images,
    write_images,
)
from patchword import locks
from patchword.cli import main as patchword_main
from patchword.cli.densify import main
from patchword.densify import GenerationSettings, Shard, densify, images_from_folder, merge_shards
from patchword.densify.lock import output_lock
from patchword.errors import DataError, RunExistsError

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = GenerationSettings(max_new_tokens=TOKENS)
NAMES = [f"img{i:02d}.png" for i in range(12)]  # two batches of RUN's 8: one per rank of two


def _hold(lock_file: Path):
    """Hold ``lock_file``'s flock through another open file, as a second command does (flock conflicts
    between two open files of one process too)."""
    held = open(lock_file, "a")  # noqa: SIM115 - closed by the caller
    fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    return held


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# --------------------------------------------------------------------------------------------------------
# 1. the merge holds --out's lock
# --------------------------------------------------------------------------------------------------------


def test_torchrun_rank_0_does_not_merge_while_another_command_holds_the_out(
    image_dir, reference, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "dense.jsonl"
    args = ["--images", str(image_dir), "--out", str(out), *RUN]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(args) == 0
    capsys.readouterr()
    monkeypatch.setenv("RANK", "0")
    with _hold(tmp_path / "dense.jsonl.lock"):
        assert main(args) == 2  # its shard is written (under the shard's own lock), the merge is refused
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {out} (a densify output) is being written by another process")
    assert not out.exists() and not (tmp_path / "dense.jsonl.densify.json").exists()
    assert main(args) == 0  # the other command is gone: the rerun merges the finished shards
    assert out.read_bytes() == reference


def test_merge_command_and_function_refuse_an_out_another_command_holds(image_dir, vlm, tmp_path, capsys):
    images = images_from_folder(image_dir)
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, part in enumerate(parts):
        densify(images, vlm, part, SETTINGS, batch_size=8, shard=Shard(i, 2))
    out = tmp_path / "all.jsonl"
    with _hold(tmp_path / "all.jsonl.lock"):
        with pytest.raises(RunExistsError, match="is being written by another process"):
            merge_shards(parts, out)
        assert main(["merge", *map(str, parts), "--out", str(out)]) == 2
        assert "is being written by another process" in one_error_line(capsys.readouterr().err)
        out.write_text("the other command's file\n")
        assert main(["merge", *map(str, parts), "--out", str(out), "--force"]) == 2  # --force waits too
    assert out.read_text() == "the other command's file\n"
    assert not (tmp_path / "all.jsonl.densify.json").exists()
    assert merge_shards(parts, out, force=True) == len(NAMES)


# --------------------------------------------------------------------------------------------------------
# 2. a refused command leaves nothing behind
# --------------------------------------------------------------------------------------------------------


def test_a_model_that_does_not_load_leaves_no_out_folder_behind(image_dir, tmp_path, capsys):
    """The reviewer's path: the lock made --out's folders, then the model failed to load."""
    run = ["--images", str(image_dir), "--model", str(tmp_path / "no-model"), "--no-progress"]
    assert main([*run, "--out", str(tmp_path / "new" / "deeper" / "d.jsonl")]) == 2
    assert "is not a model directory" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"  # a folder that was there before: kept, and nothing left in it
    (kept / "mine").mkdir(parents=True)
    assert main([*run, "--out", str(kept / "mine" / "d.jsonl")]) == 2
    assert _tree(kept) == ["mine"]


def test_missing_images_found_under_the_lock_leave_no_out_folder_behind(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "test_caps.txt").write_text("a\nb\n")
    (data / "test_ids.txt").write_text("1\n2\n")
    (data / "id_mapping.json").write_text(json.dumps({"1": "img00.png", "2": "gone.png"}))
    write_images(tmp_path / "images", ["img00.png"])
    out = tmp_path / "runs" / "d.jsonl"
    assert main([*laps_split_args(data, tmp_path / "images", out), *RUN]) == 2
    assert "1 of 2 image files are missing" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()


def test_a_first_batch_that_fails_leaves_no_sidecar_to_refuse_the_corrected_command(tmp_path, capsys):
    """An unreadable first image stops the run after the sidecar and the empty output were created: they
    went with it, so a rerun with other settings is not "started with other settings"."""
    root = tmp_path / "imgs"
    write_images(root, NAMES[:3])
    good = (root / NAMES[0]).read_bytes()
    (root / NAMES[0]).write_bytes(b"\x89PNG not really")
    out = tmp_path / "out" / "d.jsonl"
    args = ["--images", str(root), "--out", str(out), *RUN]
    assert main(args) == 2
    assert f"image '{NAMES[0]}'" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
    (root / NAMES[0]).write_bytes(good)
    assert main([*args, "--max-new-tokens", str(TOKENS + 1)]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_a_failure_after_lines_were_written_keeps_them(image_dir, vlm, tmp_path):
    out = tmp_path / "new" / "d.jsonl"

    def stop(batches: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        densify(images_from_folder(image_dir), vlm, out, SETTINGS, batch_size=8, on_batch_written=stop)
    assert len(out.read_text().splitlines()) == 8  # the first batch, to resume from
    assert (tmp_path / "new" / "d.jsonl.densify.json").is_file()


def test_a_refused_merge_leaves_no_out_folder_behind(image_dir, vlm, tmp_path):
    images = images_from_folder(image_dir)
    part = tmp_path / "p0.jsonl"
    densify(images, vlm, part, SETTINGS, batch_size=8, shard=Shard(0, 2))
    with pytest.raises(DataError, match="gap"):
        merge_shards([part], tmp_path / "new" / "all.jsonl")
    assert not (tmp_path / "new").exists()
    assert _tree(tmp_path) == ["p0.jsonl", "p0.jsonl.densify.json", "p0.jsonl.lock"]


def test_a_lock_file_removed_by_its_holder_is_not_held(tmp_path, monkeypatch):
    """Removing the lock file of a refused command is safe: a command that opened the file just before it
    was removed, and locks it just after, must not count as holding --out's lock."""
    out = tmp_path / "d.jsonl"
    stale = tmp_path / "stale"
    stale.touch()
    opened = os.open(stale, os.O_RDONLY)
    os.unlink(stale)  # the file this command opened is no longer the one at the path
    real_open = locks._open_lock_file
    calls = []

    def open_stale_first(path, make_folder):
        calls.append(path)
        return (opened, False) if len(calls) == 1 else real_open(path, make_folder)

    monkeypatch.setattr(locks, "_open_lock_file", open_stale_first)
    with output_lock(out):
        assert len(calls) == 2  # it let the removed file go and locked the one at the path
        with pytest.raises(BlockingIOError), open(tmp_path / "d.jsonl.lock") as other:
            fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


# --------------------------------------------------------------------------------------------------------
# 3. the --synthetic-* flags name themselves in the generator's errors
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--synthetic-num-images", "0"],
            "--synthetic-num-images: every split needs at least one image, got 0",
        ),
        (["--synthetic-num-images", "-3"], "--synthetic-num-images: every split needs at least one image"),
        (["--synthetic-image-size", "5"], "--synthetic-image-size: must be >= 12"),
        (["--synthetic-seed", "-1"], "--synthetic-seed: must be >= 0, got -1"),
    ],
)
@pytest.mark.parametrize("split", ["test", "dev"])
def test_synthetic_flag_errors_name_the_flag(flags, expected, split, tmp_path, capsys):
    out = tmp_path / "new" / "d.jsonl"
    assert patchword_main(["densify", "--synthetic", split, *flags, "--out", str(out), *RUN]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {expected}")
    assert _tree(tmp_path) == []


def test_unknown_synthetic_split_names_the_flag(tmp_path, capsys):
    assert patchword_main(["densify", "--synthetic", "val", "--out", str(tmp_path / "d.jsonl"), *RUN]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == "error: --synthetic: unknown synthetic split 'val'; expected one of train, dev, test"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--synthetic-split", "test", "--synthetic-num-images", "0"], "--synthetic-num-images: every split"),
        (["--synthetic-split", "test", "--synthetic-seed", "-2"], "--synthetic-seed: must be >= 0, got -2"),
        (["--synthetic-split", "val"], "--synthetic-split: unknown synthetic split 'val'"),
    ],
)
def test_stats_synthetic_flag_errors_name_the_flag(flags, expected, tmp_path, capsys):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"text": "a red circle", "model_id": "m", "metadata": {"image_id": "0"}}) + "\n"
    )
    assert patchword_main(["densify", "stats", str(path), *flags]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(f"error: {expected}")


@pytest.mark.parametrize(("key", "value"), [("image_size", 3), ("bogus", 1)])
def test_stats_names_a_sidecar_whose_generator_config_was_edited(key, value, tmp_path, capsys):
    out = tmp_path / "syn.jsonl"
    run = ["--synthetic", "test", "--synthetic-num-images", "2", "--out", str(out), *RUN]
    assert main(run) == 0
    sidecar = tmp_path / "syn.jsonl.densify.json"
    meta = json.loads(sidecar.read_text())
    meta["source"]["config"][key] = value
    sidecar.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["stats", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {sidecar}: source.config is not a synthetic generator config (")
    assert key in line
