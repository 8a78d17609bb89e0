"""A hostile-input review of ``eval``, ``report`` and ``train --resume`` (review B1): another run's or an
export's recorded files given as ``--out --force``, two report outputs under one name, a suite option the
suite ignores, suite-file captions without words or without a known word, damaged figures and digests in
the files ``report`` reads, an ``--ensemble`` file in no run, a damaged middle line of ``metrics.jsonl``.
Each is one ``error:`` line naming the file, record, flag or key, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from conftest import one_error_line
from patchword.cli import main
from patchword.errors import DataError
from patchword.fileio import keep_jsonl_records

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(trained_tiny_run, tmp_path_factory) -> dict[str, Path]:
    """The tiny run, a second run (a copy) and an export of the first."""
    root = tmp_path_factory.mktemp("b1")
    other = Path(shutil.copytree(trained_tiny_run, root / "other"))
    assert main(["export", str(trained_tiny_run), str(root / "model")]) == 0
    return {"run": trained_tiny_run, "other": other, "model": root / "model"}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _error(capsys) -> str:
    return one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------- another run's or an export's records


@pytest.mark.parametrize(
    ("folder", "name", "what"),
    [
        ("other", "metrics.json", "run"),
        ("other", "summary.json", "run"),
        ("other", "last.pt", "run"),
        ("other", "export/model.safetensors", "run"),
        ("model", "metrics.json", "model directory"),
        ("model", "README.md", "model directory"),
        ("other", "eval_test.json", "run"),
    ],
)
def test_eval_out_naming_a_record_of_another_run_or_an_export_is_refused_with_force(
    runs, capsys, folder, name, what
):
    """Old code: ``eval RUN --out OTHER_RUN/metrics.json --force`` (or an export's metrics.json, its model
    card) replaced the other run's record with this run's metrics: only the runs read were protected."""
    before = _snapshot(runs[folder])
    out = runs[folder] / name
    assert main(["eval", str(runs["run"]), "--out", str(out), "--force"]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: --out: {out} is one of the files of {what} "), line
    assert _snapshot(runs[folder]) == before


def test_report_out_naming_another_runs_summary_is_refused_with_force(runs, capsys):
    before = _snapshot(runs["other"])
    out = runs["other"] / "summary.json"
    assert main(["report", str(runs["run"]), "--out", str(out), "--force"]) == 2
    assert _error(capsys).startswith(f"error: --out: {out} is one of the files of run ")
    assert _snapshot(runs["other"]) == before


def test_a_new_name_in_another_run_is_still_written(runs, tmp_path):
    """Only a run's records are refused: a file of a name no run records goes where it is asked."""
    out = tmp_path / "elsewhere.json"
    assert main(["eval", str(runs["run"]), "--out", str(out)]) == 0
    assert "rsum" in json.loads(out.read_text())


# ---------------------------------------------------------------------- two report outputs in one file


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--out", "r.html"], "error: --out: r.html is an HTML name: --out names the Markdown file"),
        (["--out", "r.md", "--csv", "r.md"], "error: --csv: r.md is one of the files --out r.md writes"),
        (["--out", "r.md", "--csv", "r_curves.png"], "error: --csv: r_curves.png is one of the files --out"),
    ],
)
def test_report_outputs_sharing_one_file_are_refused(runs, tmp_path, capsys, monkeypatch, args, expected):
    """Old code: ``--out r.md --csv r.md --force`` wrote the CSV over the Markdown, ``--out r9.html`` the
    HTML over the Markdown (each path was checked alone)."""
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(runs["run"]), *args, "--force"]) == 2
    assert _error(capsys).startswith(expected)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- suites' ignored settings


def test_an_eval_split_override_with_the_compositional_suite_is_refused(runs, tmp_path, capsys):
    """Old code: ``--suite compositional eval.split=dev`` scored the test split and wrote a record whose
    overrides said dev."""
    out = tmp_path / "suite.json"
    args = ["eval", str(runs["run"]), "--suite", "compositional", "--out", str(out), "eval.split=dev"]
    assert main(args) == 2
    assert _error(capsys).startswith("error: eval.split: is not read by --suite compositional")
    assert not out.exists()


# ---------------------------------------------------------------------------------- suite-file texts


def _suite_file(folder: Path, records: list[dict]) -> Path:
    Image.new("RGB", (32, 32), (200, 40, 40)).save(folder / "red.png")
    path = folder / "swap_att.json"
    path.write_text(json.dumps(records))
    return path


GOOD = {"filename": "red.png", "caption": "a red circle", "negative_caption": "a blue circle"}


def test_a_suite_negative_caption_without_words_names_file_record_and_field(runs, tmp_path, capsys):
    """Old code: ``error: text 9 is empty (no words): '!!!'``: an index into every text encoded."""
    suite = _suite_file(tmp_path, [GOOD, GOOD, {**GOOD, "negative_caption": "!!!"}])
    out = tmp_path / "out.json"
    assert main(["eval", str(runs["run"]), "--suite-file", str(suite), "--out", str(out)]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: {suite}: record 2: its negative_caption '!!!' has no words"), line
    assert not out.exists()


def test_suite_captions_of_unknown_words_only_are_counted_in_one_warning(runs, tmp_path, capsys):
    """Old code: a caption of words the run's vocabulary lacks was scored as <unk> alone, unsaid."""
    records = [GOOD, {**GOOD, "caption": "zzz qqq"}, {**GOOD, "negative_caption": "xyzzy"}]
    suite = _suite_file(tmp_path, records)
    assert (
        main(["eval", str(runs["run"]), "--suite-file", str(suite), "--out", str(tmp_path / "o.json")]) == 0
    )
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "WARNING" in line and "vocabulary" in line]
    assert len(warnings) == 1, warnings
    assert "2 of the 6 captions of the suite files have no word the run's vocabulary knows" in warnings[0]
    assert f"{suite}: record 1 (caption); {suite}: record 2 (negative_caption)" in warnings[0]


def test_a_suite_image_that_is_a_directory_is_said_to_be_one(runs, tmp_path, capsys):
    """Old code: a directory named as a suite image was reported as not existing."""
    suite = _suite_file(tmp_path, [{**GOOD, "filename": "folder"}])
    (tmp_path / "folder").mkdir()
    assert (
        main(["eval", str(runs["run"]), "--suite-file", str(suite), "--out", str(tmp_path / "o.json")]) == 2
    )
    line = _error(capsys)
    assert f"(first: {tmp_path / 'folder'}, a directory)" in line, line


# ---------------------------------------------------------------------- what report reads, damaged


def _damaged_copy(source: Path, tmp_path: Path, name: str, **changes) -> Path:
    run = Path(shutil.copytree(source, tmp_path / source.name))
    record = json.loads((run / name).read_text())
    (run / name).write_text(json.dumps({**record, **changes}))  # NaN as json writes it: NaN
    return run


@pytest.mark.parametrize(
    ("changes", "shown"), [({"rsum": float("nan")}, "rsum is NaN"), ({"steps": -5}, "steps is -5")]
)
def test_a_summary_figure_that_is_nan_or_negative_is_refused_naming_file_and_key(
    runs, tmp_path, capsys, changes, shown
):
    """Old code: ``"rsum": NaN`` was shown as nan with a Pareto star, ``"steps": -5`` as ``2 / -5``."""
    run = _damaged_copy(runs["run"], tmp_path, "summary.json", **changes)
    out = tmp_path / "r.md"
    assert main(["report", str(run), "--out", str(out)]) == 2
    assert _error(capsys) == f"error: {run / 'summary.json'}: {shown}, not a finite number >= 0"
    assert not out.exists()


def test_an_export_digest_that_is_no_string_is_refused_naming_metrics_json(runs, tmp_path, capsys):
    """Old code: ``weights_sha256: 5`` in an export's metrics.json showed its row NOT EVALUATED, unsaid."""
    model = _damaged_copy(runs["model"], tmp_path, "metrics.json", weights_sha256=5)
    out = tmp_path / "r.md"
    assert main(["report", str(model), "--out", str(out)]) == 2
    assert _error(capsys) == f"error: {model / 'metrics.json'}: weights_sha256 is 5, not a string"
    assert not out.exists()


def test_evaluating_an_export_whose_digest_is_no_string_names_metrics_json(runs, tmp_path, capsys):
    """Old code: ``weights_sha256: 5`` made eval say the weights file was damaged."""
    model = _damaged_copy(runs["model"], tmp_path, "metrics.json", weights_sha256=5)
    assert main(["eval", str(model), "--out", str(tmp_path / "e.json")]) == 2
    assert _error(capsys) == f"error: {model / 'metrics.json'}: weights_sha256 is 5, not a string"


def test_eval_out_may_name_the_evaluated_runs_own_evaluation(runs, tmp_path):
    """eval_test.json is refused in another run, not in the run evaluated (its default output)."""
    run = Path(shutil.copytree(runs["run"], tmp_path / "own"))
    assert main(["eval", str(run), "--out", str(run / "eval_test.json"), "--force"]) == 0


def test_an_ensemble_file_in_no_run_directory_names_the_flag(runs, tmp_path, capsys, monkeypatch):
    """Old code: ``--ensemble tiny.args`` (a file) said ``error: . is not a run directory``."""
    monkeypatch.chdir(tmp_path)
    Path("tiny.args").write_text("train.max_steps=2")
    assert main(["eval", str(runs["run"]), "--ensemble", "tiny.args", "--out", "e.json"]) == 2
    assert _error(capsys).startswith("error: --ensemble: tiny.args is a file in no run directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.args"]


# ------------------------------------------------------------------------ a damaged metrics.jsonl line


def _jsonl(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("\n".join(lines) + end)
    return path


def test_only_a_torn_last_line_is_dropped(tmp_path):
    """Old code: keep_jsonl_records dropped any unparsable line, a damaged middle record among them."""
    records = [json.dumps({"step": s}) for s in (1, 2, 3)]
    torn = _jsonl(tmp_path / "torn.jsonl", [*records, '{"step": 4, "lo'], end="")
    assert keep_jsonl_records(torn, lambda r: True) == 1
    assert torn.read_text() == "".join(f"{r}\n" for r in records)
    middle = _jsonl(tmp_path / "middle.jsonl", [records[0], '{"step": 2, "lo', records[2]])
    before = middle.read_bytes()
    with pytest.raises(DataError, match=rf"^{middle}:2: not a JSONL record: invalid JSON"):
        keep_jsonl_records(middle, lambda r: True)
    # a last line that ends with its newline was written whole: damaged, it is no torn append either
    last = _jsonl(tmp_path / "last.jsonl", [*records[:2], "[1, 2]"])
    with pytest.raises(DataError, match=rf"^{last}:3: not a JSONL record: expected a JSON object"):
        keep_jsonl_records(last, lambda r: True)
    fields = _jsonl(tmp_path / "fields.jsonl", [records[0], json.dumps({"loss": 1.0})])
    with pytest.raises(DataError, match=rf"^{fields}:2: a record with a field missing"):
        keep_jsonl_records(fields, lambda r: r["step"] <= 1)
    assert middle.read_bytes() == before


def test_resume_refuses_a_damaged_middle_line_of_metrics_jsonl_and_keeps_it(
    trained_tiny_run, tmp_path, capsys
):
    run = Path(shutil.copytree(trained_tiny_run, tmp_path / "run"))
    (run / "summary.json").unlink()  # interrupted: resumable
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    _jsonl(run / "metrics.jsonl", lines)
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "train.max_steps=3"]) == 2
    assert _error(capsys).startswith(f"error: {run / 'metrics.jsonl'}:2: not a JSONL record: invalid JSON")
    assert _snapshot(run) == before
