"""What ``patchword import`` refuses before anything is written, and how it says so: ``data.*`` overrides no
evaluation of the run would read (or every evaluation would refuse), sparse / meta / quantized tensors, a
checkpoint of another layout given ``--family`` (a bare state_dict, ``module.`` names); and the override
``model.hf_local_files_only=false``, which lets the import read a hub id the cache lacks."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from test_import_scan_naaf import (
    SCAN_SPECIALS,
    nothing_written,
    official_checkpoint,
    scan_opt,
    vocab_words,
    write_json_vocab,
)

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import ConfigError, DataError
from patchword.imports import ImportOptions, import_checkpoint
from patchword.runs import read_run_config
from patchword.testing.official_seps import official_checkpoint as official_seps
from patchword.testing.official_seps import write_tiny_backbones

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def seps_files(tmp_path_factory):
    """An official SEPS ViT checkpoint and tiny ``vit`` / ``bert`` directories (with BERT's vocab.txt)."""
    root = tmp_path_factory.mktemp("seps")
    write_tiny_backbones(root)
    torch.save(official_seps("vit", embed=24), root / "model_best.pth")
    return root


@pytest.fixture(scope="module")
def scan_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan")
    torch.save(official_checkpoint(scan_opt()), root / "model_best.pth.tar")
    return root / "model_best.pth.tar", write_json_vocab(root / "vocab.json", vocab_words(SCAN_SPECIALS))


def _seps(root, out, overrides=(), family="seps", **flags):
    options = ImportOptions(
        hf_vision=str(root / "vit"), hf_text=str(root / "bert"), overrides=list(overrides), **flags
    )
    return import_checkpoint(root / "model_best.pth", out, family_name=family, options=options)


# ------------------------------------------------------------------------ data overrides no evaluation reads


@pytest.mark.parametrize(
    "family, override, key",
    [
        ("seps", "data.num_train=5", "data.num_train"),  # the synthetic scenes' key, on LAPS files
        ("seps", "data.region_boxes=true", "data.region_boxes"),  # precomp's key, on images
        ("seps", "data.num_regions=3", "data.num_regions"),
        ("seps", "data.dataset=precomp", "data.dataset"),  # region features for a model of images
        ("seps", "data.dataset=synthetic", "data.dense_train"),  # the checkpoint's dense files, unread there
        ("laps", "data.dataset=synthetic", "data.root"),  # the checkpoint's LAPS directory, unread there
        ("laps", "data.dense_test=/data/f30k_test.jsonl", "data.dense_test"),  # LAPS reads no dense text
    ],
)
def test_seps_and_laps_imports_refuse_data_keys_no_evaluation_reads(
    seps_files, tmp_path, family, override, key
):
    """Old code imported each (exit 0), stored it in config.yaml and import.json as applied, and every later
    `patchword eval` ignored it (num_train, num_regions, LAPS dense_test) or refused it (the others)."""
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as caught:
        _seps(seps_files, out, [override], family=family)
    assert caught.value.key == key
    nothing_written(out)


def test_the_refusal_of_a_key_the_new_dataset_leaves_unread_says_where_it_came_from(seps_files, tmp_path):
    with pytest.raises(ConfigError) as caught:
        _seps(seps_files, tmp_path / "run", ["data.dataset=synthetic"], family="laps")
    assert str(caught.value).startswith("data.root: is read by data.dataset=laps or karpathy or precomp")
    assert str(caught.value).endswith("(the import sets it for data.dataset=laps)")


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.image_root=/data/images", "data.image_root"),  # image files, for region features
        ("data.dense_test=/data/test.jsonl", "data.dense_test"),
        ("data.num_regions=10", "data.num_regions"),  # the synthetic regions' key
        ("data.dataset=laps", "data.dataset"),  # image files for a region model
        ("data.dataset=synthetic_regions", "data.root"),  # the precomp directory, unread there
    ],
)
def test_a_scan_import_refuses_data_keys_no_evaluation_reads(scan_files, tmp_path, override, key):
    ckpt, vocab = scan_files
    out = tmp_path / "runs" / "imported"
    with pytest.raises(ConfigError) as caught:
        import_checkpoint(ckpt, out, options=ImportOptions(vocab=str(vocab), overrides=[override]))
    assert caught.value.key == key
    nothing_written(out)


def test_a_region_dataset_for_a_model_of_images_is_named_in_one_line(scan_files, tmp_path, capsys):
    ckpt, vocab = scan_files
    out = tmp_path / "runs" / "x"
    argv = ["import", str(ckpt), "--out", str(out), "--vocab", str(vocab), "data.dataset=laps"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        "error: data.dataset: laps holds images, but the scan checkpoint's model reads region features "
        "(model.image_encoder=precomp): evaluate it on data.dataset=precomp (or another dataset of region "
        "features)"
    )
    nothing_written(out)


def test_data_keys_the_dataset_reads_are_still_applied(seps_files, scan_files, tmp_path):
    overrides = ["data.dataset=karpathy", "data.dev_from_train=4", "data.check_images=false"]
    _seps(seps_files, tmp_path / "seps", overrides)
    data = read_run_config(tmp_path / "seps").data
    assert (data.dataset, data.dev_from_train, data.check_images) == ("karpathy", 4, False)
    ckpt, vocab = scan_files
    import_checkpoint(
        ckpt, tmp_path / "scan", options=ImportOptions(vocab=str(vocab), overrides=["data.mmap=false"])
    )
    assert read_run_config(tmp_path / "scan").data.mmap is False


# ------------------------------------------------------------------------ tensors of another kind


def _with_tensor(ckpt: dict, key: str, make) -> dict:
    state = dict(ckpt["model"])
    state[key] = make(state[key])
    return {**ckpt, "model": state}


_KINDS = {
    "sparse": (lambda t: t.to_sparse(), "a sparse tensor (layout torch.sparse_coo)"),
    "csr": (lambda t: t.to_sparse_csr(), "a sparse tensor (layout torch.sparse_csr)"),
    "meta": (lambda t: torch.empty(t.shape, device="meta"), "a meta tensor"),
    "quantized": (lambda t: torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8), "a quantized tensor"),
}


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")  # torch.load of a quantized one
@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_sparse_meta_or_quantized_tensor_is_refused_naming_it(seps_files, tmp_path, capsys, kind):
    """Old code: a torch traceback (exit 1) from the finiteness check, or another crash in the mapping."""
    ckpt = official_seps("vit", embed=24)
    key = next(k for k, v in ckpt["model"].items() if v.ndim == 2)
    make, said = _KINDS[kind]
    with warnings.catch_warnings():  # torch: CSR support in beta, quantized creation deprecated
        warnings.simplefilter("ignore", UserWarning)
        torch.save(_with_tensor(ckpt, key, make), tmp_path / "odd.pth")
    out = tmp_path / "runs" / "imported"
    argv = ["import", str(tmp_path / "odd.pth"), "--out", str(out), "--family", "seps"]
    argv += ["--hf-vision", str(seps_files / "vit"), "--hf-text", str(seps_files / "bert")]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {tmp_path / 'odd.pth'}: model[{key!r}] is {said}")
    nothing_written(out)


def test_a_sparse_tensor_of_a_scan_checkpoint_is_named_by_its_place(scan_files, tmp_path):
    ckpt = official_checkpoint(scan_opt())
    image = dict(ckpt["model"][0])
    key = next(k for k, v in image.items() if v.ndim == 2)
    image[key] = image[key].to_sparse()
    torch.save({**ckpt, "model": [image, ckpt["model"][1]]}, tmp_path / "odd.pth.tar")
    with pytest.raises(DataError, match=rf"model\[0\]\[{key!r}\] is a sparse tensor"):
        import_checkpoint(
            tmp_path / "odd.pth.tar", tmp_path / "run", options=ImportOptions(vocab=str(scan_files[1]))
        )


# ------------------------------------------------------------------------ another layout given --family


def test_a_bare_state_dict_given_family_says_what_is_missing(seps_files, tmp_path):
    """Old code: "... is not a seps checkpoint", nothing more."""
    torch.save(official_seps("vit", embed=24)["model"], tmp_path / "bare.pth")
    with pytest.raises(DataError) as caught:
        import_checkpoint(tmp_path / "bare.pth", tmp_path / "run", family_name="seps")
    said = str(caught.value)
    assert said.startswith(f"{tmp_path / 'bare.pth'} is not a seps checkpoint: it has no 'model' entry")
    assert "it holds tensors only (a bare state_dict)" in said
    # without --family, the same description of the layout
    with pytest.raises(DataError, match=r"imports \(.*\): it holds tensors only \(a bare state_dict\)"):
        import_checkpoint(tmp_path / "bare.pth", tmp_path / "run")


def test_module_prefixed_names_given_family_are_named(seps_files, tmp_path):
    ckpt = official_seps("vit", embed=24)
    torch.save({**ckpt, "model": {"module." + k: v for k, v in ckpt["model"].items()}}, tmp_path / "ddp.pth")
    with pytest.raises(DataError) as caught:
        import_checkpoint(tmp_path / "ddp.pth", tmp_path / "run", family_name="seps")
    said = str(caught.value)
    assert "its 'model' state dict has no parameter img_enc.visual_encoder.* (the vision backbone)" in said
    assert "its parameter names start with 'module.'" in said


def test_a_missing_opt_field_is_named(seps_files, tmp_path):
    ckpt = official_seps("vit", embed=24)
    del ckpt["opt"].aggr_ratio
    torch.save(ckpt, tmp_path / "no_ratio.pth")
    with pytest.raises(DataError, match="is not a seps checkpoint: its opt has no aggr_ratio"):
        import_checkpoint(tmp_path / "no_ratio.pth", tmp_path / "run", family_name="seps")


# ------------------------------------------------------------------------ model.hf_local_files_only


def _spy_configs(monkeypatch, seps_files, calls):
    """``read_hf_config`` recording each call's ``local_files_only``; a hub id reads the tiny directories."""
    import patchword.hub

    real = patchword.hub.read_hf_config

    def spy(name, *, local_files_only, reword_errors=True):
        calls.append((str(name), local_files_only))
        local = {"hub/tiny-vit": seps_files / "vit", "hub/tiny-bert": seps_files / "bert"}.get(
            str(name), name
        )
        return real(local, local_files_only=True, reword_errors=reword_errors)

    monkeypatch.setattr(patchword.hub, "read_hf_config", spy)


def test_hf_local_files_only_false_lets_the_import_read_a_hub_id_the_cache_lacks(
    seps_files, tmp_path, monkeypatch
):
    """Old code recorded the override in config.yaml and read every hub id from the cache only."""
    import huggingface_hub

    configs, downloads = [], []
    _spy_configs(monkeypatch, seps_files, configs)

    def download(repo_id, filename, **kwargs):  # nothing is downloaded in a test
        downloads.append((repo_id, filename))
        return str(seps_files / "bert" / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    options = ImportOptions(
        hf_vision="hub/tiny-vit", hf_text="hub/tiny-bert", overrides=["model.hf_local_files_only=false"]
    )
    import_checkpoint(seps_files / "model_best.pth", tmp_path / "run", family_name="seps", options=options)
    assert configs == [("hub/tiny-vit", False), ("hub/tiny-bert", False)]
    assert downloads == [("hub/tiny-bert", "vocab.txt")]
    assert (tmp_path / "run" / "bert_vocab.txt").read_text() == (
        seps_files / "bert" / "vocab.txt"
    ).read_text()
    assert read_run_config(tmp_path / "run").model.hf_local_files_only is False


def test_by_default_a_hub_id_is_read_from_the_cache_and_the_refusal_says_how_to_download(
    seps_files, tmp_path, monkeypatch
):
    configs = []
    _spy_configs(monkeypatch, seps_files, configs)
    import_checkpoint(
        seps_files / "model_best.pth",
        tmp_path / "run",
        family_name="seps",
        options=ImportOptions(hf_vision="hub/tiny-vit", hf_text=str(seps_files / "bert")),
    )
    assert configs == [("hub/tiny-vit", True), (str(seps_files / "bert"), True)]
    monkeypatch.undo()  # the real reader: an uncached hub id, read with local_files_only (no network)
    out = tmp_path / "runs" / "absent"
    with pytest.raises(ConfigError) as caught:
        _seps_hub(seps_files, out)
    assert caught.value.key == "--hf-vision"
    assert str(caught.value).endswith(
        "; a hub id is read from the local cache: model.hf_local_files_only=false downloads it"
    )
    nothing_written(out)


def _seps_hub(root, out):
    options = ImportOptions(hf_vision="nobody/not-cached-anywhere", hf_text=str(root / "bert"))
    return import_checkpoint(root / "model_best.pth", out, family_name="seps", options=options)


def test_the_import_record_lists_the_loading_override(seps_files, tmp_path, monkeypatch):
    configs = []
    _spy_configs(monkeypatch, seps_files, configs)
    record = _seps(seps_files, tmp_path / "run", ["model.hf_local_files_only=false"])
    assert record["overrides"] == ["model.hf_local_files_only=false"]
    assert json.loads((tmp_path / "run" / "import.json").read_text())["overrides"] == record["overrides"]
    assert [flag for _, flag in configs] == [False, False]
