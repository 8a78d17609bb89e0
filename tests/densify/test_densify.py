"""densify: order, resume after interruption (in-process and a SIGKILLed subprocess), shards, merge, LAPS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL_32
from densify_support import RUN, TOKENS, laps_split_args, wait_for_stall
from densify_support import write_images as _write_images
from patchword.cli.densify import main
from patchword.data.laps import load_laps_split
from patchword.data.textfiles import load_dense_jsonl
from patchword.densify import (
    GenerationSettings,
    Shard,
    densify,
    images_from_folder,
    load_vlm,
    merge_shards,
    parse_shard,
    read_records,
    shard_output_path,
)
from patchword.errors import ConfigError, DataError

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = GenerationSettings(max_new_tokens=TOKENS)


# 50 images whose sorted order differs from creation order and from numeric order ("a/10" < "a/9").
NAMES = [f"{'ab'[i % 2]}/{i}.png" for i in range(50)]


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images")
    _write_images(root, NAMES)
    (root / ".hidden").mkdir()
    _write_images(root / ".hidden", ["x.png"])  # hidden folders are not scanned
    (root / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def vlm():
    return load_vlm("tiny-random", device=torch.device("cpu"), precision="fp32")


@pytest.fixture(scope="module")
def reference(image_dir, vlm, tmp_path_factory) -> bytes:
    """The file of one uninterrupted run over the 50 images (batch size 8)."""
    out = tmp_path_factory.mktemp("ref") / "dense.jsonl"
    result = densify(
        images_from_folder(image_dir), vlm, out, SETTINGS, model_name="tiny-random", batch_size=8
    )
    assert result.complete and result.generated == 50
    return out.read_bytes()


def _ids(data: bytes) -> list[str]:
    return [json.loads(line)["metadata"]["image_id"] for line in data.decode().splitlines()]


def test_folder_run_writes_one_line_per_image_in_sorted_order(image_dir, vlm, reference, tmp_path, capsys):
    out = tmp_path / "dense.jsonl"
    assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 0
    assert "50 of 50 images" in capsys.readouterr().err
    data = out.read_bytes()
    assert data == reference  # the CLI and the library write the same file
    assert _ids(data) == sorted(NAMES)
    records = read_records(out)[0]
    assert all(r.model_id == "tiny-random-llava" for r in records)
    assert all(r.metadata["length"] == len(r.text) and r.metadata["file"] == r.image_id for r in records)
    # the laps loader's reader takes it as it is
    assert load_dense_jsonl(out) == [r.text for r in records]
    # each line describes its own image: regenerate a few images directly, one batch of 8 as in the run
    images = images_from_folder(image_dir)
    batch = [images.load(i) for i in range(8, 16)]
    direct = vlm.generate(vlm.prepare(batch, vlm.prompt_text(SETTINGS.prompt)), SETTINGS)
    assert [g.text for g in direct] == [r.text for r in records[8:16]]
    assert len({r.text for r in records}) > 10  # the images steer the (random) words
    # a rerun has nothing to do and does not even load the model
    assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 0
    assert "nothing left to generate" in capsys.readouterr().err
    assert out.read_bytes() == reference


def test_interrupted_runs_resume_to_the_uninterrupted_file(image_dir, vlm, reference, tmp_path):
    images = images_from_folder(image_dir)
    out = tmp_path / "dense.jsonl"

    def stop_after(batches):
        def hook(written):
            if written == batches:
                raise KeyboardInterrupt

        return hook

    with pytest.raises(KeyboardInterrupt):
        densify(images, vlm, out, SETTINGS, batch_size=8, on_batch_written=stop_after(3))
    assert len(read_records(out)[0]) == 24
    with pytest.raises(KeyboardInterrupt):  # interrupted again, after one more batch
        densify(images, vlm, out, SETTINGS, batch_size=8, on_batch_written=stop_after(1))
    assert len(read_records(out)[0]) == 32
    # a torn write inside batch 2 (lines 17..24): keep 19 lines and half of the 20th
    lines = reference.splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:19]) + lines[19][:25])
    result = densify(images, vlm, out, SETTINGS, batch_size=8)
    assert out.read_bytes() == reference
    assert result.generated == 31 and not result.reordered
    # resuming with another batch size is allowed (with a warning) and still completes the file in order
    out.write_bytes(b"".join(lines[:30]))
    densify(images, vlm, out, SETTINGS, batch_size=5)
    assert _ids(out.read_bytes()) == sorted(NAMES)


def test_killed_subprocess_mid_write_reruns_to_the_uninterrupted_file(image_dir, reference, tmp_path):
    """A real SIGKILL: the test hook stalls the child after 3 batches with half a batch written."""
    out = tmp_path / "dense.jsonl"
    code = "import sys; from patchword.cli.densify import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PATCHWORD_DENSIFY_TEST_STALL": "3:torn", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "child.log"
    with log.open("w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", code, "--images", str(image_dir), "--out", str(out), *RUN],
            env=env,
            stderr=err,
        )
    try:
        wait_for_stall(child, log)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    data = out.read_bytes()
    assert not data.endswith(b"\n")  # killed inside a write
    assert 24 < len(read_records(out)[0]) < 32  # 3 batches, then part of the 4th's lines and a torn one
    assert main(["--images", str(image_dir), "--out", str(out), *RUN]) == 0
    assert out.read_bytes() == reference


def test_two_shards_merged_equal_one_run(image_dir, vlm, reference, tmp_path, capsys):
    base = ["--images", str(image_dir), *RUN]
    shards = [tmp_path / f"part{i}.jsonl" for i in range(2)]
    for i, path in enumerate(shards):
        assert main([*base, "--out", str(path), "--shard", f"{i}/2"]) == 0
    # 7 batches of 8: shard 0 gets batches 0..2 (24 images), shard 1 batches 3..6 (26 images)
    assert [len(read_records(p)[0]) for p in shards] == [24, 26]
    merged = tmp_path / "merged.jsonl"
    assert main(["merge", str(shards[1]), str(shards[0]), "--out", str(merged)]) == 0  # any order
    assert merged.read_bytes() == reference

    # the merged file is a finished densify output: a single-process rerun has nothing to do
    def no_model():
        raise AssertionError("the model must not be loaded for a finished file")

    result = densify(
        images_from_folder(image_dir), no_model, merged, SETTINGS, model_name="tiny-random", batch_size=8
    )
    assert result.complete and result.generated == 0
    # the merged output is never overwritten silently
    assert main(["merge", str(shards[0]), str(shards[1]), "--out", str(merged)]) == 2
    assert "exists" in capsys.readouterr().err


def test_merge_refuses_gaps_duplicates_and_incomplete_shards(image_dir, vlm, tmp_path):
    images = images_from_folder(image_dir)
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"p{i}.jsonl")
        densify(images, vlm, parts[-1], SETTINGS, batch_size=8, shard=Shard(i, 3))
    out = tmp_path / "m.jsonl"
    with pytest.raises(DataError, match=r"gap: images 16\.\.31"):
        merge_shards([parts[0], parts[2]], out)
    with pytest.raises(DataError, match="gap: images 32..49"):
        merge_shards(parts[:2], out)
    with pytest.raises(DataError, match="duplicate"):
        merge_shards([parts[0], parts[1], parts[1], parts[2]], out)
    lines = parts[1].read_bytes().splitlines(keepends=True)
    parts[1].write_bytes(b"".join(lines[:-1]))
    with pytest.raises(DataError, match="incomplete: 15 of 16"):
        merge_shards(parts, out)
    other = tmp_path / "other.jsonl"  # a shard of another job (other prompt)
    densify(
        images, vlm, other, GenerationSettings(prompt="Describe.", max_new_tokens=TOKENS), shard=Shard(1, 3)
    )
    with pytest.raises(DataError, match="different jobs"):
        merge_shards([parts[0], other, parts[2]], out)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"text": "x", "metadata": {"image_id": "a"}}\n')
    with pytest.raises(DataError, match="merge joins only files written by"):
        merge_shards([foreign], out)
    assert not out.exists()


def test_torchrun_ranks_write_shards_and_rank_0_merges(image_dir, reference, tmp_path, monkeypatch):
    out = tmp_path / "dense.jsonl"
    args = ["--images", str(image_dir), "--out", str(out), *RUN]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(args) == 0
    assert shard_output_path(out, Shard(1, 2)).is_file() and not out.exists()
    monkeypatch.setenv("RANK", "0")
    assert main(args) == 0  # rank 1's shard is complete, so rank 0 merges at once
    assert out.read_bytes() == reference
    assert shard_output_path(out, Shard(0, 2)).name == "dense.shard-0-of-2.jsonl"
    assert main(args) == 0  # a finished job: nothing to do
    assert out.read_bytes() == reference


@pytest.mark.parametrize("n,batch,count", [(50, 8, 2), (50, 8, 3), (7, 8, 3), (100, 1, 7), (0, 4, 2)])
def test_shard_ranges_tile_the_list_at_batch_boundaries(n, batch, count):
    ranges = [Shard(i, count).image_range(n, batch) for i in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    for (_, stop), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert stop == start
    assert all(start % batch == 0 or start == n for start, _ in ranges)


@pytest.mark.parametrize("text", ["1-2", "2/2", "0/0", "a/b", "-1/2", ""])
def test_bad_shard_syntax(text, image_dir, tmp_path, capsys):
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(text)
    assert parse_shard(" 1 / 4 ") == Shard(1, 4)
    if text:
        assert (
            main(["--images", str(image_dir), "--out", str(tmp_path / "x.jsonl"), f"--shard={text}", *RUN])
            == 2
        )
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --shard:") and "\n" not in err


def test_sampling_is_seeded_per_batch_and_survives_resume(image_dir, vlm, reference, tmp_path):
    images = images_from_folder(image_dir)
    sample = GenerationSettings(max_new_tokens=TOKENS, do_sample=True, temperature=1.0, seed=7)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    densify(images, vlm, a, sample, batch_size=8)

    def interrupt(written):
        if written == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        densify(images, vlm, b, sample, batch_size=8, on_batch_written=interrupt)
    densify(images, vlm, b, sample, batch_size=8)
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(Path(str(a) + ".densify.json").read_text())["generation"]["seed"] == 7
    sampled = [r.text for r in read_records(a)[0]]
    greedy = [json.loads(line)["text"] for line in reference.splitlines()]
    assert sum(s != g for s, g in zip(sampled, greedy, strict=True)) > 25


def test_rerun_with_other_settings_or_foreign_file_is_refused(image_dir, vlm, tmp_path, capsys):
    out = tmp_path / "dense.jsonl"
    assert main(["--images", str(image_dir), "--out", str(out), *RUN, "--shard", "0/7"]) == 0
    before = out.read_bytes()
    changed = [a if a != str(TOKENS) else "9" for a in RUN]
    assert main(["--images", str(image_dir), "--out", str(out), *changed, "--shard", "0/7"]) == 2
    assert "max_new_tokens differs (6 before, 9 now)" in capsys.readouterr().err
    # another --batch-size keeps the images the shard's first run took (0..7 at 8; 4 would cut 0..3)
    kept = densify(images_from_folder(image_dir), vlm, out, SETTINGS, batch_size=4, shard=Shard(0, 7))
    assert (kept.expected, kept.done, kept.generated) == (8, 8, 0)
    foreign = tmp_path / "mine.jsonl"
    foreign.write_text("my notes\n")
    assert main(["--images", str(image_dir), "--out", str(foreign), *RUN]) == 2
    assert "not written by patchword densify" in capsys.readouterr().err
    assert foreign.read_text() == "my notes\n" and out.read_bytes() == before


# --------------------------------------------------------------------------------------------------------
# LAPS / SEPS layout
# --------------------------------------------------------------------------------------------------------


def _write_laps(root: Path, splits: dict[str, list[int]], captions_per_image: int = 5) -> Path:
    """``root/data`` in the LAPS layout with PNG images under ``root/images/<id>.png``."""
    data = root / "data"
    data.mkdir(parents=True)
    mapping = {}
    for split, ids in splits.items():
        caps, id_lines = [], []
        for image_id in ids:
            mapping[str(image_id)] = f"imgs/{image_id}.png"
            for k in range(captions_per_image):
                caps.append(f"a photo number {image_id} with caption {k}")
                id_lines.append(str(image_id))
        (data / f"{split}_caps.txt").write_text("\n".join(caps) + "\n")
        (data / f"{split}_ids.txt").write_text("\n".join(id_lines) + "\n")
    (data / "id_mapping.json").write_text(json.dumps(mapping))
    _write_images(root / "images", sorted({v for v in mapping.values()}), seed=1)
    return data


def test_laps_layout_dense_file_loads_with_the_split(tmp_path):
    data = _write_laps(tmp_path, {"test": [31, 4, 17, 8, 2, 40]})
    out = tmp_path / "test_dense.jsonl"
    args = laps_split_args(data, tmp_path / "images", out)
    assert main([*args, *RUN]) == 0
    split = load_laps_split(data, "test", tmp_path / "images", dense_jsonl=out)
    records = read_records(out)[0]
    assert [r.image_id for r in records] == split.image_ids == ["31", "4", "17", "8", "2", "40"]
    assert split.dense_captions == [r.text for r in records]
    assert [r.metadata["file"] for r in records] == [f"imgs/{i}.png" for i in split.image_ids]


def test_laps_dense_files_train_and_evaluate(tmp_path):
    """``data.dense_{train,dev,test}=<densify output>`` with the laps loader: one tiny training epoch."""
    from patchword.config import apply_overrides
    from patchword.runs.config import RunConfig
    from patchword.train.runner import train_run

    data = _write_laps(
        tmp_path, {"train": list(range(10)), "dev": list(range(10, 14)), "test": list(range(14, 18))}
    )
    images = tmp_path / "images"
    dense = {}
    for split in ("train", "dev", "test"):
        dense[split] = tmp_path / f"{split}_dense.jsonl"
        args = [
            "--data-root",
            str(data),
            "--split",
            split,
            "--image-root",
            str(images),
            "--out",
            str(dense[split]),
        ]
        assert main([*args, *RUN]) == 0
    cfg = apply_overrides(
        RunConfig(),
        [
            f"output_dir={tmp_path / 'runs'}",
            "name=laps",
            "data.dataset=laps",
            f"data.root={data}",
            f"data.image_root={images}",
            *(f"data.dense_{split}={dense[split]}" for split in dense),
            "data.image_size=32",
            *[a for a in TINY_MODEL_32 if not a.startswith("data.synthetic_")],  # the scenes' key
            "train.batch_size=10",
            "train.epochs=1",
            "eval.max_memory_mb=1",
        ],
    )
    summary = train_run(cfg)
    assert 0 <= summary["rsum"] <= 600 and summary["dense_pairing"] == "image"


def test_store_repairs_torn_tails_and_keeps_unicode(tmp_path):
    from patchword.densify.store import DenseRecord, append_records, repair_tail

    path = tmp_path / "d.jsonl"
    records = [
        DenseRecord("un café à l'ombre", "m", {"image_id": "é/1.jpg"}),
        DenseRecord("b", "m", {"image_id": "2"}),
    ]
    with open(path, "ab") as f:
        append_records(f, records)
    assert "café" in path.read_text(encoding="utf-8")  # readable, not \\u-escaped
    assert load_dense_jsonl(path) == ["un café à l'ombre", "b"]
    complete = path.read_bytes()
    assert repair_tail(path) == 0 and path.read_bytes() == complete
    torn = b'{"text": "' + b"x" * 70_000  # longer than one backwards scan block
    path.write_bytes(complete + torn)
    assert read_records(path)[1] == len(torn)
    assert repair_tail(path) == len(torn) and path.read_bytes() == complete
    path.write_bytes(torn)  # not even one complete line
    assert repair_tail(path) == len(torn) and path.read_bytes() == b""
    path.write_bytes(b'{"text": "a", "metadata": {"image_id": "1"}}\nnot json\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: malformed JSON line"):
        read_records(path)
