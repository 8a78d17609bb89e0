"""What a densify resume must share with the first run beyond the settings compared by name, and a kill.

Defects (a reviewer's, reproduced on twelve images with ``tiny-random``):

* a sampled file resumed with another ``--batch-size`` drew completely different text for the rest (batch
  ``k`` is seeded with ``seed + k``), with a warning that it "may differ in the last bits";
* a file started on ``--images photos`` was continued silently from ``--images photos_other`` holding files
  of the same names (the sidecar's ``source`` was not compared), as were synthetic scenes of another
  generator config: the file then described two image sets;
* ``kill`` (SIGTERM) ended densify on the spot: no ``interrupted:`` line, exit -15, and the empty output's
  lock file and the folders made for it were left behind (Ctrl-C cleaned up and said so).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_error_line
from densify_support import RUN, TOKENS, reference_file, tiny_vlm, twelve_images, wait_for_stall  # noqa: F401
from patchword.cli.densify import main
from patchword.densify import GenerationSettings, densify, images_from_folder
from patchword.errors import ConfigError, RunExistsError
from stall_support import HANG_GUARD_S

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLE = GenerationSettings(max_new_tokens=TOKENS, do_sample=True, temperature=1.0, seed=3)


def _cut(out: Path, lines: int) -> None:
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:lines]))


def _no_model():
    raise AssertionError("a refused resume must not load the model")


def test_a_sampled_file_is_not_continued_with_another_batch_size(image_dir, vlm, tmp_path, capsys):
    out = tmp_path / "dense.jsonl"
    sample = ["--sample", "--temperature", "1.0", "--seed", "3"]
    assert main(["--images", str(image_dir), "--out", str(out), *RUN, *sample]) == 0  # batch size 8
    whole = out.read_bytes()
    _cut(out, 4)
    partial = out.read_bytes()
    other = [a if a != "8" else "4" for a in RUN]
    assert main(["--images", str(image_dir), "--out", str(out), *other, *sample]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: --batch-size: {out} was started with --batch-size 8 and --sample; this run has 4: sampled "
        "text depends on the batching (batch k is seeded with seed + k), so the rest would not be what the "
        "first run draws; rerun with --batch-size 8, or choose another --out"
    )
    assert out.read_bytes() == partial
    # refused before the model loads, and with a model already loaded (the sidecar check)
    images = images_from_folder(image_dir)
    for model in (_no_model, vlm):
        with pytest.raises(ConfigError, match="--batch-size: .* started with --batch-size 8 and --sample"):
            densify(images, model, out, SAMPLE, model_name="tiny-random", batch_size=4)
    assert out.read_bytes() == partial
    # the first batch size finishes it as the uninterrupted run wrote it
    assert main(["--images", str(image_dir), "--out", str(out), *RUN, *sample]) == 0
    assert out.read_bytes() == whole


def test_a_sampled_resume_on_another_device_says_its_text_differs(image_dir, vlm, tmp_path, caplog):
    """Greedy text may change in the rounding on another device; sampled text is drawn otherwise."""
    out = tmp_path / "dense.jsonl"
    images = images_from_folder(image_dir)
    densify(images, vlm, out, SAMPLE, batch_size=8)
    _cut(out, 4)
    sidecar = Path(f"{out}.densify.json")
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "device": "cuda"}))  # as if the first run had a GPU
    with caplog.at_level(logging.WARNING, logger="patchword.densify"):
        assert densify(images, vlm, out, SAMPLE, batch_size=8).complete
    assert "another device draws other random numbers" in caplog.text
    assert "last bits" not in caplog.text


def test_a_resume_from_another_image_folder_is_refused(image_dir, vlm, reference, tmp_path, capsys):
    photos, other = tmp_path / "photos", tmp_path / "photos_other"
    shutil.copytree(image_dir, photos)
    shutil.copytree(image_dir, other)  # the same names (and here the same pictures: only the place differs)
    out = tmp_path / "dense.jsonl"
    assert main(["--images", str(photos), "--out", str(out), *RUN]) == 0
    _cut(out, 4)
    partial = out.read_bytes()
    assert main(["--images", str(other), "--out", str(out), *RUN]) == 2
    first, now = photos.resolve(), other.resolve()
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {out} was started on the images in {first} and this run reads {now}: the file would "
        f"describe two image sets; rerun with --images {first} (if the images moved, link that path to them "
        f"first: ln -s {now} {first}), else choose another --out"
    )
    with pytest.raises(RunExistsError, match="two image sets"):  # a loaded model: the sidecar check
        densify(images_from_folder(other), vlm, out, GenerationSettings(max_new_tokens=TOKENS), batch_size=8)
    assert out.read_bytes() == partial
    # the folder moved: a symlink at the recorded path makes it the same folder again
    moved = tmp_path / "moved"
    photos.rename(moved)
    assert main(["--images", str(moved), "--out", str(out), *RUN]) == 2
    assert "two image sets" in one_error_line(capsys.readouterr().err)
    photos.symlink_to(moved, target_is_directory=True)
    assert main(["--images", str(moved), "--out", str(out), *RUN]) == 0
    assert out.read_bytes() == reference


def test_a_laps_resume_from_another_image_root_is_refused(tmp_path, capsys):
    from densify_support import laps_split_args, write_images

    data = tmp_path / "data"
    data.mkdir()
    ids = [str(i) for i in range(6)]
    (data / "test_ids.txt").write_text("".join(f"{i}\n" for i in ids))
    (data / "test_caps.txt").write_text("".join(f"photo {i}\n" for i in ids))
    (data / "id_mapping.json").write_text(json.dumps({i: f"{i}.png" for i in ids}))
    for root in ("images", "images_other"):
        write_images(tmp_path / root, [f"{i}.png" for i in ids])
    out = tmp_path / "test_dense.jsonl"
    assert main([*laps_split_args(data, tmp_path / "images", out), *RUN]) == 0
    _cut(out, 2)
    assert main([*laps_split_args(data, tmp_path / "images_other", out), *RUN]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"started on the images in {(tmp_path / 'images').resolve()} and this run reads" in line
    assert f"rerun with --image-root {(tmp_path / 'images').resolve()}" in line


def test_synthetic_scenes_of_another_generator_config_are_not_continued(tmp_path, capsys):
    out = tmp_path / "syn.jsonl"
    syn = ["--synthetic", "test", "--synthetic-num-images", "6", "--out", str(out), *RUN]
    assert main([*syn, "--synthetic-seed", "0"]) == 0
    _cut(out, 2)
    partial = out.read_bytes()
    assert main([*syn, "--synthetic-seed", "1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "started with other settings: synthetic seed differs (0 before, 1 now)" in line
    assert out.read_bytes() == partial
    assert main([*syn, "--synthetic-seed", "0"]) == 0  # the first config continues it


def test_shards_made_from_two_mounts_of_the_images_still_merge(image_dir, reference, tmp_path):
    """The folder is compared on resume only: shards of one job may see the images at other paths."""
    mounts = [tmp_path / "node0", tmp_path / "node1"]
    shards = [tmp_path / f"part{i}.jsonl" for i in range(2)]
    for i, (mount, shard) in enumerate(zip(mounts, shards, strict=True)):
        shutil.copytree(image_dir, mount)
        assert main(["--images", str(mount), "--out", str(shard), "--shard", f"{i}/2", *RUN]) == 0
    merged = tmp_path / "dense.jsonl"
    assert main(["merge", *map(str, shards), "--out", str(merged)]) == 0
    assert merged.read_bytes() == reference


def test_shards_of_synthetic_scenes_of_another_generator_config_do_not_merge(tmp_path, capsys):
    """Old code: merged (the scene ids of two seeds are the same), a file describing two scene sets."""
    syn = ["--synthetic", "test", "--synthetic-num-images", "4", *RUN]
    shards = [tmp_path / f"part{i}.jsonl" for i in range(2)]
    for i, shard in enumerate(shards):
        assert main([*syn, "--synthetic-seed", str(i), "--shard", f"{i}/2", "--out", str(shard)]) == 0
    merged = tmp_path / "dense.jsonl"
    capsys.readouterr()
    assert main(["merge", *map(str, shards), "--out", str(merged)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        f"{shards[1]} and {shards[0]} come from different jobs: their synthetic scenes' configs differ"
        in line
    )
    assert not merged.exists()


def test_sigterm_stops_densify_with_one_line_and_takes_back_what_it_made(image_dir, tmp_path):
    """A real ``kill``: the child is stalled before its first batch is written (the test hook), then sent
    SIGTERM; it must end as Ctrl-C does, its empty output, sidecar, lock file and new folders removed."""
    out = tmp_path / "new" / "folder" / "dense.jsonl"
    code = "import sys; from patchword.cli.densify import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PATCHWORD_DENSIFY_TEST_STALL": "0", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "child.log"
    with log.open("w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", code, "--images", str(image_dir), "--out", str(out), *RUN],
            env=env,
            stderr=err,
        )
    try:
        wait_for_stall(child, log)
        child.terminate()
        child.wait(timeout=HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    text = log.read_text()
    assert child.returncode == 143, text
    assert "Traceback" not in text
    assert text.splitlines()[-1] == (
        "interrupted: SIGTERM received while describing images: finished images are kept; rerun the same "
        "command"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["child.log"]
