"""Runs and run-like directories handed to the verbs that read them: damaged pretrained encoders given to
``train``, ``--out`` naming one of the run's own files, ``data export synthetic --run`` of a run on files,
a run of the other kind (hashing / retrieval), an unknown ``hash eval`` override, an empty ``config.yaml``,
``export`` of no run directory. Each ends in one ``error:`` line (exit 2) naming the file, flag or key,
with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from test_bad_inputs import _png_bytes, _snapshot

from conftest import one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "patchword" / "pretrained" / "synthetic-64"


@pytest.fixture(scope="module")
def tiny_run(trained_tiny_run) -> Path:
    return trained_tiny_run


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """A copy of the tiny run that a test may damage."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def _error(capsys) -> str:
    return one_error_line(capsys.readouterr().err)


# ---------------------------------------------------------------------- 1. damaged pretrained encoders

DAMAGED_PRETRAINED = [
    ("truncated weights", "model.safetensors", None, "not a readable weights file"),
    ("config without architecture", "config.json", b"{}", "'architecture'"),
    ("config that is not JSON", "config.json", b"{", "invalid JSON"),
]


@pytest.mark.parametrize(
    ("case", "name", "content", "expected"), DAMAGED_PRETRAINED, ids=[c[0] for c in DAMAGED_PRETRAINED]
)
def test_train_with_damaged_pretrained_encoders_names_the_file(
    tmp_path, capsys, case, name, content, expected
):
    """Bug: a truncated model.safetensors was a SafetensorError traceback, ``{}`` a KeyError 'architecture'
    traceback, ``{`` json's message naming neither the file nor the key."""
    pretrained = Path(shutil.copytree(SHIPPED, tmp_path / "pretrained"))
    damaged = pretrained / name
    damaged.write_bytes(content if content is not None else damaged.read_bytes()[:1000])
    argv = [
        "train",
        "model.name=seps-tiny-paper",
        f"model.tiny_pretrained={pretrained}",
        f"data.vocab_path={pretrained}",
        "data.num_train=20",
        "data.num_dev=8",
        "data.num_test=8",
        "train.max_steps=1",
        "train.num_threads=1",
        f"output_dir={tmp_path / 'runs'}",
        "name=r",
    ]
    assert main(argv) == 2
    line = _error(capsys)
    assert line.startswith(f"error: {damaged}: ") and expected in line, line
    assert not (tmp_path / "runs" / "r").exists()


# ------------------------------------------------------------------- 2. --out naming a file of the run


@pytest.mark.parametrize("name", ["best.pt", "config.yaml", "vocab.json", "metrics.jsonl", "summary.json"])
def test_eval_out_naming_a_file_of_the_run_is_refused_with_force(run_copy, capsys, name):
    """Bug: ``eval RUN --out RUN/best.pt --force`` exited 0 with best.pt replaced by the metrics JSON."""
    before = _snapshot(run_copy)
    assert main(["eval", str(run_copy), "--out", str(run_copy / name), "--force"]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: --out: {run_copy / name} is one of the files of run "), line
    assert _snapshot(run_copy) == before


def test_eval_out_naming_the_checkpoint_it_reads_is_refused(run_copy, tmp_path, capsys):
    """A checkpoint outside the run (``--checkpoint ../other.pt``) is read: --out may not replace it."""
    other = tmp_path / "other.pt"
    shutil.copyfile(run_copy / "best.pt", other)
    assert main(["eval", str(run_copy), "--checkpoint", str(other), "--out", str(other), "--force"]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: --out: {other} is ") and "reads" in line, line
    assert other.read_bytes() == (run_copy / "best.pt").read_bytes()


def test_eval_json_under_a_new_name_in_the_run_is_still_written(run_copy, capsys):
    """Only the run's own files are refused: a new name in the run gets the metrics of a normal eval."""
    assert main(["eval", str(run_copy)]) == 0
    normal = _eval_record(run_copy / "eval_test.json")  # the default --out
    out = run_copy / "eval_again.json"
    assert main(["eval", str(run_copy), "--out", str(out)]) == 0
    assert _eval_record(out) == normal
    out.write_text("{}")
    assert main(["eval", str(run_copy), "--out", str(out), "--force"]) == 0
    assert _eval_record(out) == normal  # replaced with --force


def _eval_record(path: Path) -> dict:
    """An eval JSON without what differs between two evals of one checkpoint (timings, the time)."""
    record = json.loads(path.read_text())
    assert {"rsum", "i2t_r1", "t2i_r1", "checkpoint_sha256"} <= set(record), sorted(record)
    return {k: v for k, v in record.items() if k not in ("cost", "eval_seconds", "time")}


def test_report_out_naming_a_file_of_the_run_is_refused_with_force(run_copy, capsys):
    """Bug: ``report RUN --out RUN/summary.json --force`` wrote the report over the run's summary."""
    before = _snapshot(run_copy)
    assert main(["report", str(run_copy), "--out", str(run_copy / "summary.json"), "--force"]) == 2
    assert _error(capsys).startswith(f"error: --out: {run_copy / 'summary.json'} is one of the files of run")
    assert _snapshot(run_copy) == before


@pytest.mark.parametrize(
    ("flag", "name"), [("--out", "last.pt"), ("--out", "config.yaml"), ("--pr-plot", "eval.json")]
)
def test_hash_eval_output_naming_a_file_of_the_run_is_refused_with_force(hash_run, capsys, flag, name):
    """Bug: ``hash eval RUN --out RUN/last.pt --force`` wrote the metrics over the checkpoint."""
    before = _snapshot(hash_run)
    assert main(["hash", "eval", str(hash_run), flag, str(hash_run / name), "--force"]) == 2
    assert _error(capsys).startswith(f"error: {flag}: {hash_run / name} is one of the files of run ")
    assert _snapshot(hash_run) == before


def test_hash_search_out_naming_its_query_file_or_a_cached_index_is_refused(hash_run, tmp_path, capsys):
    import numpy as np

    query = tmp_path / "q.npy"
    np.save(query, np.zeros((1, 32), dtype=np.float32))
    before = _snapshot(hash_run, tmp_path)
    for out in (query, hash_run / "index_text.npz"):
        argv = ["hash", "search", str(hash_run), "--modality", "image", "--query", str(query)]
        assert main([*argv, "--out", str(out), "--force"]) == 2
        assert _error(capsys).startswith(f"error: --out: {out} is "), out
    assert _snapshot(hash_run, tmp_path) == before


# ------------------------------------------------------------- 3. data export synthetic of a run on files


def test_data_export_synthetic_of_a_run_on_files_is_refused(run_copy, tmp_path, capsys):
    """Bug: a run on data.dataset=precomp exported 1000 default synthetic scenes and exited 0."""
    config = run_copy / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["data"]["dataset"] = "precomp"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "exported"
    assert main(["data", "export", "synthetic", "--run", str(run_copy), "--out", str(out)]) == 2
    line = _error(capsys)
    assert line.startswith("error: --run: ") and "data.dataset=precomp" in line, line
    assert not out.exists()


# ---------------------------------------------------------------------- 4. a run of the other kind


def test_retrieval_verbs_refuse_a_hashing_run_naming_its_kind(hash_run, tmp_path, capsys):
    """Bug: each said "data.format: unknown config key; valid keys of data: ..." (a long list)."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(_png_bytes())
    before = _snapshot(hash_run)
    out = tmp_path / "out"
    for argv in (
        ["eval", str(hash_run), "--out", str(tmp_path / "e.json")],
        ["export", str(hash_run), str(out)],
        ["data", "export", "synthetic", "--run", str(hash_run), "--out", str(out)],
        ["index", "build", str(hash_run), "--images", str(images), "--out", str(out)],
        ["bench", "two-stage", "--quick", "--run-dir", str(hash_run), "--json", str(tmp_path / "b.json")],
    ):
        assert main(argv) == 2, argv
        line = _error(capsys)
        assert f"{hash_run} is a hashing run (patchword hash train), not a retrieval run" in line, line
        assert "unknown config key" not in line
    assert _snapshot(hash_run) == before
    assert not out.exists() and not (tmp_path / "e.json").exists()


def test_hash_verbs_refuse_a_retrieval_run_naming_its_kind(tiny_run, capsys):
    """Bug: "data.dataset: unknown config key; valid keys of data: format, ..."."""
    for argv in (
        ["hash", "eval", str(tiny_run)],
        ["hash", "search", str(tiny_run), "--modality", "image", "--query-index", "0"],
        ["hash", "train", "--resume", str(tiny_run)],
    ):
        assert main(argv) == 2, argv
        line = _error(capsys)
        assert line == f"error: {tiny_run} is a retrieval run (patchword train), not a hashing run " + (
            "(patchword hash train)"
        ), line


# -------------------------------------------------------------------- 5. an unknown hash eval override


def test_hash_eval_unknown_override_is_named_unknown(hash_run, capsys):
    """Bug: "frob: cannot change on a trained run", as if frob were a key of the run."""
    assert main(["hash", "eval", str(hash_run), "frob=1"]) == 2
    line = _error(capsys)
    assert line.startswith("error: frob: unknown config key"), line
    assert main(["hash", "eval", str(hash_run), "model.bits=8"]) == 2
    assert _error(capsys).startswith("error: model.bits: cannot change on a trained run")


# ------------------------------------------------------------------------- 6. an empty config.yaml


@pytest.mark.parametrize("content", ["", "{}\n", "# nothing\n"])
def test_empty_run_config_is_refused_naming_it(run_copy, tmp_path, capsys, content):
    """Bug: eval said "model: the weights in RUN/best.pt do not fit the model..." and a long key list,
    naming no config.yaml."""
    config = run_copy / "config.yaml"
    config.write_text(content)
    for argv in (
        ["eval", str(run_copy), "--out", str(tmp_path / "e.json")],
        ["export", str(run_copy), str(tmp_path / "out")],
    ):
        assert main(argv) == 2, argv
        line = _error(capsys)
        assert line.startswith(f"error: {config}: ") and "empty" in line, line
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------- 7. export of no run directory


def test_export_of_no_run_directory_says_so(tmp_path, capsys):
    """Bug: "checkpoint nope/best.pt does not exist in nope (it has no checkpoint)"."""
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert _error(capsys) == f"error: run directory {tmp_path / 'nope'} does not exist"


def test_export_of_a_checkpoint_file_asks_for_the_run_directory(tiny_run, tmp_path, capsys):
    """Bug: "checkpoint RUN/best.pt/best.pt does not exist in RUN/best.pt"."""
    assert main(["export", str(tiny_run / "best.pt"), str(tmp_path / "out")]) == 2
    assert _error(capsys) == f"error: {tiny_run / 'best.pt'} is a file: give the run directory ({tiny_run})"
    assert not (tmp_path / "out").exists()


def test_the_recipe_of_damaged_pretrained_encoders_names_the_file(tmp_path):
    """Bug: ``pretrained_recipe`` read config.json with a bare ``json.loads``: json's message, no file."""
    from patchword.errors import DataError
    from patchword.recipes.pretrain import pretrained_recipe

    pretrained = Path(shutil.copytree(SHIPPED, tmp_path / "pretrained"))
    (pretrained / "config.json").write_text("{")
    with pytest.raises(DataError, match=f"^{pretrained / 'config.json'}: .*invalid JSON"):
        pretrained_recipe(str(pretrained))
