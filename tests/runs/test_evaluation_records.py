"""What an evaluation record says beside its figures: the dataset split its role read (and what that split
is to the run), and an ensemble's members: distinct, on comparable score scales, shown on stdout."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from conftest import TINY_RUN_32, one_error_line
from patchword.cli import main
from patchword.config import apply_overrides
from patchword.data.config import DataConfig
from patchword.imports.published import SELECTION_SPLIT, scored_split, split_use
from patchword.runs.config import RunConfig
from patchword.train.process import torch_threads
from patchword.train.runner import train_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def selection_run(tmp_path_factory):
    """A two-step run whose test role reads the dev split (data.test_split=dev), and the warnings its
    config check logged."""
    root = tmp_path_factory.mktemp("selection")
    overrides = [*TINY_RUN_32, "train.max_steps=2", "data.test_split=dev", f"output_dir={root}", "name=run"]
    handler = _Collect()
    logger = logging.getLogger("patchword.train.validate")
    logger.addHandler(handler)
    try:
        with torch_threads(1):  # as one_thread gives the tests: a module fixture runs before it
            train_run(apply_overrides(RunConfig(), [*overrides, f"data.cache_dir={root / 'cache'}"]))
    finally:
        logger.removeHandler(handler)
    return root / "run", handler.messages


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_record_says_which_known_test_split_its_captions_are(selection_run):
    """Each evaluation record names the published test split its captions are, by their text
    (``known_captions``; None for the generated scenes), which the published-vs-measured caveat reads
    instead of ``data.root``'s folder name (tests/eval/test_known_splits.py)."""
    run, _ = selection_run
    for name in ("summary.json", "metrics.json"):
        record = json.loads((run / name).read_text())
        assert "known_captions" in record and record["known_captions"] is None


def test_a_test_role_reading_the_model_selection_split_says_so(selection_run, capsys):
    """Defect: with data.test_split=dev the test figures (summary.json, metrics.json, eval_test.json,
    stdout) said ``"split": "test"`` and nothing else: they were of the split the checkpoint was chosen
    on, and nothing said so."""
    run, warnings = selection_run
    assert len(warnings) == 1 and warnings[0].startswith("data.test_split=dev is the split the checkpoint")
    for name in ("summary.json", "metrics.json"):
        record = json.loads((run / name).read_text())
        assert (record["split"], record["data_split"], record["split_use"]) == (
            "test",
            "dev",
            SELECTION_SPLIT,
        )
    assert main(["eval", str(run), "progress=false"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((run / "eval_test.json").read_text())
    for record in (printed, written):
        assert (record["split"], record["data_split"], record["split_use"]) == (
            "test",
            "dev",
            SELECTION_SPLIT,
        )
    # read without the run's config, the report's and the card's helpers take the record at its word
    assert scored_split(written) == "dev" and split_use(written) == SELECTION_SPLIT
    # and before the config that named the split: a later config saying test_split=test does not relabel it
    assert (
        scored_split(written, DataConfig()) == "dev" and split_use(written, DataConfig()) == SELECTION_SPLIT
    )


def test_a_held_out_test_split_is_recorded_as_such(trained_tiny_run):
    record = json.loads((trained_tiny_run / "summary.json").read_text())
    assert (record["split"], record["data_split"], record["split_use"]) == ("test", "test", None)
    assert split_use(record) is None and scored_split(record) == "test"


def test_the_split_each_role_reads_and_when_to_warn():
    from patchword.runs.evaluate import data_split, held_out_warning

    held = DataConfig(dataset="laps", dev_from_train=10, test_split="dev")
    assert data_split(held, "dev") == "train hold-out" and data_split(held, "test") == "dev"
    assert held_out_warning(held) is None  # the checkpoint is chosen on training images held out
    assert held_out_warning(DataConfig()) is None
    trains = held_out_warning(DataConfig(test_split="train"))
    assert trains is not None and "the split the run trains on (data.train_split=train)" in trains
    selects = held_out_warning(DataConfig(dataset="laps", dev_split="val", test_split="val"))
    assert selects is not None and "the split the checkpoint is selected on (data.dev_split=val)" in selects


# ------------------------------------------------------------------------------------------- ensembles


def test_an_ensemble_of_a_run_with_itself_is_refused(trained_tiny_run, tmp_path, capsys):
    """Defect: ``patchword eval RUN --ensemble RUN`` wrote the one model's numbers as a 2-member ensemble;
    so did a copy of the run (the same checkpoint bytes)."""
    copy = tmp_path / "copy"
    shutil.copytree(trained_tiny_run, copy)
    for other in (trained_tiny_run, copy, copy / "best.pt"):
        out = tmp_path / "ensemble.json"
        assert main(["eval", str(trained_tiny_run), "--ensemble", str(other), "--out", str(out)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith("error: --ensemble: ") and "the same model weights as" in line
        assert not out.exists()


def test_an_ensemble_of_the_same_weights_saved_again_is_refused(trained_tiny_run, tmp_path, capsys):
    """Defect: members were compared by checkpoint bytes, so the same model weights in another file (a
    run's best.pt and last.pt saved at one step, a re-saved checkpoint) were averaged as two models."""
    from patchword.checkpoint import atomic_save, load_checkpoint

    copy = tmp_path / "copy"
    shutil.copytree(trained_tiny_run, copy)
    state = load_checkpoint(copy / "best.pt")
    state["resaved"] = True  # other bytes, the same weights
    atomic_save(state, copy / "best.pt")
    assert (copy / "best.pt").read_bytes() != (trained_tiny_run / "best.pt").read_bytes()
    out = tmp_path / "ensemble.json"
    assert main(["eval", str(trained_tiny_run), "--ensemble", str(copy), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: --ensemble: ") and "the same model weights as" in line
    assert not out.exists()
    # one weight changed by one ulp is another model
    state["model"] = {k: v.clone() for k, v in state["model"].items()}
    name = next(k for k, v in state["model"].items() if v.is_floating_point() and v.numel())
    flat = state["model"][name].view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=flat.dtype))
    atomic_save(state, copy / "best.pt")
    assert main(["eval", str(trained_tiny_run), "--ensemble", str(copy), "--out", str(out)]) == 0
    assert out.exists()


def test_an_ensemble_shows_its_members_on_stdout(trained_tiny_run, tmp_path, capsys):
    """Defect: stdout dropped the ``"ensemble"`` key: nothing printed said which runs were averaged."""
    other = tmp_path / "runs"
    assert main(["train", *TINY_RUN_32, "train.max_steps=2", "seed=1", f"output_dir={other}", "name=b"]) == 0
    capsys.readouterr()
    out = tmp_path / "ensemble.json"
    assert main(["eval", str(trained_tiny_run), "--ensemble", str(other / "b"), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(out.read_text())
    members = [(m["run_dir"], m["checkpoint"]) for m in printed["ensemble"]]
    assert members == [
        (str(trained_tiny_run), str(trained_tiny_run / "best.pt")),
        (str(other / "b"), str(other / "b" / "best.pt")),
    ]
    assert [m["score_spread"] for m in printed["ensemble"]] == [
        m["score_spread"] for m in written["ensemble"]
    ]
    assert all(m["score_spread"] > 0 for m in written["ensemble"])
    assert written["data_split"] == "test" and written["split_use"] is None


def test_members_on_score_scales_orders_of_magnitude_apart_are_warned_of(caplog):
    """Defect: a SEPS run (score std 0.08) and a TGDT run (17) averaged into the TGDT run's ranking with
    no word; the averaging stays (it is SCAN's and NAAF's), the warning names each member's spread."""
    from patchword.runs.ensemble import warn_of_scales

    g = torch.Generator().manual_seed(0)
    narrow, wide = torch.randn(20, 100, generator=g) * 0.08, torch.randn(20, 100, generator=g) * 17
    results = [
        ({"run_dir": "runs/seps", "matcher": "seps"}, {}),
        ({"run_dir": "runs/tgdt", "matcher": "tgdt"}, {}),
    ]
    caplog.set_level(logging.WARNING, logger="patchword.runs.evaluate")
    warn_of_scales(results, [narrow, wide])
    spreads = [meta["score_spread"] for meta, _ in results]
    assert spreads[0] == pytest.approx(0.08, rel=0.2) and spreads[1] == pytest.approx(17, rel=0.2)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert (
        f"runs/seps (seps): {spreads[0]:.3g}" in warning and f"runs/tgdt (tgdt): {spreads[1]:.3g}" in warning
    )
    caplog.clear()
    # a two-stage member's scores outside its shortlists (-inf) are no part of its spread
    shortlisted = wide.clone()
    shortlisted[:, 50:] = -torch.inf
    warn_of_scales(results, [wide * 2, (shortlisted, shortlisted)])
    assert caplog.records == [] and results[1][0]["score_spread"] == pytest.approx(
        float(wide[:, :50].std()), rel=1e-2
    )


def test_the_spread_of_a_two_stage_pair_is_that_of_all_its_finite_scores():
    """The (i2t, t2i) parts are pooled: the spread of parts with different means includes the spread of
    the means, not only the parts' own variances."""
    from patchword.eval.protocol import score_spread

    g = torch.Generator().manual_seed(1)
    i2t, t2i = torch.randn(6, 30, generator=g), torch.randn(6, 30, generator=g) * 0.5 + 3.0
    i2t[:, 20:] = -torch.inf  # outside the shortlists
    t2i[4:] = -torch.inf
    want = torch.cat([i2t[torch.isfinite(i2t)], t2i[torch.isfinite(t2i)]]).double().std(correction=0)
    assert score_spread((i2t, t2i)) == pytest.approx(float(want), rel=1e-6)
    assert score_spread(t2i[:4]) == pytest.approx(float(t2i[:4].double().std(correction=0)), rel=1e-6)


def test_evaluate_run_dir_without_overrides(trained_tiny_run, tmp_path):
    """Defect: ``evaluate_run_dir(run, out=...)`` (overrides None, its default) failed in read_run_config
    (``list(None)``): the two-process evaluation jobs of tests/train/test_distributed.py called it so."""
    from patchword.runs.evaluate import evaluate_run_dir

    metrics, out = evaluate_run_dir(trained_tiny_run, out=tmp_path / "eval.json")
    assert out == tmp_path / "eval.json" and json.loads(out.read_text())["rsum"] == metrics["rsum"]
    assert metrics["overrides"] == []


def test_ensemble_members_given_as_exports_are_compared_by_their_weights(trained_tiny_run, tmp_path, capsys):
    """Defect: the repeated-member check read every member as a .pt checkpoint: an export directory (its
    model.safetensors) was refused as 'not a patchword checkpoint'. Two exports of one run are one model."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["export", str(trained_tiny_run), str(one)]) == 0
    assert main(["export", str(trained_tiny_run), str(two)]) == 0
    capsys.readouterr()
    out = tmp_path / "ensemble.json"
    assert main(["eval", str(one), "--ensemble", str(two), "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "the same model weights as" in line and "not a patchword checkpoint" not in line
    assert not out.exists()


def test_a_karpathy_val_test_split_is_the_dev_split_it_aliases():
    """A Karpathy json calls the dev split ``val``: ``data.test_split=val`` beside ``data.dev_split=dev``
    reads the split the checkpoint is chosen on (it was reported as held out)."""
    data = DataConfig(dataset="karpathy", root="d.json", test_split="val", dev_split="dev")
    assert split_use({"split": "test", "data_split": "val"}, data) == SELECTION_SPLIT
    laps = DataConfig(dataset="laps", root="d", test_split="val", dev_split="dev")
    assert split_use({"split": "test", "data_split": "val"}, laps) is None  # LAPS files name their splits


def test_eval_warns_of_a_test_split_that_is_not_held_out(selection_run, caplog, tmp_path):
    """The README says the config check warns of ``data.test_split=dev``: training did, ``patchword eval``
    recorded it (``split_use``) but said nothing."""
    run, _ = selection_run
    with caplog.at_level(logging.WARNING, logger="patchword.runs.evaluate"):
        assert main(["eval", str(run), "progress=false", "--out", str(tmp_path / "e.json")]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "patchword.runs.evaluate"]
    assert len(said) == 1 and said[0].startswith("data.test_split=dev is the split the checkpoint"), said
