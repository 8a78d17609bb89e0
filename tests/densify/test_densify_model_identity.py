"""Which model wrote a densify output: two model directories of one name (``m1/llava``, ``m2/llava``: the
same model id, config and file sizes, other weights) never end up in one file, by resume or by merge.

The reviewer's case: the old code compared only the model id (the directory's last name), so a file
started with ``m1/llava`` was continued with ``m2/llava`` and shards of both merged, silently.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from densify_support import TOKENS, twelve_images  # noqa: F401 - fixture
from patchword.cli.densify import main
from patchword.densify import load_vlm, merge_shards, read_records
from patchword.densify.store import read_sidecar, sidecar_path
from patchword.densify.tiny import build_tiny_random
from patchword.errors import DataError

FIELD = "model_fingerprint"  # the sidecar field (patchword.densify.fingerprint.FIELD)

pytestmark = pytest.mark.usefixtures("one_thread")

OPTIONS = ["--max-new-tokens", str(TOKENS), "--batch-size", "4", "--no-progress"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """``m1/llava`` and ``m2/llava``: tiny-random of seeds 0 and 1 saved as users' model directories."""
    root = tmp_path_factory.mktemp("models")
    paths = {}
    for seed, name in ((0, "m1"), (1, "m2")):
        model, processor = build_tiny_random(seed=seed)
        paths[name] = root / name / "llava"
        model.save_pretrained(paths[name])
        processor.save_pretrained(paths[name])
    return paths


def _run(image_dir: Path, model: Path, out: Path, *extra: str) -> int:
    return main(["--images", str(image_dir), "--model", str(model), "--out", str(out), *OPTIONS, *extra])


def _cut(out: Path, lines: int) -> None:
    """Keep the first ``lines`` lines (a run stopped there)."""
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:lines]))


def test_same_name_other_weights_have_other_fingerprints(models):
    from patchword.densify.fingerprint import directory_fingerprint

    m1, m2 = models["m1"], models["m2"]
    assert (m1 / "config.json").read_bytes() == (m2 / "config.json").read_bytes()
    assert (m1 / "model.safetensors").stat().st_size == (m2 / "model.safetensors").stat().st_size
    assert directory_fingerprint(m1) != directory_fingerprint(m2)


def test_resuming_with_another_model_of_the_same_name_is_refused(image_dir, models, tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    assert _run(image_dir, models["m1"], out) == 0
    _cut(out, 4)
    before = out.read_bytes()
    assert _run(image_dir, models["m2"], out) == 2
    err = capsys.readouterr().err
    assert (
        f"error: {out} was started with another model: the model's files differ (--model '{models['m1']}'"
        in err
    )
    assert out.read_bytes() == before
    from patchword.densify.fingerprint import directory_fingerprint

    assert read_sidecar(out)[FIELD] == directory_fingerprint(models["m1"])


def test_the_same_files_elsewhere_continue_the_file(image_dir, models, tmp_path):
    out = tmp_path / "b.jsonl"
    assert _run(image_dir, models["m1"], out) == 0
    whole = out.read_bytes()
    _cut(out, 4)
    copy = tmp_path / "mounted" / "llava"
    shutil.copytree(models["m1"], copy)
    assert _run(image_dir, copy, out) == 0  # the fingerprint, not the path, names the model
    assert out.read_bytes() == whole


def test_merging_shards_of_two_models_of_one_name_is_refused(image_dir, models, tmp_path):
    parts = [tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"]
    assert _run(image_dir, models["m1"], parts[0], "--shard", "0/2") == 0
    assert _run(image_dir, models["m2"], parts[1], "--shard", "1/2") == 0
    with pytest.raises(DataError, match=r"s1\.jsonl and .*s0\.jsonl come from different models: the model's"):
        merge_shards(parts, tmp_path / "m.jsonl")
    assert not (tmp_path / "m.jsonl").exists()


def _forget_fingerprint(out: Path) -> None:
    """The sidecar as patchword wrote it before fingerprints were recorded."""
    meta = json.loads(sidecar_path(out).read_text())
    meta.pop(FIELD, None)  # (absent from the files of the code before the fix: nothing to forget)
    sidecar_path(out).write_text(json.dumps(meta))


def test_an_old_sidecar_resumes_with_the_same_model_argument_only(
    image_dir, models, tmp_path, capsys, caplog
):
    out = tmp_path / "b.jsonl"
    assert _run(image_dir, models["m1"], out) == 0
    whole = out.read_bytes()
    _cut(out, 4)
    _forget_fingerprint(out)
    assert _run(image_dir, models["m2"], out) == 2
    assert "--model differs" in capsys.readouterr().err and len(read_records(out)[0]) == 4
    assert _run(image_dir, models["m1"], out) == 0
    assert out.read_bytes() == whole and "records no model fingerprint" in caplog.text
    assert FIELD not in read_sidecar(out)  # left as the first run wrote it


def test_old_shards_merge_when_their_model_arguments_agree(image_dir, models, tmp_path):
    parts = [tmp_path / "s0.jsonl", tmp_path / "s1.jsonl"]
    for k, part in enumerate(parts):
        assert _run(image_dir, models["m1"], part, "--shard", f"{k}/2") == 0
        _forget_fingerprint(part)
    assert merge_shards(parts, tmp_path / "m.jsonl") == 12
    meta = json.loads(sidecar_path(parts[1]).read_text())
    sidecar_path(parts[1]).write_text(json.dumps({**meta, "model": str(models["m2"])}))
    with pytest.raises(DataError, match="come from different models: --model differs"):
        merge_shards(parts, tmp_path / "m2.jsonl")


def test_a_cached_hub_id_is_fingerprinted_by_its_snapshot(models, tmp_path, monkeypatch):
    from patchword.densify.fingerprint import directory_fingerprint

    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--me--llava"
    shutil.copytree(models["m2"], repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    loaded = load_vlm("me/llava", device=torch.device("cpu"), precision="fp32")
    assert loaded.model_id == "me/llava"
    assert loaded.fingerprint == directory_fingerprint(models["m2"]) != directory_fingerprint(models["m1"])


def test_a_large_file_is_sampled_and_the_model_card_left_out(tmp_path):
    from patchword.densify.fingerprint import directory_fingerprint

    model = tmp_path / "m"
    model.mkdir()
    data = bytearray(3 << 20)  # larger than WHOLE_BYTES: hashed by its size and sampled blocks
    (model / "model.safetensors").write_bytes(bytes(data))
    first = directory_fingerprint(model)
    (model / "README.md").write_text("a model card")
    assert directory_fingerprint(model) == first
    data[-1] = 1  # the last block is sampled
    (model / "model.safetensors").write_bytes(bytes(data))
    assert directory_fingerprint(model) != first
