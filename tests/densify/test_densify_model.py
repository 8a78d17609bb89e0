"""densify models and inputs: tiny-random, loading from a directory, generation metadata, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from densify_support import laps_split_args
from patchword.cli.densify import main
from patchword.densify import (
    GenerationSettings,
    images_from_folder,
    load_vlm,
    read_records,
    resolve_precision,
)
from patchword.densify.config import resolve_device
from patchword.densify.tiny import TINY_WORDS, build_tiny_random
from patchword.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
SETTINGS = GenerationSettings(max_new_tokens=5)
RUN = ["--model", "tiny-random", "--max-new-tokens", "5", "--batch-size", "4", "--no-progress"]


def _images(n: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, size=(12 + i, 20, 3), dtype=np.uint8)) for i in range(n)]


def _save_images(root: Path, n: int) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    names = [f"img{i:02d}.png" for i in range(n)]
    for name, image in zip(names, _images(n), strict=True):
        image.save(root / name)
    return names


@pytest.fixture(scope="module")
def vlm():
    return load_vlm("tiny-random", device=CPU, precision="fp32")


@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory) -> Path:
    """tiny-random written with save_pretrained, as a user's local model directory looks."""
    path = tmp_path_factory.mktemp("models") / "tiny-llava"
    model, processor = build_tiny_random(seed=0)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def test_tiny_random_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, _ = build_tiny_random(seed=0)
    assert torch.equal(torch.rand(3), expected_next)
    b, _ = build_tiny_random(seed=0)
    c, _ = build_tiny_random(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    assert sum(p.numel() for p in a.parameters()) < 100_000


def test_generation_is_greedy_deterministic_and_speaks_the_tiny_vocabulary(vlm):
    prompt = vlm.prompt_text(SETTINGS.prompt)
    assert prompt == f"USER: <image>\n{SETTINGS.prompt} ASSISTANT:"  # the LLaVA-1.5 format
    inputs = vlm.prepare(_images(4), prompt)
    assert inputs["pixel_values"].shape == (4, 3, 16, 16)
    first, second = vlm.generate(inputs, SETTINGS), vlm.generate(inputs, SETTINGS)
    assert first == second
    for gen in first:
        words = gen.text.split()
        assert 2 <= len(words) == gen.new_tokens <= 5 and set(words) <= set(TINY_WORDS)
        assert gen.truncated == (gen.new_tokens == 5)


def test_metadata_counts_tokens_until_end_of_text(vlm, monkeypatch):
    """Force the decoder's choice with suppress_tokens: only </s> (empty text) or only one word."""
    tok = vlm.tokenizer
    everything = list(range(len(tok)))
    eos, red = tok.convert_tokens_to_ids("</s>"), tok.convert_tokens_to_ids("red")
    inputs = vlm.prepare(_images(2), vlm.prompt_text(SETTINGS.prompt))
    config = vlm.model.generation_config
    monkeypatch.setattr(config, "min_new_tokens", None)
    monkeypatch.setattr(config, "suppress_tokens", [i for i in everything if i != eos])
    assert [(g.text, g.new_tokens, g.truncated) for g in vlm.generate(inputs, SETTINGS)] == [
        ("", 0, False)
    ] * 2
    monkeypatch.setattr(config, "suppress_tokens", [i for i in everything if i != red])
    assert [(g.text, g.new_tokens, g.truncated) for g in vlm.generate(inputs, SETTINGS)] == [
        ("red " * 4 + "red", 5, True)
    ] * 2


def test_empty_descriptions_are_left_out_and_named_not_counted_done(vlm, tmp_path, monkeypatch, caplog):
    """Old code wrote the empty lines and called the file complete: the loader then refused it
    (`expected a non-empty string field 'text'`) and a rerun had nothing to do."""
    from patchword.densify import densify
    from patchword.densify.runner import EMPTY_REASON

    names = _save_images(tmp_path / "imgs", 3)
    config = vlm.model.generation_config
    eos = vlm.tokenizer.convert_tokens_to_ids("</s>")
    monkeypatch.setattr(config, "min_new_tokens", None)
    monkeypatch.setattr(config, "suppress_tokens", [i for i in range(len(vlm.tokenizer)) if i != eos])
    out = tmp_path / "d.jsonl"
    result = densify(images_from_folder(tmp_path / "imgs"), vlm, out, SETTINGS)
    assert not result.complete and result.done == 0 and result.generated == 0
    assert result.empty == names and result.missing == names
    assert [(item.image_id, why) for item, why in result.failed] == [(name, EMPTY_REASON) for name in names]
    assert out.read_bytes() == b""
    assert "3 empty descriptions left out (e.g. img00.png, img01.png, img02.png)" in caplog.text
    again = densify(images_from_folder(tmp_path / "imgs"), vlm, out, SETTINGS)  # not done: tried again
    assert again.empty == names and not again.complete


def test_the_cli_names_an_image_described_with_nothing_and_exits_incomplete(tmp_path, monkeypatch, capsys):
    from patchword.densify.vlm import Generation, VisionLanguageModel

    names = _save_images(tmp_path / "imgs", 3)
    generate = VisionLanguageModel.generate

    def second_says_nothing(self, inputs, settings, seed=None):
        gens = generate(self, inputs, settings, seed)
        return [gens[0], Generation("", 0, False), *gens[2:]]

    monkeypatch.setattr(VisionLanguageModel, "generate", second_says_nothing)
    args = ["--images", str(tmp_path / "imgs"), "--out", str(tmp_path / "d.jsonl"), *RUN]
    assert main(args) == 1
    printed = _said(capsys.readouterr().err)
    assert printed[1:3] == [
        f"incomplete: 1 images missing: {names[1]}",
        f"  {names[1]}: the model generated an empty description, which is not written (a dense caption "
        "must have text); a rerun with the same settings generates it again: use another --prompt, "
        "--max-new-tokens, --sample or model, into another --out",
    ]
    assert [r.image_id for r in read_records(tmp_path / "d.jsonl")[0]] == [names[0], names[2]]
    assert main(args) == 1  # the rerun tries it again (old code: "nothing left to generate", exit 0)
    assert "(nothing generated now: 1 described with nothing again)" in capsys.readouterr().err


def test_a_saved_model_directory_generates_what_tiny_random_generates(vlm, saved_tiny, tmp_path):
    loaded = load_vlm(str(saved_tiny), device=CPU, precision="fp32")
    assert loaded.model_id == "tiny-llava"
    images = _images(3, seed=5)
    a = vlm.generate(vlm.prepare(images, vlm.prompt_text("Describe.")), SETTINGS)
    b = loaded.generate(loaded.prepare(images, loaded.prompt_text("Describe.")), SETTINGS)
    assert a == b
    # through the CLI, with a model id override written into every line
    _save_images(tmp_path / "imgs", 5)
    out = tmp_path / "d.jsonl"
    args = ["--images", str(tmp_path / "imgs"), "--model", str(saved_tiny), "--model-id", "my-llava"]
    assert main([*args, "--out", str(out), "--max-new-tokens", "5", "--no-progress"]) == 0
    assert {r.model_id for r in read_records(out)[0]} == {"my-llava"}


def test_bf16_generation_runs_on_the_cpu(tmp_path):
    vlm = load_vlm("tiny-random", device=CPU, precision="bf16")
    assert next(vlm.model.parameters()).dtype == torch.bfloat16
    gens = vlm.generate(vlm.prepare(_images(2), vlm.prompt_text("Describe.")), SETTINGS)
    assert all(set(g.text.split()) <= set(TINY_WORDS) and g.new_tokens >= 2 for g in gens)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "expected an error line"
    return err[-1]


def test_model_errors_are_one_clear_line(saved_tiny, tmp_path, capsys, monkeypatch):
    _save_images(tmp_path / "imgs", 2)
    base = ["--images", str(tmp_path / "imgs"), "--out", str(tmp_path / "d.jsonl"), "--no-progress"]
    # a model directory without a processor
    no_processor = tmp_path / "no-processor"
    no_processor.mkdir()
    for f in saved_tiny.iterdir():
        if f.name != "processor_config.json":
            (no_processor / f.name).write_bytes(f.read_bytes())
    assert main([*base, "--model", str(no_processor)]) == 2
    line = _error_line(capsys)
    assert line.startswith("error: --model:") and "has no processor" in line and str(no_processor) in line
    # a hub id that is not cached: offline by default, the hint says how to allow a download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main([*base, "--model", "nobody/no-such-vlm"]) == 2
    line = _error_line(capsys)
    assert "'nobody/no-such-vlm' is neither a local directory nor in the Hugging Face cache" in line
    assert "--allow-download" in line
    assert main([*base, "--model", "nobody/no-such-vlm", "--allow-download"]) == 2
    assert "HF_HUB_OFFLINE is set" in _error_line(capsys)
    # a path that does not exist, and a directory of another kind of model
    assert main([*base, "--model", "./no/such/dir"]) == 2
    assert "is not a model directory" in _error_line(capsys)
    from transformers import BertConfig

    bert = tmp_path / "bert"
    BertConfig(
        hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    ).save_pretrained(bert)
    model, processor = build_tiny_random()
    processor.save_pretrained(bert)  # a processor is there, the model is not image-text-to-text
    assert main([*base, "--model", str(bert)]) == 2
    assert "is not an image-text-to-text model" in _error_line(capsys)
    assert not (tmp_path / "d.jsonl").exists()  # nothing was started


def test_device_and_precision_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="fp16 generation needs a GPU"):
        resolve_precision("fp16", CPU)
    assert resolve_precision("auto", CPU) == "fp32"
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else CPU)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ConfigError, match="--device"):
        resolve_device("tpu:x")
    _save_images(tmp_path / "imgs", 1)
    assert (
        main(
            [
                "--images",
                str(tmp_path / "imgs"),
                "--out",
                str(tmp_path / "d.jsonl"),
                *RUN,
                "--precision",
                "fp16",
            ]
        )
        == 2
    )
    assert _error_line(capsys).startswith("error: --precision: fp16")
    with pytest.raises(ConfigError, match="--max-new-tokens"):
        GenerationSettings(max_new_tokens=0)


# --------------------------------------------------------------------------------------------------------
# Bad images
# --------------------------------------------------------------------------------------------------------


def test_missing_image_file_stops_before_loading_the_model(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "test_caps.txt").write_text("a\nb\n")
    (data / "test_ids.txt").write_text("1\n2\n")
    (data / "id_mapping.json").write_text(json.dumps({"1": "img00.png", "2": "gone.png"}))
    _save_images(tmp_path / "images", 1)
    out = tmp_path / "d.jsonl"
    args = laps_split_args(data, tmp_path / "images", out)
    assert main([*args, *RUN]) == 2
    line = _error_line(capsys)
    assert "1 of 2 image files are missing" in line and str(tmp_path / "images" / "gone.png") in line
    assert not out.exists()


def test_corrupt_image_error_keeps_finished_batches_and_skip_then_fix_completes_in_order(tmp_path, capsys):
    root = tmp_path / "imgs"
    names = _save_images(root, 10)
    good = (root / "img05.png").read_bytes()
    (root / "img05.png").write_bytes(b"\x89PNG not really")
    out = tmp_path / "d.jsonl"
    args = ["--images", str(root), "--out", str(out), *RUN]
    # default: stop with the file named; batch 0 (images 0..3) is kept
    assert main(args) == 2
    line = _error_line(capsys)
    assert "'img05.png'" in line and str(root / "img05.png") in line and "--skip-bad-images" in line
    assert [r.image_id for r in read_records(out)[0]] == names[:4]
    # skip: the other images are described, the run reports the missing one and exits 1
    assert main([*args, "--skip-bad-images"]) == 1
    printed = capsys.readouterr().err
    assert "incomplete: 1 images missing: img05.png" in printed
    assert [r.image_id for r in read_records(out)[0]] == names[:5] + names[6:]
    # fixed and rerun: complete, in image order
    (root / "img05.png").write_bytes(good)
    assert main(args) == 0
    records = read_records(out)[0]
    assert [r.image_id for r in records] == names
    clean = tmp_path / "clean.jsonl"
    assert main(["--images", str(root), "--out", str(clean), *RUN]) == 0
    reference = read_records(clean)[0]
    # batches without the bad image are byte-for-byte those of a clean run
    assert [r.to_line() for r in records[:4] + records[8:]] == [
        r.to_line() for r in reference[:4] + reference[8:]
    ]


def test_a_truncated_image_is_never_described_half_decoded(tmp_path, capsys):
    """A file cut after its header used to be described from its grey-padded remainder."""
    from conftest import one_error_line

    root = tmp_path / "imgs"
    names = _save_images(root, 6)
    data = (root / "img02.png").read_bytes()
    (root / "img02.png").write_bytes(data[: int(len(data) * 0.6)])
    out = tmp_path / "d.jsonl"
    args = ["--images", str(root), "--out", str(out), *RUN]
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"image 'img02.png': cannot read image {root / 'img02.png'}: truncated file" in line
    assert "--skip-bad-images" in line
    assert main([*args, "--skip-bad-images"]) == 1
    printed = capsys.readouterr().err
    assert "incomplete: 1 images missing: img02.png" in printed
    assert (
        f"  img02.png: image 'img02.png': cannot read image {root / 'img02.png'}: truncated file" in printed
    )
    assert [r.image_id for r in read_records(out)[0]] == [n for n in names if n != "img02.png"]


def test_empty_folder_and_missing_split_argument(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["--images", str(tmp_path / "empty"), "--out", str(tmp_path / "d.jsonl"), *RUN]) == 2
    assert "no image files" in _error_line(capsys)
    assert main(["--images", str(tmp_path / "nowhere"), "--out", str(tmp_path / "d.jsonl"), *RUN]) == 2
    assert "image folder not found" in _error_line(capsys)
    with pytest.raises(SystemExit) as exit_info:
        main(["--data-root", str(tmp_path), "--out", str(tmp_path / "d.jsonl"), *RUN])
    assert exit_info.value.code == 2
    assert "--data-root needs --split" in capsys.readouterr().err


def _said(err: str) -> list[str]:
    """What densify said on stderr, its log lines (which start with the date) left out."""
    return [line for line in err.splitlines() if not line[:4].isdigit()]
