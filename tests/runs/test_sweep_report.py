"""``patchword sweep`` and ``patchword report``: a sweep killed in its second seed resumes (the first seed's
run is kept as it is, the second continues from its checkpoint and ends where an undisturbed run of that seed
ends) and its summary is the mean and sample standard deviation of its runs' own summaries; a report over
runs lists exactly the config keys that differ."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest
import torch

from conftest import TINY_MODEL_32
from patchword.checkpoint import load_checkpoint
from patchword.cli import main
from patchword.errors import ConfigError
from patchword.experiments.report import collect, differing_keys
from patchword.experiments.sweep import METRICS, parse_seeds
from patchword.runs.config import load_run_config
from patchword.train.process import torch_threads
from patchword.train.runner import train_run
from stall_support import run_until_stalled, stalled_command

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [
    "data.num_train=21",
    "data.num_dev=6",
    "data.num_test=6",
    *TINY_MODEL_32,
    "train.batch_size=16",
    "train.lr=1e-3",
    "train.max_steps=12",
    "train.eval_every=4",
    "train.checkpoint_every=3",
    "train.log_every=1",
    "train.num_threads=1",
    "progress=false",
]


def _train_steps(metrics: Path) -> list[int]:
    steps = []
    for line in metrics.read_text().splitlines() if metrics.is_file() else []:
        try:
            record = json.loads(line)
        except ValueError:  # the line being written when the process was killed
            continue
        if record.get("split") == "train":
            steps.append(record["step"])
    return steps


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> dict:
    """A 2-seed sweep SIGKILLed right after the second seed logged step 6 (its last.pt is the validation
    checkpoint of step 4), then run again. The sweep stalls there until it is killed
    (tests/stall_support.py): the kill never races the sweep's end."""
    root = tmp_path_factory.mktemp("sweep")
    common = [*TINY, f"output_dir={root}", f"data.cache_dir={root / 'cache'}"]
    argv = ["sweep", "--seeds", "0,1", "--name", "sw", *common]
    second = root / "sw" / "seed-1"
    marker = root / "stalled.json"
    cmd = stalled_command(marker, {"at": "train_log", "step": 6, "run": "seed-1"}, argv)
    assert run_until_stalled(cmd, marker, root / "killed.log") == {"step": 6, "checkpoint_step": 4}
    assert not (second / "summary.json").exists()
    first_summary = (root / "sw" / "seed-0" / "summary.json").read_bytes()
    first_weights = (root / "sw" / "seed-0" / "best.pt").read_bytes()
    with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
        assert main(argv) == 0
    return dict(root=root, common=common, first_summary=first_summary, first_weights=first_weights)


def test_a_sweep_killed_in_its_second_seed_keeps_the_first_and_resumes_the_second(sweep):
    sw = sweep["root"] / "sw"
    assert (sw / "seed-0" / "summary.json").read_bytes() == sweep["first_summary"]  # not trained again
    assert (sw / "seed-0" / "best.pt").read_bytes() == sweep["first_weights"]
    assert (sw / "seed-1" / "resumes.jsonl").is_file()  # continued from its checkpoint
    assert _train_steps(sw / "seed-1" / "metrics.jsonl") == list(range(1, 13))  # no step lost or repeated
    # the resumed seed ends exactly where an undisturbed run of that seed ends
    alone = train_run(load_run_config(None, [*sweep["common"], "name=alone", "seed=1"]))
    resumed = json.loads((sw / "seed-1" / "summary.json").read_text())
    assert {k: resumed[k] for k in METRICS} == {k: alone[k] for k in METRICS}
    a = load_checkpoint(sw / "seed-1" / "last.pt")["model"]
    b = load_checkpoint(sweep["root"] / "alone" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_sweep_summary_is_the_mean_and_std_of_its_runs_summaries(sweep):
    record = json.loads((sweep["root"] / "sw" / "sweep.json").read_text())
    runs = [json.loads((sweep["root"] / "sw" / f"seed-{s}" / "summary.json").read_text()) for s in (0, 1)]
    summary = record["summary"]["runs"]
    assert summary["n"] == 2 and record["seeds"] == [0, 1]
    assert set(summary["mean"]) == set(METRICS)
    for key in METRICS:
        values = [r[key] for r in runs]
        assert summary["mean"][key] == pytest.approx(statistics.mean(values), rel=1e-12, abs=1e-12)
        assert summary["std"][key] == pytest.approx(statistics.stdev(values), rel=1e-9, abs=1e-12)
        assert [record["runs"]["runs"][str(s)][key] for s in (0, 1)] == values
    assert summary["protocol"] == {
        "split": "test",
        "images": 6,
        "captions": 30,
        "leaky": False,
        "matcher": "seps",
        "dense_pairing": "image",
        "oracle_rsum": runs[0]["oracle_rsum"],
    }


def test_report_lists_exactly_the_config_keys_that_differ(sweep, tmp_path):
    root = sweep["root"]
    other = [*sweep["common"], "name=other", "seed=1", "train.lr=2e-3", "model.seps.sparse_ratio=0.6"]
    assert main(["train", *other]) == 0
    entries = collect([root / "alone", root / "other"])
    assert sorted(differing_keys(entries)) == ["model.seps.sparse_ratio", "train.lr"]
    assert differing_keys(entries)["train.lr"] == [1e-3, 2e-3]

    out = tmp_path / "report.md"
    paths = [str(root / "sw"), str(root / "alone"), str(root / "other")]
    assert main(["report", *paths, "--out", str(out)]) == 0
    text = out.read_text()
    other_summary = json.loads((root / "other" / "summary.json").read_text())
    assert f"| other | 1 | {other_summary['i2t_r1']:.1f} |" in text
    runs = [json.loads((root / "sw" / f"seed-{s}" / "summary.json").read_text()) for s in (0, 1)]
    rsum = [r["rsum"] for r in runs]
    assert f"{statistics.mean(rsum):.1f} ± {statistics.stdev(rsum):.1f}" in text  # the sweep's row
    # the sweep's row differs from the single runs in its seeds only, `other` also in two keys
    assert sorted(differing_keys(collect([root / "sw", root / "alone", root / "other"]))) == [
        "model.seps.sparse_ratio",
        "seed",
        "train.lr",
    ]
    assert "| model.seps.sparse_ratio | 0.5 | 0.5 | 0.6 |" in text
    assert (tmp_path / "report_curves.png").stat().st_size > 1000
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and "<td>model.seps.sparse_ratio</td>" in page
    assert main(["report", str(root / "alone"), "--out", str(out)]) == 2  # an existing report is kept
    assert out.read_text() == text


def test_sweep_arguments_are_checked_before_anything_runs(tmp_path, capsys):
    assert parse_seeds("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(ConfigError, match=r"^--seeds: expected distinct seeds, got '0,0'$"):
        parse_seeds("0,0")
    with pytest.raises(ConfigError, match=r"^--seeds: expected seeds like 0,1,2 or 0-4, got 'a'$"):
        parse_seeds("a")
    code = main(["sweep", "--seeds", "0", "--variant", "no-colon", f"output_dir={tmp_path}", *TINY])
    assert code == 2 and "--variant" in capsys.readouterr().err
    code = main(["sweep", "--seeds", "0", "--variant", "x: model.nope=1", f"output_dir={tmp_path}", *TINY])
    assert code == 2 and "model.nope" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # nothing written


def test_a_sweep_rerun_with_other_settings_under_the_same_name_is_refused(sweep, capsys):
    """Finished runs are kept only when they were made with the settings asked for now: a changed override
    under the same name would otherwise average two recipes. One line naming the key, nothing touched."""
    sw = sweep["root"] / "sw"
    before = {p: p.read_bytes() for p in sorted(sw.rglob("*")) if p.is_file()}
    code = main(["sweep", "--seeds", "0,1", "--name", "sw", *sweep["common"], "train.lr=2e-3"])
    err = capsys.readouterr().err
    assert code == 2 and "train.lr 0.001 -> 0.002" in err and "another --name" in err
    assert len(err.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in sorted(sw.rglob("*")) if p.is_file()} == before


def test_a_sweep_killed_before_all_its_seeds_finished_is_reported_as_incomplete(sweep, tmp_path):
    """The sweep.json a sweep killed in its second seed leaves (its first seed's run only; f715cbc's
    report showed "seeds 1" with that seed's numbers as if the sweep were done): "1 of 2" and INCOMPLETE."""
    import shutil

    from patchword.experiments.report import _tables

    killed = tmp_path / "killed"
    shutil.copytree(sweep["root"] / "sw", killed)
    record = json.loads((killed / "sweep.json").read_text())
    del record["runs"]["runs"]["1"]  # as written before seed 1 finished
    (killed / "sweep.json").write_text(json.dumps(record))
    (killed / "seed-1" / "summary.json").unlink()  # not finished (with it: finished outside the sweep)
    caption, header, rows = _tables(collect([killed, sweep["root"] / "sw"]))[0]
    seeds = header.index("seeds")
    assert rows[0][0] == "killed (INCOMPLETE)" and rows[0][seeds] == "1 of 2 (missing: 1)"
    assert rows[1][0] == "sw" and rows[1][seeds] == "2"
    assert "INCOMPLETE" in caption and "resumes" in caption
    # the whole report says so too
    out = tmp_path / "report.md"
    assert main(["report", str(killed), "--out", str(out)]) == 0
    assert "| killed (INCOMPLETE) | 1 of 2 (missing: 1) |" in out.read_text()


def test_report_shows_resume_overrides_as_differing_keys_and_names_suite_files_of_other_bytes(
    sweep, tmp_path, capsys
):
    """An extended run (``--resume RUN train.max_steps=15``) differs from its origin in that key although
    its config.yaml keeps 12 (the override lives in resumes.jsonl); a suite file scored before the
    checkpoint it names was rewritten is not shown as that checkpoint's, and is named (f715cbc showed
    neither)."""
    import shutil

    from patchword.experiments.report import _tables

    origin, extended = tmp_path / "origin", tmp_path / "extended"
    shutil.copytree(sweep["root"] / "sw" / "seed-0", origin)
    shutil.copytree(origin, extended)
    assert main(["eval", str(extended), "--suite", "compositional"]) == 0
    assert main(["train", "--resume", str(extended), "train.max_steps=15"]) == 0
    assert "max_steps: 12" in (extended / "config.yaml").read_text()  # the saved config is never rewritten
    entries = collect([origin, extended])
    assert differing_keys(entries) == {"train.max_steps": [12, 15]}
    # the suite scored best.pt; training went on and wrote it again (forced here: a better dev rSum is
    # not guaranteed in 3 steps): the record describes other bytes now, and is not shown as best.pt's
    shutil.copyfile(extended / "last.pt", extended / "best.pt")
    caption, _, rows = _tables(collect([origin, extended]))[1]
    assert [row[0] for row in rows] == ["extended (NOT SHOWN: extended)"]
    assert [cell for cell in rows[0][1:] if cell] == [] and "NOT SHOWN" in caption
    assert main(["eval", str(extended), "--suite", "compositional", "--force"]) == 0  # scored again
    caption, _, rows = _tables(collect([extended]))[1]
    assert rows[0][0] == "extended" and all(rows[0][1:]) and "NOT SHOWN" not in caption
