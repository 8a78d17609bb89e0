"""What ``patchword report`` left unsaid or said wrongly (review O), from hand-made run directories
(``config.yaml`` and the records an evaluation writes; no training):

* a sweep seed continued with ``patchword train --resume`` (as the sweep's interruption message said) was
  "missing"; the sweep now says to run the sweep command again;
* an evaluation made with overrides, an unmeasured COCO 1K row, an imported checkpoint's "step 0", a
  sweep seed without its suite record, a two-stage search's time: each said nothing, or something wrong;
* the device memory of a training process's evaluation counted its optimizer state and gradients;
* the CSV left out figures the Markdown shows; a GPU gallery file's caption named the CPU.
"""

from __future__ import annotations

import csv
import json
import logging
import signal
from pathlib import Path

import torch
import yaml

from patchword.eval.metrics import RECALL_KEYS
from patchword.experiments.cost import cost_rows
from patchword.experiments.entries import collect
from patchword.experiments.gallery_table import gallery_rows
from patchword.experiments.report import _tables, write_report
from patchword.runs.load import config_hash
from patchword.runs.recorded import checkpoint_facts, file_sha256

XEON = {"device": "cpu", "device_name": "Xeon", "threads": 4, "world_size": 1, "precision": "fp32"}
SUITE = {"attribute_swap": 60.0, "relation_swap": 70.0, "object_replace": 55.0, "count_change": 40.0}


def _summary(rsum: float = 300.0, **extra) -> dict:
    cost = {**XEON, "exhaustive": True, "scoring_seconds": 1.0, "pairs": 5_000_000}
    recalls = {key: rsum / 6 for key in RECALL_KEYS} | {"rsum": rsum}
    return {
        **recalls,
        "split": "test",
        "images": 1000,
        "captions": 5000,
        "leaky": False,
        "cost": cost,
        **extra,
    }


def _run(directory: Path, summary: dict | None = None, config: dict | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({"seed": 0, **(config or {})}))
    if summary is not None:
        (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def _best(run: Path, **state) -> Path:
    torch.save({"model": {}, "step": 3, **state}, run / "best.pt")
    return run / "best.pt"


def _identity(run: Path, **extra) -> dict:
    """What an evaluation record says of the checkpoint it scored (``evaluation_identity``)."""
    return {
        "run_dir": str(run),
        "checkpoint": str(run / "best.pt"),
        "checkpoint_sha256": file_sha256(run / "best.pt"),
        "config_hash": config_hash(run),
        "overrides": [],
        **extra,
    }


def _suite(run: Path) -> None:
    """``eval_compositional.json`` of the run's best.pt, as ``patchword eval --suite`` writes it."""
    record = {**SUITE, "n": dict.fromkeys(SUITE, 20), "suite": "compositional", "suite_files": []}
    (run / "eval_compositional.json").write_text(json.dumps(record | _identity(run)))


def _sweep(sw: Path, listed: list[int], seeds: list[int], summaries: dict[int, dict]) -> Path:
    """A sweep directory whose ``sweep.json`` planned ``seeds`` and lists ``listed`` as finished."""
    for seed, summary in summaries.items():
        _run(sw / f"seed-{seed}", summary, {"seed": seed})
    runs = {str(s): {"rsum": summaries[s]["rsum"]} for s in listed}
    record = {"config": None, "overrides": [], "summary": {}, "seeds": seeds, "variants": {}}
    (sw / "sweep.json").write_text(json.dumps(record | {"runs": {"runs": runs}}))
    return sw


def _column(table, column: str) -> dict[str, str]:
    caption, header, rows = table[:3]
    return {row[0]: row[header.index(column)] for row in rows}


def _csv_rows(entries_paths: list[Path], tmp_path: Path, **options) -> dict[str, dict[str, str]]:
    out = tmp_path / "report" / "r.md"
    out.parent.mkdir(exist_ok=True)
    write_report(entries_paths, out, csv=out.with_suffix(".csv"), **options)
    return {row["run"]: row for row in csv.DictReader(out.with_suffix(".csv").open())}


# --------------------------------------------------------------------------- 1. a sweep's interruption


def test_a_sweep_run_interrupted_says_to_run_the_sweep_again(tmp_path, monkeypatch):
    """The message said `patchword train --resume RUN/seed-1`: doing that finished the seed, but the sweep's
    record never listed it, and the report called it missing."""
    from patchword.experiments import sweep

    hints = {}

    def train_run(cfg, *, data=None, hint=None):
        hints["train"] = hint
        return _summary()

    def resume_run(run_dir, overrides=(), *, hint=None):
        hints["resume"] = hint
        return _summary()

    monkeypatch.setattr("patchword.train.runner.train_run", train_run)
    monkeypatch.setattr("patchword.train.runner.resume_run", resume_run)
    monkeypatch.setattr(sweep, "check_existing_member", lambda *args: None)
    (tmp_path / "sw" / "seed-1").mkdir(parents=True)
    torch.save({}, tmp_path / "sw" / "seed-1" / "last.pt")  # seed 1 was interrupted: it is resumed
    sweep.run_sweep(None, [0, 1], [f"output_dir={tmp_path}"], name="sw")
    for how in ("train", "resume"):
        said = hints[how].stopped(signal.SIGTERM, 7, tmp_path / "sw" / "seed-1" / "last.pt")
        assert "continue by running the same `patchword sweep` command again" in said, said
        assert str(tmp_path / "sw" / "sweep.json") in said
        assert "running the same `patchword sweep` command again continues it" in hints[how].before_resumed()


def test_a_seed_finished_outside_the_sweep_is_not_called_missing(tmp_path, caplog):
    sw = _sweep(tmp_path / "sw", [0], [0, 1], {0: _summary(300.0), 1: _summary(310.0)})
    with caplog.at_level(logging.WARNING, logger="patchword.experiments.entries"):
        entries = collect([sw])
    seeds = _column(_tables(entries)[0], "seeds")["sw (INCOMPLETE)"]
    assert seeds == "1 of 2 (finished outside the sweep: 1; rerun the sweep command to record it)"
    assert "missing" not in seeds and entries[0].missing == [] and entries[0].outside == [1]
    assert "finished outside the sweep" in _tables(entries)[0][0]
    assert "seed-1: finished outside the sweep" in caplog.text
    # a seed neither listed nor finished is still missing
    gone = _sweep(tmp_path / "gone", [0], [0, 1], {0: _summary(300.0)})
    assert _column(_tables(collect([gone]))[0], "seeds")["gone (INCOMPLETE)"] == "1 of 2 (missing: 1)"


# --------------------------------------------------------------------------- 2. evaluations not shown


def test_an_evaluation_made_with_overrides_is_named_with_why_it_is_not_shown(tmp_path, caplog):
    """eval_test.json made with data.max_caption_len=20 was ignored unsaid: "no evaluation recorded"."""
    run = _run(tmp_path / "imp4")
    _best(run)
    record = _summary() | _identity(run, overrides=["progress=false", "data.max_caption_len=20"])
    (run / "eval_test.json").write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="patchword.experiments.entries"):
        entries = collect([run])
    caption, header, rows = _tables(entries)[0][:3]
    assert rows[0][0] == "imp4 (NOT EVALUATED: eval_test.json not used)"
    assert rows[0][header.index("split (images / captions)")] == (
        "not evaluated (eval_test.json: made with overrides that change what it measures "
        "(data.max_caption_len=20))"
    )
    assert "eval_test.json not used" in cost_rows(entries, {})[2][0][0]
    assert "FILE not used" in caption and "`patchword eval RUN` without such overrides" in caption
    assert "eval_test.json: not the run's evaluation, not shown: made with overrides" in caption + caplog.text
    # a file of another checkpoint says so
    (run / "eval_test.json").write_text(json.dumps(_summary() | _identity(run, checkpoint=str(run / "x.pt"))))
    (entry,) = collect([run])
    assert entry.unused == [[("eval_test.json", f"of another checkpoint ({run / 'x.pt'})")]]


def test_a_coco_1k_row_not_measured_says_why(tmp_path):
    """An imported COCO checkpoint evaluated without eval.coco_1k had an empty "measured here" row."""
    opt = {"bi_gru": True, "data_name": "coco_precomp", "cross_attn": "t2i", "agg_func": "Mean"}
    data = {"dataset": "precomp", "root": "data/coco_precomp", "test_split": "testall"}
    run = _run(tmp_path / "coco", _summary(), {"data": data})
    (run / "import.json").write_text(json.dumps({"family": "scan", "opt": opt | {"lambda_softmax": 9.0}}))
    published = next(t for t in _tables(collect([run])) if t[0].startswith("Published"))
    rows = [row[2] for row in published[2]]
    assert "not measured: eval.coco_1k was not set" in rows
    assert "measured here" not in rows and "difference" not in rows


# --------------------------------------------------------------------------- 4. an imported checkpoint


def test_an_imported_checkpoint_has_no_training_step(tmp_path):
    """An import wrote step 0: the row read "checkpoint step 0", as if saved before training."""
    counted = _run(tmp_path / "counted", _summary(checkpoint_step=0))
    meta = {"family": "seps", "opt": {}, "metadata": {"epoch": 12, "Eiters": 4242}}
    (counted / "import.json").write_text(json.dumps(meta))
    bare = _run(tmp_path / "bare", _summary(checkpoint_step=0))
    (bare / "import.json").write_text(json.dumps({"family": "seps", "opt": {}}))
    entries = collect([counted, bare])
    assert _column(_tables(entries)[0], "checkpoint step / steps") == {
        "counted": "4242 official iterations / ?",
        "bare": "? / ?",
    }
    rows = _csv_rows([counted, bare], tmp_path)
    assert rows["counted"]["checkpoint_step_mean"] == ""  # not a step of a training here
    # a checkpoint an older import wrote (step 0 beside import.json) records no step; a trained one does
    torch.save({"model": {}, "step": 0}, counted / "best.pt")
    assert "step" not in checkpoint_facts(counted / "best.pt")
    assert checkpoint_facts(_best(_run(tmp_path / "trained")))["step"] == 3


# --------------------------------------------------------------------------- 3. device memory


def test_the_device_memory_of_an_evaluation_leaves_out_what_the_process_held(monkeypatch):
    """A training process's evaluation counted its optimizer state and gradients in peak_device_mb."""
    from patchword.eval import protocol
    from patchword.eval.config import EvalConfig

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 900 << 20)
    monkeypatch.setattr(protocol, "describe_device", lambda device: {"device": "cuda", "device_name": "H100"})
    monkeypatch.setattr(protocol, "configured_budget_mb", lambda budget, device: 1024)
    timings = {"encode_seconds": 1.0, "scoring_seconds": 1.0, "pairs": 10}
    cost = protocol.evaluation_cost(
        timings, "cuda", EvalConfig(), 1, gallery_pairs=10, host_scope="evaluation", device_start_mb=700.0
    )
    assert (cost["peak_device_mb"], cost["device_start_mb"], cost["peak_device_growth_mb"]) == (900, 700, 200)
    unknown = protocol.evaluation_cost(
        timings, "cuda", EvalConfig(), 1, gallery_pairs=10, host_scope="process"
    )
    assert unknown["peak_device_mb"] == 900 and unknown["peak_device_growth_mb"] is None


def test_the_report_shows_the_evaluations_own_device_memory(tmp_path):
    gpu = {**XEON, "device": "cuda:0", "device_name": "H100"}
    trained = _summary(cost=_summary()["cost"] | gpu | {"peak_device_mb": 900.0, "device_start_mb": 700.0})
    trained["cost"]["peak_device_growth_mb"] = 200.0
    old = _summary(cost=_summary()["cost"] | gpu | {"peak_device_mb": 900.0})  # a record from before
    entries = collect([_run(tmp_path / "trained", trained), _run(tmp_path / "old", old)])
    table = cost_rows(entries, {})
    assert _column(table, "peak device MiB") == {"trained": "200", "old": "900 (process)"}
    assert "peak device and host memory: the scoring's own" in table[0]
    rows = _csv_rows([tmp_path / "trained"], tmp_path)
    assert rows["trained"]["cost.peak_device_growth_mb_mean"] == "200.0"
    assert rows["trained"]["cost.device_start_mb_mean"] == "700.0"


# --------------------------------------------------------------------------- 5, 7, 9. figures not shown


def test_the_csv_holds_every_figure_the_markdown_shows(tmp_path, monkeypatch):
    monkeypatch.setattr("patchword.experiments.cost.dead_row_bytes", lambda index_dir: 0)
    selection = {"selection_object_recall": {"caption": 60.0}, "selection_chance": {"caption": 50.0}}
    ranks = {"i2t_medr": 2.0, "t2i_medr": 3.0, "i2t_meanr": 4.5, "t2i_meanr": 5.5}
    run = _run(tmp_path / "run", _summary(**selection, **ranks))
    _best(run)
    _suite(run)
    index = tmp_path / "run.index"
    index.mkdir()
    manifest = {"model": {"run_dir": str(run)}, "entries": [{}, {}]}
    (index / "manifest.json").write_text(json.dumps(manifest))
    per_image = (index / "manifest.json").stat().st_size / 2
    row = _csv_rows([run], tmp_path, indexes=(index,))["run"]
    assert (row["selection_object_recall.caption_mean"], row["selection_chance.caption_mean"]) == (
        "60.0",
        "50.0",
    )
    assert (row["i2t_medr_mean"], row["t2i_meanr_mean"]) == ("2.0", "5.5")
    assert row["compositional.relation_swap_mean"] == "70.0" and row["compositional_scored"] == "1"
    assert float(row["index_bytes_per_image_mean"]) == per_image and row["index_bytes_per_image_std"] == ""


def test_a_mixed_rows_split_use_lists_each_run(tmp_path):
    sw = tmp_path / "sw"
    dev = _summary(split="dev")
    _sweep(sw, [0, 1], [0, 1], {0: _summary(), 1: dev})
    (sw / "seed-1" / "config.yaml").write_text(yaml.safe_dump({"seed": 1, "eval": {"split": "dev"}}))
    assert _csv_rows([sw], tmp_path)["sw"]["split_use"] == "held-out; model selection"


def test_a_sweep_row_whose_seed_lacks_its_suite_record_says_so(tmp_path):
    """Seed 1 had no eval_compositional.json: the row's suite cells were blank, unexplained."""
    sw = _sweep(tmp_path / "sw", [0, 1], [0, 1], {0: _summary(), 1: _summary()})
    for seed in (0, 1):
        _best(sw / f"seed-{seed}")
    _suite(sw / "seed-0")
    suite = next(t for t in _tables(collect([sw])) if t[0].startswith("Compositional"))
    label = "sw (1 of 2 seeds scored (missing: seed 1))"
    assert _column(suite, "relation_swap") == {label: "70.0"}  # over the seed scored
    assert "n of m seeds scored" in suite[0]


def test_a_two_stage_searchs_time_has_its_own_column(tmp_path):
    """TGDT's cost.search_seconds was recorded and shown nowhere."""
    search = {**XEON, "exhaustive": False, "search_seconds": 0.447}
    tgdt = _run(tmp_path / "tgdt", _summary(cost=search, shortlist_i2t=40, shortlist_t2i=8, hybrid_alpha=1.0))
    table = cost_rows(collect([tgdt]), {})
    assert _column(table, "two-stage search s") == {"tgdt": "0.447"}
    assert _column(table, "s / 1K x 5K") == {"tgdt": ""}  # never scaled as an exhaustive matrix
    assert "never scaled to 1K x 5K" in table[0]
    assert _csv_rows([tgdt], tmp_path)["tgdt"]["cost.search_seconds_mean"] == "0.447"


# --------------------------------------------------------------------------- 6. a GPU gallery file


def test_a_gpu_gallery_files_caption_names_the_gpu(tmp_path):
    machine = {"cpu": "AMD EPYC", "torch_threads": 1, "device_name": "NVIDIA H100 80GB HBM3"}
    row = {"images": 20, "captions": 100, "seconds": 0.5, "pairs_per_s": 4000.0, "peak_host_mb": 290.0}
    row |= {"peak_host_scope": "shape", "peak_device_mb": 512.0, "extrapolated": False}
    record = {"kind": "gallery", "config": "seps", "device": "cuda", "machine": machine, "rows": [row]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(record | {"max_memory_mb": 1024.0}))
    caption = gallery_rows(path)[0]
    assert "device cuda, NVIDIA H100 80GB HBM3 (host CPU AMD EPYC), 1 torch thread" in caption
    path.write_text(json.dumps(record | {"device": "cpu", "max_memory_mb": 1024.0}))
    assert "device cpu, CPU AMD EPYC, 1 torch thread" in gallery_rows(path)[0]
