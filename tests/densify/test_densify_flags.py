"""densify's flags refused before any work, each error one line naming the flag: a sampling setting that is
not a number or that greedy decoding would ignore, an --out that cannot be written (a directory, a folder
that takes no files) for a run and a merge, --token-limits that are no token counts, a --bert-vocab that is
not there, and a file where a folder is expected (or the other way round)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from conftest import one_error_line
from patchword.cli.densify import main

pytestmark = pytest.mark.usefixtures("one_thread")

SYNTHETIC = ["--synthetic", "test", "--synthetic-num-images", "2", "--model", "tiny-random", "--no-progress"]


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if densify gets as far as loading the model."""
    from patchword.densify import vlm

    monkeypatch.setattr(vlm, "load_vlm", lambda *a, **k: pytest.fail("the model was loaded"))


def _dense_file(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a red circle", "a blue square")))
    return path


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# --------------------------------------------------------------------------------------------------------
# sampling flags
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_a_temperature_that_is_not_a_positive_number_is_refused_before_the_model_loads(
    value, tmp_path, capsys, no_model
):
    out = tmp_path / "d.jsonl"
    assert main([*SYNTHETIC, "--sample", f"--temperature={value}", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --temperature: must be a positive finite number"), line
    assert _tree(tmp_path) == []


@pytest.mark.parametrize(("flag", "value"), [("--temperature", "0.5"), ("--top-p", "0.5"), ("--seed", "3")])
def test_a_sampling_flag_without_sample_is_refused_naming_both(flag, value, tmp_path, capsys, no_model):
    assert main([*SYNTHETIC, flag, value, "--out", str(tmp_path / "d.jsonl")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {flag}: ") and "--sample" in line, line
    assert _tree(tmp_path) == []


def test_sampling_flags_with_sample_reach_the_settings_and_default_otherwise(tmp_path, monkeypatch):
    from patchword.densify import runner

    seen = []

    def record(images, load, out, settings, **kwargs):
        seen.append(settings)
        return runner.DensifyResult(Path(out), 2, 2)

    monkeypatch.setattr(runner, "densify", record)
    out = str(tmp_path / "d.jsonl")
    assert main([*SYNTHETIC, "--sample", "--temperature", "0.5", "--seed", "7", "--out", out]) == 0
    assert main([*SYNTHETIC, "--sample", "--out", out]) == 0
    assert main([*SYNTHETIC, "--out", out]) == 0
    sampled, default_sampling, greedy = seen
    assert (sampled.do_sample, sampled.temperature, sampled.top_p, sampled.seed) == (True, 0.5, 0.9, 7)
    assert (default_sampling.temperature, default_sampling.top_p, default_sampling.seed) == (0.2, 0.9, 0)
    assert not greedy.do_sample and "temperature" not in greedy.as_dict()


# --------------------------------------------------------------------------------------------------------
# --out
# --------------------------------------------------------------------------------------------------------


def _refuse_files(monkeypatch, code: int = errno.EACCES) -> None:
    """Make every folder refuse new files, as a read-only (EACCES) or a /proc-like (ENOENT) folder does."""

    def refuse(code):
        def call(*args, **kwargs):
            raise OSError(code, os.strerror(code))

        return call

    monkeypatch.setattr("tempfile.mkstemp", refuse(code))
    # the lock file: EACCES, as ENOENT there makes the lock retry (its folder "removed by another command")
    monkeypatch.setattr(os, "open", refuse(errno.EACCES))


@pytest.mark.parametrize("code", [errno.EACCES, errno.ENOENT])
def test_an_out_whose_folder_takes_no_files_is_refused_naming_it_not_a_rerun(
    code, tmp_path, capsys, monkeypatch, no_model
):
    out = tmp_path / "ro" / "d.jsonl"
    _refuse_files(monkeypatch, code)
    assert main([*SYNTHETIC, "--out", str(out)]) == 2
    monkeypatch.undo()
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --out: {out} cannot be written: "), line
    assert os.strerror(code) in line and errno.errorcode[code] in line, line
    # nothing was written, so "rerun the same command: finished images are kept" would mislead
    assert "rerun" not in line and "[Errno" not in line, line
    assert _tree(tmp_path) == []


def test_an_out_that_is_a_directory_is_refused_before_the_lock(tmp_path, capsys, no_model):
    out = tmp_path / "dense"
    out.mkdir()
    assert main([*SYNTHETIC, "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --out: {out} is a directory: --out names the JSONL file to write"
    )
    assert _tree(tmp_path) == ["dense"]


def test_a_torchrun_out_that_is_a_directory_is_refused_before_it_is_read(
    tmp_path, capsys, monkeypatch, no_model
):
    out = tmp_path / "dense"
    out.mkdir()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main([*SYNTHETIC, "--out", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: --out: {out} is a directory: --out names the JSONL file to write"
    )
    assert _tree(tmp_path) == ["dense"]


def test_merge_into_a_directory_is_refused_before_the_shards_are_read(tmp_path, capsys, monkeypatch):
    from patchword.densify import shards

    monkeypatch.setattr(shards, "_read_shard", lambda path: pytest.fail(f"{path} was read"))
    parts = [_dense_file(tmp_path / f"sh{i}.jsonl") for i in range(2)]
    out = tmp_path / "merged"
    out.mkdir()
    before = _tree(tmp_path)
    assert main(["merge", *map(str, parts), "--out", str(out), "--force"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: --out: {out} is a directory: --out names the JSONL file to write", line
    assert _tree(tmp_path) == before  # no lock file, no staging folder


def test_merge_into_a_folder_that_takes_no_files_is_refused_naming_out(tmp_path, capsys, monkeypatch):
    from patchword.densify import shards

    monkeypatch.setattr(shards, "_read_shard", lambda path: pytest.fail(f"{path} was read"))
    parts = [_dense_file(tmp_path / f"sh{i}.jsonl") for i in range(2)]
    out = tmp_path / "m.jsonl"
    _refuse_files(monkeypatch)
    assert main(["merge", *map(str, parts), "--out", str(out)]) == 2
    monkeypatch.undo()
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --out: {out} cannot be written: ") and "EACCES" in line, line


# --------------------------------------------------------------------------------------------------------
# a file where a folder is expected, and the other way round
# --------------------------------------------------------------------------------------------------------


def test_images_naming_a_file_says_so(tmp_path, capsys):
    listed = _dense_file(tmp_path / "train.out")
    assert main(["--images", str(listed), "--model", "tiny-random", "--out", str(tmp_path / "d.jsonl")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: --images: {listed} is a file, not a folder: --images names the folder of images"


def test_a_directory_given_as_a_shard_or_a_stats_file_says_so(tmp_path, capsys):
    folder = tmp_path / "adir"
    folder.mkdir()
    assert main(["merge", str(folder), "--out", str(tmp_path / "m.jsonl")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{folder} is a directory, not a file" in line and "not found" not in line, line
    assert main(["stats", str(folder)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{folder} is a directory, not a file" in line and "not found" not in line, line


# --------------------------------------------------------------------------------------------------------
# stats
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limits", [["0"], ["90", "-5"], ["0", "-5"]])
def test_token_limits_below_one_are_refused(limits, tmp_path, capsys):
    dense = _dense_file(tmp_path / "d.jsonl")
    assert main(["stats", str(dense), "--token-limits", *limits]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert line.startswith("error: --token-limits: must be BERT token counts of at least 1"), line
    assert captured.out == ""


def test_token_limits_of_one_and_more_are_reported(tmp_path, capsys):
    dense = _dense_file(tmp_path / "d.jsonl")
    assert main(["stats", str(dense), "--token-limits", "1", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(dense)]["over_limit"] == {"1": 1.0, "4": 1.0}


@pytest.mark.parametrize("name", ["nope.txt", "./nope.txt", "missing/vocab.txt"])
def test_a_bert_vocab_that_is_not_there_names_the_flag_and_the_path(name, tmp_path, capsys, monkeypatch):
    dense = _dense_file(tmp_path / "d.jsonl")
    monkeypatch.chdir(tmp_path)
    assert main(["stats", str(dense), "--bert-vocab", name]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert line.startswith(f"error: --bert-vocab: {name} does not exist"), line
    assert "hf_local_files_only" not in line and "model directory" not in line, line
    assert captured.out == ""
