"""Which recorded evaluation describes a checkpoint is decided by the checkpoint's content (the sha256 that
``patchword eval`` and training record), not by file dates; and a relative ``--checkpoint`` name is the
run's own file before one of the working directory."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch

from conftest import TINY_RUN_32
from patchword.cli import main
from patchword.errors import MissingFileError
from patchword.runs import recorded
from patchword.runs.load import resolve_checkpoint
from patchword.runs.recorded import evaluation_of
from patchword.train.process import torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A 6-step run validated every step (its best.pt holds earlier weights than last.pt), evaluated by
    ``patchword eval`` (eval_test.json of best.pt)."""
    root = tmp_path_factory.mktemp("digest")
    args = [*TINY_RUN_32, "model.seps.variant=paper", f"data.cache_dir={root / 'c'}", "progress=false"]
    extra = ["train.max_steps=6", "train.eval_every=1", f"output_dir={root}", "name=run"]
    run = root / "run"
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(["train", *args, *extra]) == 0
        assert main(["eval", str(run)]) == 0
    return run


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _json(path) -> dict:
    return json.loads(path.read_text())


def _strip_digest(path) -> None:
    """The record as versions before the digest wrote it."""
    record = _json(path)
    for key in ("checkpoint_sha256", "checkpoint_step"):
        record.pop(key, None)
    path.write_text(json.dumps(record))


def test_eval_and_summary_record_the_checkpoints_step_and_digest(evaluated):
    """The records said which file they measured (a path) but not which weights: nothing told a later
    reader whether the file still held them."""
    record, summary = _json(evaluated / "eval_test.json"), _json(evaluated / "summary.json")
    best = evaluated / "best.pt"
    assert record["checkpoint_step"] == torch.load(best, weights_only=True)["step"] < summary["steps"]
    assert record["checkpoint_sha256"] == summary["checkpoint_sha256"] == _sha256(best)


def test_a_checkpoint_replaced_with_its_date_kept_loses_its_evaluations(evaluated, tmp_path):
    """Other weights copied over best.pt with the old date (``cp -p``): eval_test.json (newer than the file)
    and summary.json (last.pt records no dev rSum to contradict it) were still taken for best.pt's, and the
    export card showed them beside last.pt's weights."""
    run = shutil.copytree(evaluated, tmp_path / "run")
    best = run / "best.pt"
    assert evaluation_of(run, best, "test")[1] == "eval_test.json"
    dated = best.stat().st_mtime
    shutil.copyfile(run / "last.pt", best)
    os.utime(best, (dated, dated))
    assert evaluation_of(run, best, "test") == ({}, None)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    exported = _json(tmp_path / "out" / "metrics.json")
    assert exported["metrics"] == {} and exported["metrics_source"] is None
    assert "No evaluation of checkpoint `best.pt`" in (tmp_path / "out" / "README.md").read_text()
    # dates no longer matter either way: the original bytes back with a newer date are described again
    shutil.copyfile(evaluated / "best.pt", best)
    later = (run / "eval_test.json").stat().st_mtime + 60
    os.utime(best, (later, later))
    assert evaluation_of(run, best, "test")[1] == "eval_test.json"


def test_records_without_a_digest_keep_the_path_and_date_rule(evaluated, tmp_path):
    """Evaluations written by older versions carry no digest: they describe the file they name while they
    are not older than it (and summary.json, the checkpoint training evaluated)."""
    run = shutil.copytree(evaluated, tmp_path / "run")
    _strip_digest(run / "eval_test.json")
    _strip_digest(run / "summary.json")
    best = run / "best.pt"
    newest = max((run / name).stat().st_mtime for name in ("eval_test.json", "summary.json"))
    os.utime(best, (newest - 60, newest - 60))
    assert evaluation_of(run, best, "test")[1] == "eval_test.json"
    (run / "eval_test.json").unlink()
    assert evaluation_of(run, best, "test")[1] == "summary.json"
    assert evaluation_of(run, run / "last.pt", "test") == ({}, None)  # training evaluated best.pt
    os.utime(best, (newest + 60, newest + 60))  # a checkpoint newer than the summary
    assert evaluation_of(run, best, "test") == ({}, None)


def test_the_checkpoint_is_hashed_once_and_only_for_a_record_with_a_digest(evaluated, tmp_path, monkeypatch):
    """Hashing a large checkpoint is paid once per lookup, and never for records that carry no digest."""
    run = shutil.copytree(evaluated, tmp_path / "run")
    shutil.copyfile(run / "eval_test.json", run / "eval_copy.json")  # two candidates carrying digests
    calls = []

    def counted(path):
        calls.append(path)
        return _sha256(path)

    monkeypatch.setattr(recorded, "file_sha256", counted)
    assert evaluation_of(run, run / "best.pt", "test")[1] in ("eval_test.json", "eval_copy.json")
    assert len(calls) == 1
    calls.clear()
    for name in ("eval_test.json", "eval_copy.json", "summary.json"):
        _strip_digest(run / name)
    assert evaluation_of(run, run / "best.pt", "test")[1] in ("eval_test.json", "eval_copy.json")
    assert calls == []


def test_a_relative_checkpoint_is_the_runs_own_before_the_working_directorys(
    evaluated, tmp_path, monkeypatch
):
    """``patchword eval RUN --checkpoint last.pt`` run from a directory holding another last.pt evaluated
    that file (and recorded it as RUN's evaluation); export already looked in the run first."""
    run = evaluated
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copyfile(run / "best.pt", elsewhere / "last.pt")
    shutil.copyfile(run / "last.pt", elsewhere / "best.pt")
    shutil.copyfile(run / "best.pt", elsewhere / "other.pt")
    monkeypatch.chdir(elsewhere)
    assert resolve_checkpoint(run, "last.pt") == run / "last.pt"
    assert resolve_checkpoint(run, "other.pt").resolve() == elsewhere / "other.pt"  # not the run's: cwd's
    with pytest.raises(
        MissingFileError,
        match=r"none\.pt does not exist: .* has best\.pt, last\.pt \(pass checkpoint= / --checkpoint\)$",
    ):
        resolve_checkpoint(run, "none.pt")
    out = tmp_path / "eval_last.json"
    assert main(["eval", str(run), "--checkpoint", "last.pt", "--out", str(out)]) == 0
    record = _json(out)
    assert record["checkpoint"] == str(run / "last.pt")
    assert record["checkpoint_step"] == 6 and record["checkpoint_sha256"] == _sha256(run / "last.pt")
    # evaluation_of looks a relative name up the same way
    assert evaluation_of(run, "best.pt", "test")[1] == "eval_test.json"
