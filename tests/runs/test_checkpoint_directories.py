"""A directory where a run's checkpoint or an export's weights file should be is named as one ("is a
directory, not a file"), not reported as a missing file elsewhere (:func:`patchword.runs.resolve_checkpoint`,
``eval`` / ``export --checkpoint``)."""

from __future__ import annotations

import pytest

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import MissingFileError
from patchword.runs import resolve_checkpoint
from patchword.runs.load import resolve_checkpoint as reexported

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(tmp_path, *dirs: str, files: tuple[str, ...] = ("best.pt", "last.pt")):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    for name in files:
        (run / name).write_bytes(b"weights")
    for name in dirs:
        (run / name).mkdir()
    return run


def test_a_directory_of_the_run_named_as_checkpoint_is_said_to_be_one(tmp_path, monkeypatch):
    """Old code: ``--checkpoint export`` looked for ./export (``is_file`` of run/export was false):
    "checkpoint export does not exist: run has best.pt, last.pt"."""
    run = _run(tmp_path, "export", "adir.pt")
    monkeypatch.chdir(tmp_path)  # no ./export here: the run's own entry is the one named
    with pytest.raises(MissingFileError) as caught:
        resolve_checkpoint(run, "export")
    # adir.pt, a directory, is no checkpoint the run has
    assert str(caught.value) == (
        f"checkpoint {run / 'export'} is a directory, not a file: "
        f"{run} has best.pt, last.pt (pass checkpoint= / --checkpoint)"
    )
    with pytest.raises(MissingFileError, match=rf"^checkpoint {run / 'adir.pt'} is a directory, not a file"):
        resolve_checkpoint(run, "adir.pt")
    assert resolve_checkpoint(run, "last.pt") == run / "last.pt"  # a file of the run, as before


def test_an_export_whose_weights_file_is_a_directory_names_that_file(tmp_path):
    """Old code: "checkpoint export/best.pt does not exist" (a file an export never has)."""
    export = _run(tmp_path, "model.safetensors", files=())
    with pytest.raises(MissingFileError) as caught:
        reexported(export)
    assert str(caught.value) == f"checkpoint {export / 'model.safetensors'} is a directory, not a file"


def test_a_run_whose_best_pt_is_a_directory_names_it(tmp_path):
    """The default is best.pt while anything is there: a directory in its place is named, not passed over
    for an export's weights file."""
    run = _run(tmp_path, "best.pt", files=("model.safetensors",))
    with pytest.raises(MissingFileError, match=rf"^checkpoint {run / 'best.pt'} is a directory, not a file$"):
        resolve_checkpoint(run)


def test_eval_and_export_with_checkpoint_a_directory_say_so_in_one_line(trained_tiny_run, tmp_path, capsys):
    """The reviewer's commands: ``patchword export runs/tiny e2 --checkpoint export`` and ``eval
    --checkpoint export`` printed "checkpoint export does not exist: runs/tiny has ..."."""
    run = trained_tiny_run
    (run / "export").mkdir(exist_ok=True)
    want = f"error: checkpoint {run / 'export'} is a directory, not a file: "
    for argv in (
        ["eval", str(run), "--checkpoint", "export"],
        ["export", str(run), str(tmp_path / "e2"), "--checkpoint", "export"],
    ):
        assert main(argv) == 2
        assert one_error_line(capsys.readouterr().err).startswith(want), argv
    assert not (tmp_path / "e2").exists()


def test_one_rule_finds_the_weights_of_a_directory(tmp_path):
    """``checkpoint.weights_file`` is the rule ``load_weights``, a warm start's recorded digest and the card's
    counts all follow: a directory's own weights file, else its export's, spelled as ``runs.files`` names
    them (checkpoint sits below ``patchword.runs`` and spells them itself)."""
    from patchword.checkpoint import weights_file
    from patchword.runs.files import EXPORT_DIR, WEIGHTS_FILE

    run = tmp_path / "run"
    (run / EXPORT_DIR).mkdir(parents=True)
    assert weights_file(run) == run / WEIGHTS_FILE  # nothing there: the first place looked
    (run / EXPORT_DIR / WEIGHTS_FILE).write_bytes(b"w")
    assert weights_file(run) == run / EXPORT_DIR / WEIGHTS_FILE
    assert weights_file(run / EXPORT_DIR) == run / EXPORT_DIR / WEIGHTS_FILE
    (run / WEIGHTS_FILE).write_bytes(b"w")
    assert weights_file(run) == run / WEIGHTS_FILE
    assert weights_file(run / "best.pt") == run / "best.pt"  # a file is itself


def test_an_export_without_its_weights_file_names_that_file_and_lists_it_when_present(tmp_path):
    """Old code: an export whose model.safetensors was gone reported "checkpoint export/best.pt does not
    exist: export has no checkpoint" (a file an export never has), and ``load_run(export, "best.pt")`` said
    "has no checkpoint" beside a model.safetensors."""
    export = _run(tmp_path, files=())
    (export / "metrics.json").write_text('{"weights_sha256": "ab"}\n')  # what an export records
    with pytest.raises(MissingFileError) as caught:
        resolve_checkpoint(export)
    assert (
        str(caught.value)
        == f"checkpoint {export / 'model.safetensors'} does not exist: {export} has no checkpoint"
    )
    (export / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(MissingFileError) as caught:
        resolve_checkpoint(export, "best.pt")
    assert str(caught.value).endswith(f"{export} has model.safetensors (pass checkpoint= / --checkpoint)")
