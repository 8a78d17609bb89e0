"""What a sweep keeps of its members: a seed resumed by hand with other settings is refused (never averaged
with the others), a suite file is reused only when it provably scored the seed's best checkpoint with the
run's settings, ``sweep.json`` records the seeds planned for each variant, and stdout shows each metric's
``mean ± std`` with ``n of planned``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [*TINY_RUN_32, "train.max_steps=2", "progress=false"]


def _sweep(out: Path, seeds: str, *extra: str) -> int:
    return main(["sweep", "--seeds", seeds, "--name", "sw", *TINY, f"output_dir={out}", *extra])


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_seed_resumed_with_other_settings_is_refused_not_averaged(tmp_path, capsys):
    """f715cbc compared config.yaml alone, which a resume never rewrites: after `patchword train --resume
    SEED-1 train.max_steps=6` the same sweep logged "seed-1 is finished: kept" and averaged 2 and 6 steps."""
    assert _sweep(tmp_path, "0,1") == 0
    sw = tmp_path / "sw"
    # a resume with the sweep's own value trained with the sweep's settings: kept
    assert main(["train", "--resume", str(sw / "seed-0"), "train.max_steps=2"]) == 0
    assert _sweep(tmp_path, "0,1") == 0
    assert main(["train", "--resume", str(sw / "seed-1"), "train.max_steps=6"]) == 0
    assert json.loads((sw / "seed-1" / "summary.json").read_text())["steps"] == 6
    capsys.readouterr()
    before = _files(tmp_path)
    assert _sweep(tmp_path, "0,1") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: --name: {sw / 'seed-1'} was resumed with other settings (resume 1 of 1 in resumes.jsonl: "
        "train.max_steps 6 -> 2): give the sweep another --name"
    )
    assert _files(tmp_path) == before  # nothing rewritten: sweep.json keeps the 2-step seeds alone
    record = json.loads((sw / "sweep.json").read_text())
    assert [row["steps"] for row in record["runs"]["runs"].values()] == [2, 2]
    # asking for the 6 steps instead: seed-0 (and seed-1's first session) trained with 2
    assert _sweep(tmp_path, "0,1", "train.max_steps=6") == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: --name: {sw / 'seed-0'} was made with other settings (train.max_steps 2 -> 6)"
    )


@pytest.fixture
def user_suites(tmp_path) -> dict:
    """A 2-seed sweep, then `patchword eval --suite compositional` of seed 0's last.pt and of seed 1 with
    other synthetic scenes (``data.synthetic_seed=3``): files the sweep must not take for its own."""
    assert _sweep(tmp_path, "0,1") == 0
    sw = tmp_path / "sw"
    assert main(["eval", str(sw / "seed-0"), "--suite", "compositional", "--checkpoint", "last.pt"]) == 0
    assert main(["eval", str(sw / "seed-1"), "--suite", "compositional", "data.synthetic_seed=3"]) == 0
    return {seed: (sw / f"seed-{seed}" / "eval_compositional.json").read_bytes() for seed in (0, 1)}


def test_a_suite_file_of_another_checkpoint_or_other_data_is_evaluated_again(tmp_path, user_suites, capsys):
    """f715cbc reused any eval_compositional.json in a seed's directory: the suite of last.pt, or of the
    scenes of another synthetic seed, went into the sweep's mean as the seed's best checkpoint's."""
    assert _sweep(tmp_path, "0,1", "--suite", "compositional") == 0
    sw = tmp_path / "sw"
    record = json.loads((sw / "sweep.json").read_text())
    for seed in (0, 1):
        run = sw / f"seed-{seed}"
        assert (run / "eval_compositional.previous.json").read_bytes() == user_suites[seed]  # set aside
        suite = json.loads((run / "eval_compositional.json").read_text())
        assert Path(suite["checkpoint"]).name == "best.pt"
        assert "seed 3" not in suite["source"]
        row = record["runs"]["runs"][str(seed)]
        for kind in ("attribute_swap", "relation_swap", "object_replace", "count_change"):
            assert row[f"compositional.{kind}"] == suite[kind]  # the figures of the file written now
    assert "set aside as eval_compositional.previous.json" in capsys.readouterr().err


def test_a_suite_record_that_proves_it_scored_the_best_checkpoint_is_reused(tmp_path, monkeypatch):
    """The sweep's own suite record (the sha256 of the seed's best.pt, the run's config.yaml, no overrides:
    runs/recorded.py's suite_evaluation_of, whose rules tests/runs/test_suite_records.py checks) is reused
    by the next invocation; the figures do not count its identity fields (checkpoint_step)."""
    assert _sweep(tmp_path, "0", "--suite", "compositional") == 0
    run = tmp_path / "sw" / "seed-0"
    path = run / "eval_compositional.json"
    before = path.read_bytes()
    first = json.loads((tmp_path / "sw" / "sweep.json").read_text())["runs"]["runs"]["0"]
    # (the run's own checkpoint_step, which summary.json records, is no suite figure)
    assert not any(key.startswith("compositional.") and key.endswith("checkpoint_step") for key in first)

    def refuse(*args, **kwargs):
        raise AssertionError("the suite ran again")

    monkeypatch.setattr("patchword.runs.suites.evaluate_suite", refuse)
    assert _sweep(tmp_path, "0", "--suite", "compositional") == 0
    assert path.read_bytes() == before and not (run / "eval_compositional.previous.json").exists()
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["runs"]["runs"]["0"] == first


def test_each_variant_records_its_planned_seeds_and_stdout_shows_mean_std_and_n_of_planned(tmp_path, capsys):
    """A variant run with --seeds 0 next to one run with --seeds 0,1 (same --name) is complete: f715cbc
    recorded only the union of the seeds, so the first read as 1 of 2 (INCOMPLETE)."""
    assert _sweep(tmp_path, "0", "--variant", "a: train.lr=1e-3") == 0
    assert _sweep(tmp_path, "0,1", "--variant", "b: train.lr=2e-3") == 0
    record = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert record["planned_seeds"] == {"a": [0], "b": [0, 1]} and record["seeds"] == [0, 1]
    out = capsys.readouterr().out.splitlines()
    heads = [line for line in out if not line.startswith(" ")]
    assert heads[-2:] == ["a: 1 of 1 seeds", "b: 2 of 2 seeds"]
    b = record["summary"]["b"]
    rsum = [line for line in out[out.index("b: 2 of 2 seeds") :] if line.split()[0] == "rsum"][0]
    assert rsum.split() == ["rsum", f"{b['mean']['rsum']:.2f}", "±", f"{b['std']['rsum']:.2f}"]


def test_a_sweep_record_without_planned_seeds_reads_with_each_variant_planned_the_sweeps_seeds(tmp_path):
    from patchword.errors import DataError
    from patchword.experiments.sweep import read_sweep

    old = {"seeds": [0, 1], "variants": {"a": []}, "runs": {"a": {"0": {}}, "b": {"0": {}, "1": {}}}}
    (tmp_path / "sweep.json").write_text(json.dumps(old))
    assert read_sweep(tmp_path)["planned_seeds"] == {"a": [0, 1], "b": [0, 1]}
    (tmp_path / "sweep.json").write_text(json.dumps(old | {"planned_seeds": {"a": ["0"]}}))
    with pytest.raises(DataError, match="sweep.json: not a sweep record: 'planned_seeds' must map"):
        read_sweep(tmp_path)


def test_the_summary_shows_mean_std_and_n_of_planned_for_every_variant():
    from patchword.cli.sweep import format_summary

    record = {
        "directory": "/runs/lr-probe",
        "variants": {"a": [], "b": []},
        "planned_seeds": {"a": [0, 1], "b": [0, 1]},
        "summary": {
            "a": {"n": 1, "mean": {"rsum": 300.0, "i2t_medr": 8.0}, "std": {"rsum": 0.0, "i2t_medr": 0.0}}
        },
    }
    assert format_summary(record).splitlines() == [
        "a: 1 of 2 seeds (INCOMPLETE)",
        "  rsum      300.00 ± 0.00",
        "  i2t_medr    8.00 ± 0.00",
        "b: 0 of 2 seeds (INCOMPLETE)",
    ]
    plain = {"directory": "/runs/demo-sweep", "variants": {}, "planned_seeds": {"runs": [0]}, "summary": {}}
    assert format_summary(plain) == "demo-sweep: 0 of 1 seeds (INCOMPLETE)"
