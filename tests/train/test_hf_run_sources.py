"""What a training run reads from Hugging Face directories: each backbone and the BERT vocabulary is
checked before the data is read, every error naming its config key; weights that do not fit their
config.json refuse the run; without ``data.bert_vocab`` the text backbone's own vocabulary tokenises (and
the run's config.yaml says which); the run carries that vocabulary, so it resumes, evaluates and exports
with the backbone directory gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import one_error_line, tiny_hf_laps_overrides
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.errors import ConfigError
from patchword.runs.config import RunConfig
from patchword.train import runner
from patchword.train.validate import check_config

pytestmark = pytest.mark.usefixtures("one_thread")

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 345579424\n"


def _args(tiny_hf, laps_dataset, tmp_path, *extra: str) -> list[str]:
    """A one-step LAPS run on the tiny BERT and ViT, into ``tmp_path/runs/run``."""
    return [
        *tiny_hf_laps_overrides(tiny_hf, laps_dataset, tmp_path),
        "data.dense=false",
        "train.max_steps=1",
        "train.eval_every=0",
        f"output_dir={tmp_path / 'runs'}",
        "name=run",
        *extra,
    ]


def _bad_sources(tmp_path: Path, bert: Path, vit: Path) -> list[tuple[str, str]]:
    (tmp_path / "empty").mkdir()
    return [
        (
            f"model.hf_vision={tmp_path / 'nope'}",
            f"model.hf_vision: local model directory '{tmp_path / 'nope'}'",
        ),
        (f"model.hf_vision={bert}", f"model.hf_vision: unsupported backbone model_type 'bert' of '{bert}'"),
        (f"model.hf_text={vit}", f"model.hf_text: unsupported backbone model_type 'vit' of '{vit}'"),
        (f"model.hf_text={tmp_path / 'empty'}", "model.hf_text: local model directory"),
        (f"data.bert_vocab={tmp_path / 'empty'}", "data.bert_vocab: tokenizer directory"),
    ]


def test_backbone_and_vocabulary_errors_name_their_key_before_the_data_is_read(
    tiny_hf, laps_dataset, tmp_path, capsys, monkeypatch
):
    """Old code: each came after the whole dataset was read and decoded, and named no key ("error: local
    model directory '/x/nope' does not exist", "unsupported backbone model_type 'bert'; expected one of
    ['swin', 'vit']", "tokenizer directory ... has neither vocab.txt nor tokenizer.json")."""
    bert, vit = tiny_hf

    def read_data(*args, **kwargs):
        raise AssertionError("the data was read before the backbones were checked")

    monkeypatch.setattr(runner, "load_raw_data", read_data)
    for override, expected in _bad_sources(tmp_path, bert, vit):
        assert main(["train", *_args(tiny_hf, laps_dataset, tmp_path, override)]) == 2, override
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {expected}"), (override, line)
        assert not (tmp_path / "runs").exists()


def _prefixed_vit(vit: Path) -> Path:
    from safetensors.torch import load_file, save_file

    out = vit.parent / "vit_prefixed"
    shutil.copytree(vit, out)
    weights = {f"image_encoder.backbone.{k}": v for k, v in load_file(str(vit / "model.safetensors")).items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _lfs_vit(vit: Path) -> Path:
    out = vit.parent / "vit_lfs"
    shutil.copytree(vit, out)
    (out / "model.safetensors").write_text(LFS_POINTER)
    return out


def test_backbone_weights_that_cannot_be_used_refuse_the_run_naming_the_key(
    tiny_hf, laps_dataset, tmp_path, capsys
):
    """Old code: the prefixed weights trained (rc 0) from a randomly initialised ViT, the model card saying
    they came from that directory; the git-lfs pointer was a SafetensorError traceback."""
    _, vit = tiny_hf
    cases = [
        (_prefixed_vit(vit), "do not fit its config.json: "),
        (_lfs_vit(vit), "model.safetensors is a git-lfs pointer, not the weights: run git lfs pull"),
    ]
    for directory, expected in cases:
        assert main(["train", *_args(tiny_hf, laps_dataset, tmp_path, f"model.hf_vision={directory}")]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("error: model.hf_vision: ") and f"'{directory}'" in line, line
        assert expected in line, line
        assert not (tmp_path / "runs").exists()


def _fitting_vocabulary(bert: Path, tmp_path: Path) -> list[str]:
    """The tiny BERT's directory given the 20-word vocabulary its embeddings hold."""
    words = (tmp_path / "vocab20.txt").read_text().splitlines()
    (bert / "vocab.txt").write_text("\n".join(words) + "\n")
    return words


def _without_bert_vocab(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("data.bert_vocab=")]


def test_without_data_bert_vocab_the_text_backbone_s_vocabulary_is_read_and_recorded(
    tiny_hf, laps_dataset, tmp_path
):
    """Old code: data.bert_vocab defaulted to bert-base-uncased whatever model.hf_text named (another
    vocabulary's ids, or an error naming 'bert-base-uncased'), while create_model_and_transforms read
    hf_text's."""
    bert, _ = tiny_hf
    _fitting_vocabulary(bert, tmp_path)
    assert main(["train", *_without_bert_vocab(_args(tiny_hf, laps_dataset, tmp_path))]) == 0
    run = tmp_path / "runs" / "run"
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["bert_vocab"] == str(bert)
    # a vocabulary that is given, or that an older run recorded, is kept as it is
    from patchword.runs.checks import resolve_bert_vocab

    for given in (str(tmp_path / "vocab20.txt"), "bert-base-uncased"):
        cfg = apply_overrides(
            RunConfig(), [*_args(tiny_hf, laps_dataset, tmp_path), f"data.bert_vocab={given}"]
        )
        cfg.data.bert_vocab = given
        assert not resolve_bert_vocab(cfg) and cfg.data.bert_vocab == given


def test_an_unset_bert_vocab_whose_backbone_has_none_names_the_key_and_why(tiny_hf, laps_dataset, tmp_path):
    bert, _ = tiny_hf
    (bert / "vocab.txt").unlink()
    cfg = apply_overrides(RunConfig(), _without_bert_vocab(_args(tiny_hf, laps_dataset, tmp_path)))
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert str(err.value) == (
        f"data.bert_vocab: not set, so model.hf_text's vocabulary is read: tokenizer directory '{bert}' has "
        "neither vocab.txt nor tokenizer.json"
    )


def _trained_on_a_moved_bert(tiny_hf, laps_dataset, tmp_path) -> tuple[Path, list[str]]:
    """A run trained on a copy of the tiny BERT (model and vocabulary), which is then removed."""
    bert, _ = tiny_hf
    words = _fitting_vocabulary(bert, tmp_path)
    moved = tmp_path / "bert_moved"
    shutil.copytree(bert, moved)
    args = _args(tiny_hf, laps_dataset, tmp_path, f"model.hf_text={moved}", f"data.bert_vocab={moved}")
    assert main(["train", *args]) == 0
    shutil.rmtree(moved)
    return tmp_path / "runs" / "run", words


def test_a_bert_run_carries_its_vocabulary_and_resumes_with_the_directory_gone(
    tiny_hf, laps_dataset, tmp_path, capsys
):
    """Old code: the run kept no copy: `train --resume` failed with "local model directory ... does not
    exist" (and refused data.bert_vocab=NEW)."""
    run, words = _trained_on_a_moved_bert(tiny_hf, laps_dataset, tmp_path)
    assert (run / "bert_vocab" / "vocab.txt").read_text().splitlines() == words
    assert json.loads((run / "bert_vocab" / "tokenizer_config.json").read_text()) == {"do_lower_case": True}
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.max_steps=2"]) == 0, capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_a_bert_run_evaluates_and_exports_with_its_vocabulary_directory_gone(
    tiny_hf, laps_dataset, tmp_path, capsys
):
    """Old code: `eval` and `export` failed with "local model directory ... does not exist"."""
    run, words = _trained_on_a_moved_bert(tiny_hf, laps_dataset, tmp_path)
    capsys.readouterr()
    assert main(["eval", str(run), "--out", str(tmp_path / "eval.json")]) == 0, capsys.readouterr().err
    assert main(["export", str(run), str(tmp_path / "export")]) == 0, capsys.readouterr().err
    assert (tmp_path / "export" / "bert_vocab" / "vocab.txt").read_text().splitlines() == words
    # the vocabulary the run carries is the one it reads: an override of it would be ignored, so it is refused
    assert main(["eval", str(run), "data.bert_vocab=elsewhere", "--out", str(tmp_path / "e2.json")]) == 2
    assert one_error_line(capsys.readouterr().err).startswith(
        f"error: data.bert_vocab: the run carries its vocabulary ({run / 'bert_vocab'})"
    )
    assert not (tmp_path / "e2.json").exists()
