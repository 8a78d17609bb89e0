"""A run killed outright (``kill -9``, the OOM killer) runs none of its cleanup: a start killed before its
first checkpoint is started again by the same command, the temporary file of a write a kill cut short is
removed when the run is started or resumed again, and a torn last line of ``resumes.jsonl`` is dropped
before the next resume appends its record (it was glued onto it, and ``patchword report`` then failed).

In-process, tiny synthetic runs: a kill is a ``BaseException`` raised where it would land, with the
runner's cleanup (which a real kill never reaches) switched off.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from conftest import TINY_MODEL_32
from patchword.config import apply_overrides, save_config
from patchword.errors import RunExistsError
from patchword.readers import read_json_lines
from patchword.runs.claim import RunKind
from patchword.runs.config import RunConfig
from patchword.train import runner
from patchword.train import trainer as trainer_module
from patchword.train.runner import resume_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "data.num_train=21",  # 105 captions: 7 batches per epoch
    "data.num_dev=6",
    "data.num_test=6",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.log_every=1",
    "train.num_threads=1",
    "eval.max_memory_mb=1",
]
TEMP = ".last.pt.k3j9x1ab.tmp"  # as fileio.atomic_write names the temporary file of last.pt


class Killed(BaseException):
    """What ``kill -9`` does to the process at the point it is raised: nothing after it runs."""


def _config(root: Path, name: str, *extra: str) -> RunConfig:
    return apply_overrides(
        RunConfig(), [*TINY, f"output_dir={root}", f"name={name}", f"data.cache_dir={root / 'cache'}", *extra]
    )


def _steps(run: Path, split: str = "train") -> list[int]:
    return [r["step"] for r in read_json_lines(run / "metrics.jsonl", "metrics") if r["split"] == split]


def _killed_during_first_checkpoint(cfg: RunConfig, monkeypatch) -> Path:
    """Start ``cfg`` and kill it while it writes its first last.pt (half of it in the temporary file)."""

    def kill_while_saving(state, path):
        Path(path).parent.joinpath(f".{Path(path).name}.k3j9x1ab.tmp").write_bytes(b"half a checkpoint")
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(trainer_module, "atomic_save", kill_while_saving)
        patched.setattr(RunKind, "remove_failed_start", lambda *args: None)  # what a kill never reaches
        with pytest.raises(Killed):
            train_run(cfg)
    return Path(cfg.output_dir) / cfg.name


def test_a_start_killed_before_its_first_checkpoint_is_started_again_by_the_same_command(
    tmp_path, monkeypatch, caplog
):
    """Defect: the rerun said the directory exists (continue it with --resume), and --resume that it has no
    last.pt (remove it and start again): the OOM killer's victim needed hand work."""
    cfg = _config(tmp_path, "k1", "train.max_steps=4", "train.checkpoint_every=2", "train.eval_every=100")
    run = _killed_during_first_checkpoint(cfg, monkeypatch)
    left = sorted(p.name for p in run.iterdir())
    assert left == [".last.pt.k3j9x1ab.tmp", ".lock", "config.yaml", "metrics.jsonl", "vocab.json"]
    assert _steps(run) == [1, 2]

    with caplog.at_level(logging.WARNING, logger="patchword.train.runner"):
        assert train_run(cfg)["steps"] == 4
    (line,) = [
        r.getMessage() for r in caplog.records if "killed before its first checkpoint" in r.getMessage()
    ]
    assert line.startswith(f"{run}: a start killed before its first checkpoint left ")
    assert TEMP not in {p.name for p in run.iterdir()}
    assert _steps(run) == [1, 2, 3, 4]  # the killed start's records are gone, not followed by a second run's


@pytest.mark.parametrize("extra", ["notes.txt", "best.pt"], ids=["a-file-it-never-writes", "best-pt"])
def test_a_directory_holding_more_than_a_failed_start_is_refused_untouched(tmp_path, monkeypatch, extra):
    """Only what a start writes before its first checkpoint is removed: a file the run did not write, or
    best.pt (weights one may still evaluate), stops the start; the error no longer advises a --resume that
    would refuse the run (no last.pt)."""
    cfg = _config(tmp_path, "k2", "train.max_steps=4", "train.checkpoint_every=2", "train.eval_every=100")
    run = _killed_during_first_checkpoint(cfg, monkeypatch)
    (run / extra).write_text("kept")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(RunExistsError, match="already exists") as refused:
        train_run(cfg)
    assert "--resume" not in str(refused.value)
    if extra == "best.pt":  # the weights of the first validation: say how to use them
        assert "with best.pt but no last.pt" in str(refused.value)
        assert f"`patchword eval {run}`" in str(refused.value)
    else:
        assert "no last.pt to resume from" in str(refused.value)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_the_outputs_of_the_trackers_a_failed_start_names_are_its_own(tmp_path):
    """A tensorboard folder is what a start with train.report_to=[tensorboard] writes; without it there it
    is someone else's."""
    run = tmp_path / "k3"
    (run / "tensorboard").mkdir(parents=True)
    save_config(_config(tmp_path, "k3"), run / "config.yaml")
    assert runner.TRAIN_RUNS.failed_start(run) is None
    save_config(_config(tmp_path, "k3", "train.report_to=[tensorboard]"), run / "config.yaml")
    assert runner.TRAIN_RUNS.failed_start(run) == ["config.yaml", "tensorboard"]


def test_a_resume_removes_what_killed_writes_left_and_repairs_a_torn_resume_log(tmp_path, caplog):
    """Defects: a ``.last.pt.XXXX.tmp`` (checkpoint-sized) left by a kill during a write stayed for good;
    a resume's record was glued onto the torn last line of resumes.jsonl, and the next reader failed with
    ``resumes.jsonl:2: not a resume log record: invalid JSON``."""
    run = tmp_path / "k4"
    train_run(_config(tmp_path, "k4", "train.max_steps=2"))
    stale = [
        run / TEMP,
        run / ".summary.json.a1b2c3d4.tmp",
        run / "export" / ".model.safetensors.q1w2e3r4.tmp",
    ]
    foreign = [run / ".notes.txt.a1b2c3d4.tmp", run / ".last.pt.tmp"]  # not the temporary file of a run's
    for path in stale + foreign:
        path.write_bytes(b"left by a kill")
    first = {"time": "2026-11-27T00:00:00", "step": 2, "overrides": []}
    (run / "resumes.jsonl").write_text(json.dumps(first) + '\n{"time": "2026-11-')  # torn by a kill

    with caplog.at_level(logging.INFO, logger="patchword.fileio"):
        resume_run(run, ["train.max_steps=3"])
    assert [p.exists() for p in stale] == [False] * len(stale)
    assert [p.exists() for p in foreign] == [True] * len(foreign)
    assert any(TEMP in r.getMessage() for r in caplog.records)
    lines = (run / "resumes.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line a record: nothing glued
    assert (
        records[0] == first and records[1]["step"] == 2 and records[1]["overrides"] == ["train.max_steps=3"]
    )
    assert len(records) == 2


def test_temporary_files_are_told_from_the_files_beside_them():
    from patchword.fileio import is_temp_of

    assert is_temp_of(TEMP, ["last.pt"]) and is_temp_of(".metrics.jsonl.a_b9.tmp", ["metrics.jsonl"])
    assert not is_temp_of(".metrics.jsonl.a1b2c3d4.tmp", ["metrics.json"])  # another file's
    assert not is_temp_of(".last.pt.tmp", ["last.pt"]) and not is_temp_of("last.pt", ["last.pt"])


def test_recovery_puts_back_only_a_whole_set_and_clears_the_rest(tmp_path):
    """A kill between the two renames of replace_directory leaves the final folder absent and the earlier
    set aside: put back. One being deleted (the kill came after the new set was in) is partial: removed."""
    from patchword.fileio import recover_directory

    whole, partial, stage = (
        tmp_path / f".enc.{label}" for label in ("replaced-a1", "replaced-b2", "export-c3")
    )
    for folder, names in ((whole, ["w", "c"]), (partial, ["c"]), (stage, ["w"])):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(folder.name)
    recover_directory(tmp_path / "enc", required=["w", "c"], staged=["export"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc"]
    assert (tmp_path / "enc" / "w").read_text() == ".enc.replaced-a1"
    (tmp_path / ".enc.replaced-d4").mkdir()  # with the folder in place, anything set aside goes
    recover_directory(tmp_path / "enc", required=["w", "c"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc"] and (tmp_path / "enc" / "c").is_file()
