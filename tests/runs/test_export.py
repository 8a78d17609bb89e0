"""``export_synthetic_split``: PNG files + the LAPS/SEPS layout, read back exactly by the laps loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from patchword.config import apply_overrides
from patchword.data.export import export_synthetic_split
from patchword.data.images import load_image
from patchword.data.laps import load_laps_split
from patchword.data.synthetic import SyntheticConfig, generate_split
from patchword.data.transforms import normalize_uint8_batch, test_transform
from patchword.errors import RunExistsError
from search_support import search_env

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = SyntheticConfig(image_size=32, num_train=4, num_dev=4, num_test=6)


def test_png_round_trip_gives_the_in_memory_tensors_and_the_laps_loader_reads_the_layout(tmp_path):
    out = tmp_path / "export"
    summary = export_synthetic_split(out, "test", config=SMALL)
    scenes = generate_split(SMALL, "test")
    assert (summary.num_images, summary.num_captions, summary.image_size) == (6, 30, 32)
    assert summary.describe().startswith(
        f"exported 6 images and 30 captions of the synthetic test split to {out}"
    )
    split = load_laps_split(out, "test", summary.files["images"], dense_jsonl=summary.files["dense"])
    assert split.captions == scenes.captions
    assert np.array_equal(split.txt2img, scenes.txt2img)
    assert split.image_ids == scenes.image_ids
    assert split.dense_captions == scenes.dense_captions
    # The in-memory pipeline normalises the uint8 arrays; the file pipeline decodes and resizes to the same
    # size: the tensors must be identical, not just close.
    transform = test_transform(32)
    for i, path in enumerate(split.images):
        from_file = transform(load_image(path))
        in_memory = normalize_uint8_batch(scenes.images[i : i + 1])[0]
        assert torch.equal(from_file, in_memory), path
    # Dense lines carry the image's file (relative to images/) as `patchword densify` writes it.
    lines = [json.loads(line) for line in summary.files["dense"].read_text().splitlines()]
    assert [rec["metadata"]["file"] for rec in lines] == [f"{i}.png" for i in scenes.image_ids]
    assert [rec["text"] for rec in lines] == scenes.dense_captions
    assert json.loads((out / "id_mapping.json").read_text()) == {i: f"{i}.png" for i in scenes.image_ids}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary directory left behind"


def test_export_refuses_a_non_empty_directory_and_leaves_it_alone(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(RunExistsError, match="not empty"):
        export_synthetic_split(out, "test", config=SMALL)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    with pytest.raises(ValueError, match="--split"):
        export_synthetic_split(tmp_path / "other", "validation", config=SMALL)


def test_metrics_on_the_exported_files_equal_the_in_memory_metrics(tmp_path_factory):
    from patchword.eval import evaluate
    from patchword.train.runner import prepare_data

    env = search_env(tmp_path_factory)
    run = env.run
    in_memory = prepare_data(env.config.data, tokenizer=run.tokenizer)
    on_disk_cfg = apply_overrides(env.config, env.export.eval_overrides())
    on_disk = prepare_data(on_disk_cfg.data, tokenizer=run.tokenizer, roles=("test",))  # as eval reads it
    assert env.config.data.dataset == "synthetic" and on_disk_cfg.data.dataset == "laps"
    assert env.config.data.synthetic_config().image_size == env.export.image_size
    a = evaluate(run.model, in_memory.splits["test"], env.config.eval)
    b = evaluate(run.model, on_disk.splits["test"], on_disk_cfg.eval)
    keys = ["i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum", "i2t_medr", "t2i_medr"]
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert 0 < a["rsum"] <= 600
