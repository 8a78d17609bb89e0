"""Hugging Face backbone directories that cannot give the backbone its weights are refused, naming the
directory and why: weights that do not fit config.json (transformers would leave those tensors randomly
initialised, with a warning only), damaged or git-lfs pointer weights files (a traceback before), a hub id
cached without its weights. Heads and the pooler a checkpoint holds beside the backbone stay accepted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from patchword.encoders.hf import HFTextEncoder, HFVisionEncoder  # noqa: E402
from patchword.errors import ConfigError, DataError, ModelNotFoundError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 345579424\n"


def _copy(directory: Path, name: str) -> Path:
    out = directory.parent / name
    shutil.copytree(directory, out)
    return out


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))


def _prefixed(vit: Path, bert: Path) -> Path:
    """Every tensor of the ViT under a prefix (a patchword checkpoint's names, saved as they are)."""
    out = _copy(vit, "prefixed")
    weights = load_file(str(vit / "model.safetensors"))
    prefixed = {f"image_encoder.backbone.{k}": v for k, v in weights.items()}
    save_file(prefixed, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _bert_weights(vit: Path, bert: Path) -> Path:
    """A BERT's weights under the ViT's config.json."""
    out = _copy(vit, "bert_weights")
    shutil.copyfile(bert / "model.safetensors", out / "model.safetensors")
    return out


def _two_layers(vit: Path, bert: Path) -> Path:
    """config.json says 2 layers, the weights hold 1."""
    out = _copy(vit, "two_layers")
    _edit_config(out, num_hidden_layers=2)
    return out


MISSING = {"prefixed": _prefixed, "bert_weights": _bert_weights, "two_layers": _two_layers}


@pytest.mark.parametrize("case", MISSING, ids=list(MISSING))
def test_weights_without_tensors_the_config_describes_are_refused(tiny_hf, case):
    """Old code: each loaded (transformers initialised the missing tensors at random) and a run trained."""
    bert, vit = tiny_hf
    directory = MISSING[case](vit, bert)
    with pytest.raises(DataError) as err:
        HFVisionEncoder(directory)
    message = str(err.value)
    assert message.startswith(f"the weights in '{directory}' do not fit its config.json: "), message
    missing, total = (
        int(n) for n in message.split(": ")[1].split(" tensors")[0].split(" of the backbone's ")
    )
    assert (missing == total) if case == "prefixed" else (0 < missing < total), message
    if case == "two_layers":  # the second layer's tensors, all of them
        names = message.split("are missing from them (")[1].split(")")[0].split(", ")
        assert all(".1." in name for name in names if name != "..."), message
    assert "are missing from them (" in message and "random values" in message
    if case == "prefixed":  # the names it holds instead say what is wrong
        assert "e.g. image_encoder.backbone." in message, message


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"image_size": 64}, "1 of the backbone's"),  # only the position embeddings depend on it
        ({"hidden_size": 32, "intermediate_size": 64}, "tensors differ in shape (embeddings.cls_token: "),
    ],
    ids=["image_size", "hidden_size"],
)
def test_a_config_whose_shapes_the_weights_do_not_have_is_one_error(tiny_hf, changes, expected):
    """Old code: transformers' RuntimeError ("You set ignore_mismatched_sizes to False"), a traceback."""
    _, vit = tiny_hf
    directory = _copy(vit, "edited")
    _edit_config(directory, **changes)
    with pytest.raises(DataError) as err:
        HFVisionEncoder(directory)
    message = str(err.value)
    assert message.startswith(f"the weights in '{directory}' do not fit its config.json: "), message
    assert expected in message, message
    if "image_size" in changes:
        assert (
            "embeddings.position_embeddings: (1, 17, 16) in the weights, (1, 65, 16) by config.json"
            in message
        )


def test_task_heads_and_the_pooler_are_accepted_and_loaded(tmp_path):
    """A classification or masked-LM checkpoint holds the backbone under its prefix plus a head the
    encoder does not read: accepted, and every backbone tensor comes from the file."""
    torch.manual_seed(0)
    vit_config = transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32,
        patch_size=8, num_labels=3,
    )  # fmt: skip
    classifier = transformers.ViTForImageClassification(vit_config)
    classifier.save_pretrained(tmp_path / "vit_cls")
    bert_config = transformers.BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )  # fmt: skip
    masked = transformers.BertForMaskedLM(bert_config)
    masked.save_pretrained(tmp_path / "bert_mlm")
    vision = HFVisionEncoder(tmp_path / "vit_cls", embed_dim=16).eval()
    text = HFTextEncoder(tmp_path / "bert_mlm", embed_dim=16).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = classifier.vit(pixel_values=images).last_hidden_state
        torch.testing.assert_close(vision.backbone(pixel_values=images).last_hidden_state, want)
    torch.testing.assert_close(
        text.backbone.embeddings.word_embeddings.weight, masked.bert.embeddings.word_embeddings.weight
    )


def _pointer_safetensors(directory: Path) -> str:
    (directory / "model.safetensors").write_text(LFS_POINTER)
    return "model.safetensors is a git-lfs pointer, not the weights: run git lfs pull"


def _pointer_bin(directory: Path) -> str:
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_text(LFS_POINTER)
    return "pytorch_model.bin is a git-lfs pointer, not the weights: run git lfs pull"


def _truncated(directory: Path) -> str:
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[:6])
    return "model.safetensors cannot be read (SafetensorError: "


DAMAGED = {"lfs_safetensors": _pointer_safetensors, "lfs_bin": _pointer_bin, "truncated": _truncated}


@pytest.mark.parametrize("case", DAMAGED, ids=list(DAMAGED))
def test_damaged_weights_files_are_one_error_naming_the_file(tiny_hf, case):
    """Old code: SafetensorError ("header too large", "invalid header length") or torch.load's
    UnpicklingError, each a traceback."""
    _, vit = tiny_hf
    directory = _copy(vit, case)
    expected = DAMAGED[case](directory)
    with pytest.raises(DataError) as err:
        HFVisionEncoder(directory)
    assert str(err.value).startswith(f"could not load the local model directory '{directory}': "), err.value
    assert expected in str(err.value), err.value
    if case.startswith("lfs"):  # the check a run makes before reading its data finds it too
        from patchword.encoders.hf import check_backbone_source

        with pytest.raises(DataError, match="is a git-lfs pointer"):
            check_backbone_source(directory, "vision")


def test_errors_of_a_named_source_name_its_config_key(tiny_hf):
    from patchword.encoders.hf import check_backbone_source
    from patchword.hub import keyed_source_errors

    _, vit = tiny_hf
    directory = _two_layers(vit, vit)
    with pytest.raises(ConfigError) as err, keyed_source_errors("model.hf_vision", str(directory)):
        HFVisionEncoder(directory)
    assert err.value.key == "model.hf_vision" and str(err.value).startswith("model.hf_vision: the weights in")
    unsupported = r"^model\.hf_text: unsupported backbone model_type 'vit' of '"
    with pytest.raises(ConfigError, match=unsupported), keyed_source_errors("model.hf_text", str(vit)):
        check_backbone_source(vit, "text")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test, read by transformers and huggingface_hub alike."""
    constants = pytest.importorskip("huggingface_hub.constants")
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _cache(cache: Path, repo: str, source: Path, files: list[str]) -> None:
    snapshot = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    for name in files:
        shutil.copyfile(source / name, snapshot / name)


def test_a_hub_id_cached_without_its_weights_says_the_weights_are_missing(tiny_hf, hub_cache):
    """Old code: "'me/partial' is neither a local directory nor in the local Hugging Face cache", of a model
    whose config.json is there (a download cut short)."""
    _, vit = tiny_hf
    _cache(hub_cache, "me/partial", vit, ["config.json"])
    _cache(hub_cache, "me/whole", vit, ["config.json", "model.safetensors"])
    expected = (
        r"^'me/partial' is in the local Hugging Face cache without its weights \(a download cut short\?\)"
    )
    with pytest.raises(ModelNotFoundError, match=expected):
        HFVisionEncoder("me/partial")
    from patchword.encoders.hf import check_backbone_source

    with pytest.raises(ModelNotFoundError, match=expected):  # found before any data is read
        check_backbone_source("me/partial", "vision")
    check_backbone_source("me/whole", "vision")
    assert HFVisionEncoder("me/whole").pretrained
    with pytest.raises(ModelNotFoundError, match="^'me/none' is neither a local directory nor in the local"):
        HFVisionEncoder("me/none")
