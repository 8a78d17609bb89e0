"""What ``create_model`` / ``create_model_and_transforms`` say of inputs they cannot use: an existing file
given as the model, and pretrained encoders or a vocabulary that are not there, each named as the Python
caller spelled it (``tiny_pretrained=``, ``vocab=``), not as the run config's keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchword import create_model, create_model_and_transforms
from patchword.errors import MissingFileError
from patchword.pretrained import resolve_vocab_path

pytestmark = pytest.mark.usefixtures("one_thread")

NAMED = "seps-tiny-paper"  # a named model with a word text encoder (the shipped synthetic vocabulary)


@pytest.fixture
def saved(tmp_path):
    """A run directory as ``create_model`` recognises one (its config.yaml), holding checkpoint files."""
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (run / "best.pt").write_bytes(b"weights")
    return run


def test_a_checkpoint_file_says_it_is_a_file_and_which_directory_to_give(saved):
    """Old code: "runs/tiny/best.pt: does not exist; expected a directory ..." of a file that exists."""
    with pytest.raises(MissingFileError) as caught:
        create_model(str(saved / "best.pt"))
    message = str(caught.value)
    assert message.startswith(
        f"{saved / 'best.pt'} is a file, not a model: give the saved model directory holding it ({saved}; "
        f"for this checkpoint of it: patchword.runs.load_run({str(saved)!r}, checkpoint='best.pt').model), "
        "hf-hub:user/name or a model name ("
    )
    assert "does not exist" not in message
    with pytest.raises(MissingFileError, match="is a file, not a model"):
        create_model(saved / "best.pt")  # a Path too


def test_a_file_in_the_working_directory_is_not_taken_for_a_model_name(saved, tmp_path, monkeypatch):
    """Old code: ``create_model("best.pt")`` in the run directory: "model.name: unknown model 'best.pt'"."""
    monkeypatch.chdir(saved)
    with pytest.raises(
        MissingFileError, match=r"^best\.pt is a file, not a model: give the saved model directory"
    ):
        create_model("best.pt")
    (tmp_path / "loose.bin").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)  # no run around it: what a model can be
    with pytest.raises(MissingFileError) as caught:
        create_model("loose.bin")
    assert str(caught.value).startswith(
        "loose.bin is a file, not a model: give a directory written by `patchword export` (or a run "
        "directory), hf-hub:user/name or a model name ("
    )


def test_a_missing_tiny_pretrained_is_named_as_the_argument(tmp_path, monkeypatch):
    """Old code: a bare FileNotFoundError "[Errno 2] No such file or directory: 'nope'"; with vocab_size
    given, "model.tiny_pretrained=nope" (a run-config key the caller never wrote)."""
    monkeypatch.chdir(tmp_path)
    for extra in ({}, {"vocab_size": 30}):
        with pytest.raises(MissingFileError, match=r"^tiny_pretrained=nope: no such directory \(shipped"):
            create_model(NAMED, tiny_pretrained="nope", **extra)


def test_a_directory_that_is_no_pretrained_encoders_is_named_as_tiny_pretrained(tmp_path, monkeypatch):
    """Old code: "data.vocab_path=adir: adir/model.safetensors is missing": the user set tiny_pretrained."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    with pytest.raises(MissingFileError) as caught:
        create_model(NAMED, tiny_pretrained="adir")
    assert str(caught.value) == (
        "tiny_pretrained=adir: adir/model.safetensors is missing (written by `patchword pretrain`)"
    )


def test_create_model_and_transforms_names_its_vocab_argument(tmp_path, monkeypatch):
    """Old code: ``vocab="adir"`` said "data.vocab_path=adir: ..."; ``vocab="nope.json"`` raised a bare
    FileNotFoundError."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    with pytest.raises(MissingFileError, match=r"^vocab=adir: adir/model\.safetensors is missing"):
        create_model_and_transforms(NAMED, vocab="adir")
    with pytest.raises(MissingFileError, match=r"^vocab=nope\.json: no such file$"):
        create_model_and_transforms(NAMED, vocab="nope.json")
    with pytest.raises(MissingFileError, match=r"^tiny_pretrained=nope: no such directory"):
        create_model_and_transforms(NAMED, tiny_pretrained="nope")


def test_the_run_config_spelling_is_unchanged(tmp_path, monkeypatch):
    """The run config's reader (training, data preparation) still names data.vocab_path."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingFileError, match=r"^data\.vocab_path=nope\.json: no such file$"):
        resolve_vocab_path("nope.json")
    model, tokenizer, _ = create_model_and_transforms(NAMED, vocab="synthetic-64")
    assert len(tokenizer) == model.text_encoder.token_embed.num_embeddings == 79


def test_a_vocab_path_under_the_home_directory_is_read(tmp_path, monkeypatch):
    """``data.vocab_path=~/vocab.json``, as the data paths take ``~`` (it was "no such file")."""
    import shutil

    shipped = Path(resolve_vocab_path("synthetic-64"))
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copy(shipped, tmp_path / "vocab.json")
    assert resolve_vocab_path("~/vocab.json") == str(tmp_path / "vocab.json")
    with pytest.raises(MissingFileError, match=r"^data\.vocab_path=.*nope\.json: no such file$"):
        resolve_vocab_path("~/nope.json")
