"""What training records for the report, and what the report reads of a real run, its resumes and its
exports (the tiny run of tests/conftest.py, trained once for the module): the machine each training session
ran on, the earlier evaluation a resume replaces, the evaluation an exported directory carries."""

from __future__ import annotations

import json
import shutil

import pytest

from patchword.cli import main
from patchword.device import cpu_model
from patchword.experiments.cost import cost_rows
from patchword.experiments.report import _tables, collect

pytestmark = pytest.mark.usefixtures("one_thread")


def _column(table, column: str) -> dict[str, str]:
    caption, header, rows = table
    return {row[0]: row[header.index(column)] for row in rows}


def _summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_an_export_shows_its_evaluation_only_while_it_holds_the_weights_it_measured(
    trained_tiny_run, tmp_path
):
    """`patchword report RUN EXPORT` read the export record (figures nested under "metrics") as the row's
    evaluation: an evaluated, complete row with empty figures, for an export of best.pt and of last.pt."""
    best, last = tmp_path / "best", tmp_path / "last"
    assert main(["export", str(trained_tiny_run), str(best)]) == 0
    assert main(["export", str(trained_tiny_run), str(last), "--checkpoint", "last.pt"]) == 0
    tampered = shutil.copytree(best, tmp_path / "tampered")
    weights = bytearray((tampered / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # other weights than the export recorded (its sha256)
    (tampered / "model.safetensors").write_bytes(bytes(weights))
    entries = collect([trained_tiny_run, best, last, tampered])
    table = _tables(entries)[0]
    rsum = f"{_summary(trained_tiny_run)['rsum']:.1f}"
    assert _column(table, "rsum") == {
        "tiny": rsum,
        "best": rsum,
        "last (NOT EVALUATED)": "",
        "tampered (NOT EVALUATED)": "",
    }
    assert _column(table, "split (images / captions)")["best"] == "test (8 / 40)"


def test_a_resume_that_evaluates_a_finished_run_otherwise_keeps_the_earlier_result(
    trained_tiny_run, tmp_path
):
    """`patchword train --resume RUN eval.split=dev` of a finished run wrote its dev figures over the test
    summary.json and metrics.json, keeping neither."""
    run = shutil.copytree(trained_tiny_run, tmp_path / "run")
    test = (run / "summary.json").read_bytes()
    metrics = (run / "metrics.json").read_bytes()
    assert main(["train", "--resume", str(run), "eval.split=dev"]) == 0
    assert (run / "summary.previous.json").read_bytes() == test
    assert (run / "metrics.previous.json").read_bytes() == metrics
    assert _summary(run)["split"] == "dev" and json.loads(test)["split"] == "test"
    # evaluated again as the last session did: the same figures, nothing else to keep
    assert main(["train", "--resume", str(run), "eval.split=dev"]) == 0
    assert (run / "summary.previous.json").read_bytes() == test


def test_each_training_session_records_the_machine_it_trained_on(trained_tiny_run, tmp_path):
    """The training time's cells were labelled with the final evaluation's machine (its threads, not
    train.num_threads), and a run resumed with other threads blended both sessions' steps into one rate."""
    (session,) = _summary(trained_tiny_run)["train_sessions"]
    assert session["threads"] == 1 and session["timed_steps"] == 2 and session["world_size"] == 1
    assert session["device_name"] == (cpu_model() if session["device"] == "cpu" else session["device_name"])
    run = shutil.copytree(trained_tiny_run, tmp_path / "run")
    assert main(["train", "--resume", str(run), "train.max_steps=3", "train.num_threads=2"]) == 0
    sessions = _summary(run)["train_sessions"]
    assert [(s["threads"], s["timed_steps"]) for s in sessions] == [(1, 2), (2, 1)]
    cost = cost_rows(collect([trained_tiny_run, run]), {})
    machines = _column(cost, "train machine")
    assert machines["tiny"].endswith(", 1 thread") and machines["run"].startswith("MIXED: ")
    assert "2 threads (1 session)" in machines["run"] and _column(cost, "train steps/s")["run"] == "mixed"
    # a resume of the finished run trains no step: no session of its own
    assert main(["train", "--resume", str(run), "train.max_steps=3", "train.num_threads=2"]) == 0
    assert _summary(run)["train_sessions"] == sessions


def test_a_resume_from_an_older_checkpoint_counts_its_sessions_on_an_unknown_machine():
    """A last.pt written before sessions were recorded: its training time is there, its machine is not."""
    from patchword.train.times import RunTimes

    machine = {"device": "cpu", "device_name": "Xeon", "threads": 2, "world_size": 1}
    times = RunTimes(lambda: 0.0)
    times.begin_session(machine)  # before the checkpoint's state is loaded, as a resume does
    times.load({"train_seconds": 5.0, "times": {"steps": 4.0, "timed_steps": 4}})
    times.end_step()
    assert times.report()["train_sessions"] == [{"timed_steps": None}, {**machine, "timed_steps": 1}]
    again = RunTimes(lambda: 0.0)
    again.begin_session({**machine, "threads": 1})
    again.load({"train_seconds": 6.0, "times": {**times.totals, "steps": 5.0}})  # what last.pt keeps
    assert [s.get("threads") for s in again.report()["train_sessions"]] == [None, 2]  # none trained yet
