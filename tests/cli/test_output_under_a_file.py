"""An output directory where a file is (its own path, or one of its parents'): every verb that writes a
directory refuses it before any work with one ``error:`` line naming the flag or config key and that file,
exit code 2, nothing written (:func:`patchword.fileio.check_output_dir`).

f715cbc: ``import CKPT --out afile/sub`` read and converted the checkpoint, then printed ``error: [Errno 20]
Not a directory: '.../afile'``; ``export RUN afile/sub`` said the same after reading the run; ``index build
--qdrant afile/sub`` after loading the model; ``index build --out afile/sub`` named --out but not the file
(``ENOTDIR``); ``hash train`` and ``demo`` each worded it their own way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _argv(verb: str, tmp_path: Path, out: Path) -> list[str]:
    """The command line of ``verb`` writing ``out``, on the smallest inputs that reach its check: a
    placeholder checkpoint / run (the check comes first: what reads them must not be called)."""
    run, images = tmp_path / "run", tmp_path / "images"
    return {
        "import": ["import", str(tmp_path / "model_best.pth"), "--out", str(out)],
        "export": ["export", str(run), str(out)],
        "index --out": ["index", "build", str(run), "--images", str(images), "--out", str(out)],
        "index --qdrant": [
            "index",
            "build",
            str(run),
            "--images",
            str(images),
            "--out",
            str(tmp_path / "idx"),
            "--qdrant",
            str(out),
        ],  # fmt: skip
        "hash train": ["hash", "train", "--output-dir", str(out)],
        "demo": ["demo", f"output_dir={out}"],
        "pretrain": ["pretrain", "--out", str(out)],
    }[verb]


# verb -> the flag or key its error names, and what must not run before the check (the expensive part)
VERBS = {
    "import": ("--out", "patchword.imports.safe_load"),  # reading the checkpoint (gigabytes)
    "export": ("OUT", "patchword.runs.export.read_run_mapping"),
    "index --out": ("--out", "patchword.search.index.load_run"),
    "index --qdrant": ("--qdrant", "patchword.search.index.load_run"),
    "hash train": ("output_dir", "patchword.hashing.runner._train"),
    "demo": ("output_dir", "patchword.data.prepare.prepare_data"),
    "pretrain": ("--out", "patchword.recipes.pretrain.pretrain_config"),
}


@pytest.mark.parametrize("below", ["sub/deeper", ""], ids=["under a file", "a file"])
@pytest.mark.parametrize("verb", list(VERBS))
def test_an_output_directory_in_the_place_of_a_file_is_one_line_naming_the_flag(
    tmp_path, capsys, monkeypatch, verb, below
):
    flag, work = VERBS[verb]

    def no_work(*args, **kwargs):
        raise AssertionError(f"{work} ran before {flag} was checked")

    monkeypatch.setattr(work, no_work)
    (tmp_path / "run").mkdir()
    (tmp_path / "images").mkdir()
    (tmp_path / "model_best.pth").write_bytes(b"not read")
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    out = blocker / below if below else blocker
    before = sorted(tmp_path.rglob("*"))

    assert main(_argv(verb, tmp_path, out)) == 2
    line = one_error_line(capsys.readouterr().err)
    if below:
        assert line.startswith(f"error: {flag}: {blocker} is a file: {out} cannot be created under it"), line
    else:  # index build --out keeps its own words: "--out X exists and is not a search index"
        assert line.startswith((f"error: {flag}: {blocker} is a file", f"error: {flag} {blocker} exists")), (
            line
        )
    assert sorted(tmp_path.rglob("*")) == before and blocker.read_text() == "mine"


def test_import_into_an_existing_directory_is_refused_before_the_checkpoint_is_read(
    tmp_path, capsys, monkeypatch
):
    """f715cbc read and converted the whole checkpoint before saying that --out exists."""

    def no_work(*args, **kwargs):
        raise AssertionError("the checkpoint was read before --out was checked")

    monkeypatch.setattr("patchword.imports.safe_load", no_work)
    (tmp_path / "model_best.pth").write_bytes(b"not read")
    (tmp_path / "mine").mkdir()
    assert main(["import", str(tmp_path / "model_best.pth"), "--out", str(tmp_path / "mine")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        line
        == f"error: {tmp_path / 'mine'} exists; choose another --out (an imported run is never overwritten)"
    )
