"""densify against misuse and damaged files: two writers on one output, a damaged file on resume (checked
before anything changes or the model loads), blank lines, broken merge sidecars, file names that are not
UTF-8, the label of a rerun that generates nothing, absolute paths in a LAPS id mapping."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_error_line
from densify_support import RUN, TOKENS, reference_file, tiny_vlm, twelve_images, wait_for_stall, write_images  # noqa: F401 - fixtures
from patchword.cli.densify import main
from patchword.data.textfiles import load_dense_jsonl
from patchword.densify import GenerationSettings, Shard, densify, images_from_folder, read_records
from patchword.errors import DataError

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = GenerationSettings(max_new_tokens=TOKENS)
NAMES = [f"img{i:02d}.png" for i in range(12)]


def _never_load():
    raise AssertionError("the model was loaded although the run had to be refused first")


def _started_file(tmp_path: Path, image_dir: Path, vlm, data: bytes) -> Path:
    """An output with a valid sidecar (from a real run) whose content is then replaced by ``data``."""
    out = tmp_path / "d.jsonl"
    densify(images_from_folder(image_dir), vlm, out, SETTINGS, model_name="tiny-random", batch_size=8)
    out.write_bytes(data)
    return out


# --------------------------------------------------------------------------------------------------------
# 1. two writers on one --out
# --------------------------------------------------------------------------------------------------------


def test_second_densify_on_an_out_another_process_holds_is_refused_before_loading(
    image_dir, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "d.jsonl"
    monkeypatch.setattr("patchword.densify.vlm.load_vlm", lambda *a, **k: _never_load())
    with open(tmp_path / "d.jsonl.lock", "a") as held:  # another open file: flock conflicts in-process too
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {out} (a densify output) is being written by another process")
    assert not out.exists() and not (tmp_path / "d.jsonl.densify.json").exists()


def test_two_densify_processes_on_one_out_do_not_duplicate_lines(image_dir, reference, tmp_path, capsys):
    """The reviewer's race: a second command while the first one writes (stalled by the test hook)."""
    out = tmp_path / "d.jsonl"
    args = ["--images", str(image_dir), "--out", str(out), *RUN]
    code = "import sys; from patchword.cli.densify import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PATCHWORD_DENSIFY_TEST_STALL": "1", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "child.log"
    with log.open("w") as err:
        child = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=err)
    try:
        wait_for_stall(child, log)
        written = out.read_bytes()
        assert main(args) == 2
        assert "is being written by another process" in one_error_line(capsys.readouterr().err)
        assert out.read_bytes() == written  # untouched by the refused run
    finally:
        child.kill()
        child.wait()
    assert main(args) == 0  # the lock died with its holder: the rerun finishes the file
    assert out.read_bytes() == reference


# --------------------------------------------------------------------------------------------------------
# 2. / 3. a damaged file is refused before anything changes or the model loads
# --------------------------------------------------------------------------------------------------------


def test_resume_refuses_a_duplicated_line_before_cutting_the_torn_tail_or_loading_the_model(
    image_dir, vlm, reference, tmp_path
):
    lines = reference.splitlines(keepends=True)
    damaged = b"".join(lines[:3]) + lines[2] + lines[3][:50]  # line 4 repeats line 3, then a torn write
    out = _started_file(tmp_path, image_dir, vlm, damaged)
    images = images_from_folder(image_dir)
    with pytest.raises(DataError, match=rf"d\.jsonl:4: image '{NAMES[2]}' appears twice"):
        densify(images, _never_load, out, SETTINGS, model_name="tiny-random", batch_size=8)
    assert out.read_bytes() == damaged
    with pytest.raises(DataError, match="appears twice"):  # a model already loaded: same order of checks
        densify(images, vlm, out, SETTINGS, model_name="tiny-random", batch_size=8)
    assert out.read_bytes() == damaged


def test_resume_refuses_a_blank_line_like_the_training_reader(image_dir, vlm, reference, tmp_path, capsys):
    lines = reference.splitlines(keepends=True)
    damaged = b"".join(lines[:2]) + b"\n" + b"".join(lines[2:5])
    out = _started_file(tmp_path, image_dir, vlm, damaged)
    with pytest.raises(ValueError, match=r"d\.jsonl:3: empty line"):
        load_dense_jsonl(out)
    with pytest.raises(DataError, match=r"d\.jsonl:3: blank line"):
        densify(images_from_folder(image_dir), _never_load, out, SETTINGS, model_name="tiny-random")
    assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 2
    assert f"{out}:3: blank line" in one_error_line(capsys.readouterr().err)
    assert out.read_bytes() == damaged


# --------------------------------------------------------------------------------------------------------
# 4. merge with a broken sidecar
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("start", None, "missing key 'start'"), ("stop", "x", "'stop' must be a non-negative integer, got 'x'")],
)
def test_merge_names_a_sidecar_with_a_missing_or_invalid_key(
    image_dir, vlm, tmp_path, capsys, key, value, message
):
    images = images_from_folder(image_dir)
    parts = [tmp_path / f"p{i}.jsonl" for i in range(2)]
    for i, part in enumerate(parts):
        densify(images, vlm, part, SETTINGS, batch_size=4, shard=Shard(i, 2))
    sidecar = tmp_path / "p1.jsonl.densify.json"
    meta = json.loads(sidecar.read_text())
    if value is None:
        del meta[key]
    else:
        meta[key] = value
    sidecar.write_text(json.dumps(meta))
    out = tmp_path / "all.jsonl"
    assert main(["merge", *map(str, parts), "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: {sidecar}: {message}" + (
        " (the sidecar was edited or damaged)" if value is None else ""
    )
    assert not out.exists()


# --------------------------------------------------------------------------------------------------------
# 5. a file name that is not UTF-8
# --------------------------------------------------------------------------------------------------------


def test_non_utf8_file_name_is_named_with_its_folder(tmp_path, capsys):
    root = tmp_path / "imgs"
    write_images(root, ["a.png"])
    bad = os.fsdecode(b"b\xff.png")  # the surrogate-escaped str Python gives such a name
    try:
        (root / bad).write_bytes((root / "a.png").read_bytes())
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system does not store non-UTF-8 names")
    out = tmp_path / "d.jsonl"
    assert main(["--images", str(root), "--out", str(out), *RUN]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --images: {root}: the file name {bad!r} is not valid UTF-8")
    assert not out.exists()


# --------------------------------------------------------------------------------------------------------
# 6. the label of a rerun that generates nothing
# --------------------------------------------------------------------------------------------------------


def test_skip_rerun_with_the_image_still_broken_does_not_say_nothing_is_left(tmp_path, capsys):
    root = tmp_path / "imgs"
    write_images(root, NAMES[:5])
    (root / NAMES[4]).write_bytes(b"\x89PNG not really")
    args = ["--images", str(root), "--out", str(tmp_path / "d.jsonl"), *RUN, "--skip-bad-images"]
    assert main(args) == 1
    capsys.readouterr()
    assert main(args) == 1
    printed = _said(capsys.readouterr().err)
    label = "4 of 5 images (nothing generated now: 1 unreadable image(s) skipped again)"
    assert printed[0] == f"{tmp_path / 'd.jsonl'}: {label}"
    assert printed[1] == f"incomplete: 1 images missing: {NAMES[4]}"


# --------------------------------------------------------------------------------------------------------
# 7. an absolute path in id_mapping.json
# --------------------------------------------------------------------------------------------------------


def test_laps_mapping_with_an_absolute_path_is_accepted_like_the_loader(tmp_path):
    data, images, elsewhere = tmp_path / "data", tmp_path / "images", tmp_path / "elsewhere"
    write_images(images, ["imgs/1.png"])
    write_images(elsewhere, ["2.png"], seed=1)
    data.mkdir()
    (data / "test_caps.txt").write_text("one\none\ntwo\ntwo\n")
    (data / "test_ids.txt").write_text("1\n1\n2\n2\n")
    mapping = {"1": "imgs/1.png", "2": str(elsewhere / "2.png")}
    (data / "id_mapping.json").write_text(json.dumps(mapping))
    out = tmp_path / "d.jsonl"
    args = ["--data-root", str(data), "--split", "test", "--image-root", str(images), "--out", str(out)]
    assert main([*args, *RUN]) == 0
    records = read_records(out)[0]
    assert [(r.image_id, r.metadata["file"]) for r in records] == [
        ("1", "imgs/1.png"),
        ("2", (elsewhere / "2.png").as_posix()),
    ]


def _said(err: str) -> list[str]:
    """What densify said on stderr, its log lines (which start with the date) left out."""
    return [line for line in err.splitlines() if not line[:4].isdigit()]
